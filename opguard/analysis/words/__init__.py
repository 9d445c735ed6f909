"""What is said: a verdict's vocabulary (:mod:`.verdict`) and ops, tensors, numbers and
kernels as text (:mod:`.text`), the one set every front end uses."""
