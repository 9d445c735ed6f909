"""``--op``, ``--rank`` and ``--op-b``: how ``tensor`` and ``replay`` name one op in two runs
(finding it and its captures: :mod:`opguard.tools.zoom`)."""

from __future__ import annotations

import argparse


def add_op_arguments(p: argparse.ArgumentParser, *, against: bool) -> None:
    """``--op``, ``--rank`` and, for a second run, ``--op-b``."""
    p.add_argument("--op", type=int, required=True, metavar="INDEX", help="op index in run A")
    if against:
        p.add_argument(
            "--op-b",
            type=int,
            metavar="INDEX",
            help="op index in run B (default: the op the diff aligns with A's)",
        )
    p.add_argument("--rank", type=int, default=0, help="rank (default 0)")
