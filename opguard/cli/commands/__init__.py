"""One module per subcommand; each has ``register(subparsers)`` and sets ``args.run``."""

from __future__ import annotations

from . import (
    capture,
    demo,
    diff,
    explain,
    hunt,
    mcp,
    nan,
    queries,
    record,
    replay,
    serve,
    show,
    tensor,
    tools,
    tui,
)
from .base import CommandError

ALL = (
    record,
    show,
    diff,
    hunt,
    explain,
    demo,
    tui,
    serve,
    capture,
    tensor,
    replay,
    nan,
    tools,
    queries,
    mcp,
)

__all__ = ["ALL", "CommandError"]
