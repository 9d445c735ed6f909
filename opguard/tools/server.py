"""``opguard mcp``: the tools served over MCP's stdio transport with the official ``mcp`` SDK.

The SDK (and the web stack it brings) is imported only here, when the server starts: recording,
the CLI and listing the tools never load it. Calls run one at a time in a worker thread (the
trace readers share LMDB handles, and the event loop must keep answering pings); a call the
tool refuses, or one that fails unexpectedly, becomes an error result the agent can read, never
a crash of the server.
"""

from __future__ import annotations

from typing import Any

from ..tool_registry import ToolError, dumps
from .catalog import BY_NAME, GUIDE, TOOLS

INSTALL_HINT = "the MCP server needs the mcp package: pip install mcp (or tools/install.sh mcp)"


def serve() -> None:
    """Serves until the client closes stdin. Raises ImportError (with how to install) when the
    SDK is missing."""
    try:
        import anyio
        import mcp  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    anyio.run(_serve)


async def _serve() -> None:
    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from .. import __version__

    one_at_a_time = anyio.Lock()

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name,
                    description=f"{t.purpose} CLI: {t.usage()}",
                    input_schema=t.input_schema(),
                )
                for t in TOOLS
            ]
        )

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None:
            return _error(types, f"no tool {params.name!r}; tools: {', '.join(BY_NAME)}")
        try:
            async with one_at_a_time:
                answer = await anyio.to_thread.run_sync(tool.call, dict(params.arguments or {}))
        except ToolError as exc:
            return _error(types, str(exc))
        except Exception as exc:  # a bug must not take the agent's server down
            return _error(types, f"internal error in {tool.name}: {type(exc).__name__}: {exc}")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=dumps(answer))],
            structured_content=answer,
        )

    server: Server[Any] = Server(
        "opguard",
        version=__version__,
        instructions=GUIDE,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _error(types: Any, message: str) -> Any:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"error: {message}")], is_error=True
    )
