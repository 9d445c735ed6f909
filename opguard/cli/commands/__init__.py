"""One module per subcommand; each has ``register(subparsers)`` and sets ``args.run``."""

from __future__ import annotations

from . import record, show
from .base import CommandError

ALL = (record, show)

__all__ = ["ALL", "CommandError"]
