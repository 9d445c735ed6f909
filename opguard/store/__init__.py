"""Persistent traces: LMDB per rank plus ``meta.json``. Never imports torch or any front end."""

from .errors import TraceError
from .reader import RankTrace, Run
from .records import CallSite, KernelEntry, OpRecord, TensorRecord
from .writer import TraceWriter

__all__ = [
    "CallSite",
    "KernelEntry",
    "OpRecord",
    "RankTrace",
    "Run",
    "TensorRecord",
    "TraceError",
    "TraceWriter",
]
