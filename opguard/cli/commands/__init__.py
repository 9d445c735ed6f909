"""One module per subcommand; each has ``register(subparsers)`` and sets ``args.run``."""

from __future__ import annotations

from . import demo, diff, explain, mcp, queries, record, show, tools, tui
from .base import CommandError

ALL = (record, show, diff, explain, demo, tui, tools, queries, mcp)

__all__ = ["ALL", "CommandError"]
