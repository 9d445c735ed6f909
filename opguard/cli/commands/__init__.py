"""One module per subcommand; each has ``register(subparsers)`` and sets ``args.run``."""

from __future__ import annotations

from . import demo, diff, explain, nan, record, show, tensor, tui
from .base import CommandError

ALL = (record, show, diff, explain, demo, tui, tensor, nan)

__all__ = ["ALL", "CommandError"]
