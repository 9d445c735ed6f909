"""The first divergence: what it is (:mod:`.model`), how the walk's first differing pair is
classified and followed back to its cause (:mod:`.explainer`), and the evidence for it
(:mod:`.findings`: stream races, :mod:`.causes`, :mod:`.summary`); whether a difference reaches
anything (:mod:`.reach`), the first NaN/Inf (:mod:`.nonfinite`), a rank's role
(:mod:`.roles`), GPU work (:mod:`.gpu_work`) and compiled recordings (:mod:`.compilation`).
"""

from .explainer import Alignment, Explainer
from .model import (
    ArgumentDiff,
    Divergence,
    LikelyCause,
    Link,
    TensorDiff,
    WriteWindow,
    content_of,
    differing_arguments,
    differing_tensors,
)

__all__ = [
    "Alignment",
    "ArgumentDiff",
    "Divergence",
    "Explainer",
    "LikelyCause",
    "Link",
    "TensorDiff",
    "WriteWindow",
    "content_of",
    "differing_arguments",
    "differing_tensors",
]
