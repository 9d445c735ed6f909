"""``opguard serve``'s web side: textual-serve's server, which starts ``opguard tui`` as a child
process for each browser connection and relays its screen and keys over a websocket, with the
checks textual-serve does not make.

textual-serve has no authentication: whoever reaches its port drives the debugger and reads both
runs. So every request passes :func:`guard` first. It refuses (403) a request sent by another
site's page (its ``Origin`` is not the server's own: a page on the web must not open the
debugger's websocket in the user's browser). Bound to a loopback address, where only this
machine connects, it answers only requests addressed to a loopback name (a DNS-rebinding page
addresses its own). Bound to any other address it wants the server's random token, in the URL's
``token`` query (the page) or in the cookie the page's answer sets (its scripts, styles and
websocket, whose URLs textual-serve writes without the query).

Imported only when ``opguard serve`` runs: textual-serve is an optional extra.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import signal
from collections.abc import Callable
from contextvars import ContextVar
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from textual_serve.server import Server

# What open pages are given to end their apps when the server stops (Ctrl+C); then their
# connections are cancelled, which ends the apps too (textual-serve's websocket handler).
SHUTDOWN_SECONDS = 2.0
TOKEN_QUERY = "token"

# The origin (scheme://host:port) the browser used for the request being answered: the page's
# links and websocket point back there. Behind a wildcard address (0.0.0.0) the server knows
# no better name for itself, and a loopback page must not switch names (localhost, 127.0.0.1).
_ORIGIN: ContextVar[str] = ContextVar("origin", default="")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _refused(why: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=f"opguard serve: {why}\n")


def guard(token: str | None) -> Middleware:
    """The middleware that checks every request (the module says what and why); ``token``
    None: the server is bound to a loopback address."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise _refused("a page of another site may not drive the debugger")
        cookie = f"opguard-serve-{request.url.port}"  # cookies are shared by a host's ports
        if token is None:
            if not is_loopback(request.url.host or ""):
                raise _refused("this server answers requests to localhost or 127.0.0.1 only")
        elif not any(
            hmac.compare_digest(given, token)
            for given in (request.query.get(TOKEN_QUERY), request.cookies.get(cookie))
            if given is not None
        ):
            raise _refused("this URL needs the token that opguard serve printed when it started")
        _ORIGIN.set(f"{request.scheme}://{request.host}")
        response = await handler(request)
        if token is not None and not response.prepared:  # a page, not the websocket
            response.set_cookie(cookie, token, httponly=True, samesite="Strict")
        return response

    return check


class DebuggerServer(Server):
    """textual-serve's server with :func:`guard` in front of its routes, its links pointing back
    where the browser came from, and quiet: ``opguard serve`` says the URL once it listens."""

    def __init__(self, command: str, title: str, token: str | None) -> None:
        super().__init__(command, title=title)
        self._guard = guard(token)

    @property
    def public_url(self) -> str:
        """Where the page's scripts and websocket are (textual-serve writes absolute URLs)."""
        return _ORIGIN.get()

    @public_url.setter
    def public_url(self, value: str) -> None:
        """Ignored: textual-serve derives one from the host and port it was given, which a
        wildcard address or a second name for this machine makes wrong."""

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    async def on_startup(self, app: web.Application) -> None:
        """textual-serve prints its logo and a URL here, before it listens."""


def serve(server: DebuggerServer, host: str, port: int, listening: Callable[[int], None]) -> None:
    """Serves until SIGINT or SIGTERM, calling ``listening`` with the port once bound (``port``
    0: any free one); :class:`OSError` when ``host:port`` cannot be bound."""

    async def run() -> None:
        runner = web.AppRunner(
            await server._make_app(), access_log=None, shutdown_timeout=SHUTDOWN_SECONDS
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            stop = asyncio.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(signum, stop.set)
            listening(runner.addresses[0][1])
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(run())
