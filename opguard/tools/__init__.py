"""The answers layer: one registry of small, documented queries over recorded runs with compact,
paged, size-bounded JSON answers (every answer's code is in this package), printed by the CLI
(``--json``), listed by ``opguard tools`` and served over MCP by ``opguard mcp``; the in-app
agent declares its follow-up tools with the same registry. Importing this package imports
neither torch nor the MCP SDK."""

from ..tool_registry import MAX_CHARS, Pages, Param, Tool, ToolError, dumps
from .catalog import BY_NAME, GUIDE, TOOLS

__all__ = ["BY_NAME", "GUIDE", "MAX_CHARS", "TOOLS", "Pages", "Param", "Tool", "ToolError", "dumps"]
