"""``opguard replay RUN --op INDEX [--times N] [--against RUN_B] [--json]``: re-executes a
captured op on its captured inputs. Exit status: 0 deterministic and reproducing run A, 1
otherwise, 2 error. Imports torch (it runs the op)."""

from __future__ import annotations

import argparse
from typing import Any

from ...store import Run
from ...tools.zoom import REPLAY_SCHEMA, captured, hex_results, op_in_b, replay_json
from .base import CommandError, print_json
from .oppair import add_op_arguments


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="re-execute a captured op on its captured inputs",
        description="Runs a captured op (record --capture) N times on its captured inputs, on "
        "every GPU (else the CPU) and once in float64 on the CPU, and says whether it is "
        "deterministic and reproduces run A (and run B). Exit status: 0 deterministic and "
        "reproducing run A, 1 otherwise, 2 error.",
    )
    p.add_argument("run_a", metavar="RUN")
    add_op_arguments(p, against=True)
    p.add_argument("--times", type=int, default=5, metavar="N", help="replays per device (5)")
    p.add_argument("--against", metavar="RUN_B", help="also compare with this run's op")
    p.add_argument("--device", help="replay only on this device (default: every GPU, else cpu)")
    p.add_argument("--json", action="store_true", help=f"print one {REPLAY_SCHEMA} object")
    p.set_defaults(run=run)


def _devices(requested: str | None) -> list[str]:
    import torch

    if requested is not None:
        try:
            torch.empty(0, device=requested)
        except (RuntimeError, AssertionError) as exc:
            raise CommandError(f"--device {requested}: {str(exc).splitlines()[0]}") from None
        return [requested]
    if torch.cuda.is_available():
        return [f"cuda:{k}" for k in range(torch.cuda.device_count())]
    return ["cpu"]


def run(args: argparse.Namespace) -> int:
    if args.times < 1:
        raise CommandError("--times must be at least 1")
    from ...recorder.replay import ReplayError, replay

    devices = _devices(args.device)
    with Run(args.run_a) as run_a:
        trace = run_a.rank(args.rank)
        captured(trace, args.op)
        try:
            if args.against is None:
                if args.op_b is not None:
                    raise CommandError("--op-b needs --against RUN_B")
                report = replay(trace, args.op, times=args.times, devices=devices)
            else:
                with Run(args.against) as run_b:
                    trace_b = run_b.rank(args.rank)
                    op_b = op_in_b(trace, trace_b, args.op, args.op_b)
                    report = replay(
                        trace,
                        args.op,
                        times=args.times,
                        devices=devices,
                        trace_b=trace_b,
                        op_b=op_b,
                    )
        except ReplayError as exc:
            raise CommandError(str(exc)) from None
    if args.json:
        print_json(replay_json(report, args.run_a, args.rank, args.against))
    else:
        _print(report, args)
    return 0 if report.deterministic and report.matches_a else 1


def _print(report: Any, args: argparse.Namespace) -> None:
    op = report.op
    print(f"replay of {args.run_a} #{op.index} {op.op} at {op.call_site.short()}")
    print(f"  recorded A: {' '.join(h or 'view' for h in hex_results(report.recorded_a))}")
    if report.recorded_b is not None:
        print(
            f"  recorded B: {' '.join(h or 'view' for h in hex_results(report.recorded_b))}  "
            f"({args.against} #{report.op_b.index})"
        )
    for d in report.devices:
        distinct = _distinct_text(d.results)
        print(f"  {d.device}: {report.times} replays, {distinct}")
    if report.reference_error:
        print(f"  float64 reference (cpu): unavailable: {report.reference_error}")
    for r in report.reference:
        parts = [
            f"{name} {e.max_abs:.3g} abs, {e.rel:.3g} rel"
            for name, e in (("replay", r.replay), ("A", r.a), ("B", r.b))
            if e is not None
        ]
        print(f"  float64 reference, output {r.slot}: error of {'; '.join(parts)}")
    for finding in report.findings():
        print(f"  → {finding}")


def _distinct_text(results: list[tuple[int | None, ...]]) -> str:
    distinct = list(dict.fromkeys(results))
    shown = ", ".join(" ".join(h or "view" for h in hex_results(r)) for r in distinct[:3])
    more = f" (+{len(distinct) - 3} more)" if len(distinct) > 3 else ""
    return f"{len(distinct)} distinct result(s): {shown}{more}"
