"""Comparing traces: alignment, first divergence, and their cause. Never imports torch or a
front end.

The parts, each answering one question (docs/ARCHITECTURE.md draws them): :mod:`.align` (which
ops of two runs correspond), :mod:`.divergence` (what the first difference is, and why),
:mod:`.tolerant` (whether rounding explains a difference), :mod:`.state_diff` (which step's
training state first differs), :mod:`.words` (how it is said); :mod:`.diff` is the walk that
uses them, :mod:`.result` what it finds and :mod:`.contract` its JSON; :mod:`.browse` and
:mod:`.elementwise` are what the front ends read around an op.
"""

from .diff import diff_rank, diff_runs
from .divergence.model import ArgumentDiff, Divergence, Link, TensorDiff
from .result import RankDiff, RunDiff, StepSummary

__all__ = [
    "ArgumentDiff",
    "Divergence",
    "Link",
    "RankDiff",
    "RunDiff",
    "StepSummary",
    "TensorDiff",
    "diff_rank",
    "diff_runs",
]
