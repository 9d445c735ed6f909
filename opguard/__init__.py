"""OpGuard: find the first operation where two PyTorch training runs stop computing the same.

``import opguard`` is cheap and does not import torch: the recording API (``opguard.record``,
``opguard.step``) loads the recorder, and therefore torch, on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "record", "step"]


def __getattr__(name: str) -> Any:
    if name in ("record", "step"):
        from . import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'opguard' has no attribute {name!r}")
