"""One module per subcommand; each has ``register(subparsers)`` and sets ``args.run``."""

from __future__ import annotations

from . import capture, demo, diff, explain, nan, record, replay, show, tensor, tui
from .base import CommandError

ALL = (record, show, diff, explain, demo, tui, capture, tensor, replay, nan)

__all__ = ["ALL", "CommandError"]
