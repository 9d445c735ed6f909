"""What a front end reads of two aligned runs around an op: the aligned rows of a step
(:mod:`.rows`, the TUI's list and the trace tools) and an op's neighbours, inputs and source
(:mod:`.lookup`)."""
