"""``opguard serve RUN_A RUN_B``: the terminal debugger in a web browser, through textual-serve.

textual-serve runs a command line for each page that connects and relays its screen and keys,
so every page gets its own ``opguard tui`` process (every key works as in a terminal) and
closing the page ends it. The runs are opened here first, so a run that cannot be read is one
line and exit status 2 before anything listens. textual-serve is an optional extra, imported
only when this command runs (:mod:`opguard.cli.serving`).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import socket
import sys

from ...children import CHILD
from .base import CommandError, tolerance_of
from .tui import add_arguments, arguments

WILDCARDS = ("0.0.0.0", "::", "")  # every address of this machine: the URL names the machine


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="the terminal debugger (opguard tui) in a web browser",
        description="Serves opguard tui RUN_A RUN_B to web browsers and prints the URL: each "
        "page runs its own debugger, with the same keys, and closing the page ends it. On a "
        "loopback address (the default) the URL is plain; on any other it carries a random "
        "token that every request must present. Needs textual-serve: "
        "pip install textual-serve, or bash tools/install.sh serve.",
    )
    add_arguments(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; any other "
        "address needs the printed URL's token)",
    )
    p.add_argument(
        "--port",
        type=port_number,
        default=8000,
        help="the port to listen on (default 8000; 0: any free port)",
    )
    p.set_defaults(run=run)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {text!r}")
    return port


def url(host: str, port: int, token: str | None) -> str:
    """Where a browser finds the debugger (with its token, when it needs one)."""
    name = socket.gethostname() if host in WILDCARDS else host
    if ":" in name:  # an IPv6 address
        name = f"[{name}]"
    query = "" if token is None else f"?token={token}"
    return f"http://{name}:{port}/{query}"


def run(args: argparse.Namespace) -> int:
    from ...tui.session import Session

    Session.open(args.run_a, args.run_b, tolerance_of(args)).close()
    try:
        from ..serving import DebuggerServer, is_loopback, serve
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing == "opguard":
            raise
        raise CommandError(
            f"opguard serve needs textual-serve ({missing} is not installed): "
            "pip install textual-serve (or bash tools/install.sh serve)"
        ) from None
    token = None if is_loopback(args.host) else secrets.token_urlsafe()
    tui = arguments(args)
    # Each page's debugger: this interpreter and this OpGuard, as opguard's children start.
    server = DebuggerServer(
        shlex.join([sys.executable, "-c", CHILD, *tui]), f"opguard {shlex.join(tui)}", token
    )

    def listening(port: int) -> None:
        said = f"opguard serve: open {url(args.host, port, token)}  (Ctrl+C stops it)"
        if token is not None:
            said += (
                f"\n  {args.host} can be reached from other machines and textual-serve has no "
                "login of its own: every request must carry this URL's token, and whoever has "
                "the URL can read both runs"
            )
        print(said, flush=True)

    try:
        serve(server, args.host, args.port, listening)
    except OSError as exc:
        # asyncio's message repeats the address; a name's own says it does not resolve.
        if isinstance(exc, socket.gaierror) or not exc.errno:
            reason = exc.strerror or str(exc)
        else:
            reason = os.strerror(exc.errno)
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {reason}") from None
    return 0
