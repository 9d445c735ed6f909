"""Comparing traces: alignment, first divergence, and their cause. Never imports torch or a
front end."""

from .diff import RankDiff, RunDiff, StepSummary, diff_rank, diff_runs
from .divergence import ArgumentDiff, Divergence, Link, TensorDiff

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
