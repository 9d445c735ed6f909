"""Tools for coding agents: one registry of small, documented queries over recorded runs with
compact, paged, size-bounded JSON answers, served as CLI subcommands (``--json``), listed by
``opguard tools`` and served over MCP by ``opguard mcp``. Importing this package imports
neither torch nor the MCP SDK."""

from .catalog import BY_NAME, GUIDE, TOOLS
from .registry import MAX_CHARS, Pages, Param, Tool, ToolError, dumps

__all__ = ["BY_NAME", "GUIDE", "MAX_CHARS", "TOOLS", "Pages", "Param", "Tool", "ToolError", "dumps"]
