"""One module per subcommand; each has ``register(subparsers)`` and sets ``args.run``."""

from __future__ import annotations

from . import demo, diff, record, show
from .base import CommandError

ALL = (record, show, diff, demo)

__all__ = ["ALL", "CommandError"]
