"""``opguard tensor RUN_A RUN_B --op INDEX [--input K | --output K] [--json]``: how the captured
tensors of one op differ between two runs, element by element. Never imports torch; numpy only
when it runs (every command's module is imported to build the parser)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...tools.zoom import TENSOR_SCHEMA, compare_tensors, tensor_json
from .base import print_json
from .oppair import add_op_arguments

if TYPE_CHECKING:
    from ...analysis.elementwise import ElementwiseDiff


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tensor",
        help="compare the captured tensors of one op element by element",
        description="Compares the full tensors an op captured in two runs (record --capture): "
        "how many elements differ, by how much (absolute, relative, ULPs), where, and what the "
        "pattern suggests. Exit status: 0 equal, 1 different, 2 error.",
    )
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    add_op_arguments(p, against=True)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--input", metavar="K", help="this input (position or slot name)")
    which.add_argument("--output", metavar="K", help="this output (default: every output)")
    p.add_argument("--json", action="store_true", help=f"print one {TENSOR_SCHEMA} object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    op_a, op_b, diffs = compare_tensors(
        args.run_a, args.run_b, args.rank, args.op, args.op_b, args.input, args.output
    )
    if args.json:
        print_json(tensor_json(args.run_a, args.run_b, args.rank, op_a, op_b, diffs))
    else:
        print(f"A: {args.run_a} #{op_a.index} {op_a.op} at {op_a.call_site.short()}")
        print(f"B: {args.run_b} #{op_b.index} {op_b.op} at {op_b.call_site.short()}")
        for d in diffs:
            print_elementwise(d)
    return 1 if any(d.differing or not d.elements for d in diffs) else 0


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.8g}"


def print_elementwise(d: ElementwiseDiff) -> None:
    print(f"\n{d.label}  {d.dtype}{list(d.shape)}")
    if d.differing == 0 or not d.elements:
        print(f"  {d.verdict}")
        return
    print(f"  differs: {d.differing} of {d.elements} elements ({d.fraction:.2%})")
    if d.max_abs is not None:
        ulp = f"  ULP max {d.ulp_max}, median {d.ulp_median:g}" if d.ulp_max is not None else ""
        print(f"  max abs error {d.max_abs:.3g}  max rel error {d.max_rel:.3g}{ulp}")
    if d.nonfinite_mismatch:
        print(f"  NaN/Inf in one run only: {d.nonfinite_mismatch} elements")
    print("  where (differing elements along each dimension):")
    for s in d.spread:
        bins = f", {s.bin_width} per cell" if s.bin_width > 1 else ""
        print(
            f"    dim {s.dim} (size {s.size}{bins}): {s.strip()}  "
            f"{s.touched} of {s.size} indices touched, {s.whole} entirely different"
        )
    print("  first differing elements:")
    for p in d.first:
        ulp = f"  {p.ulp} ULP" if p.ulp is not None else ""
        print(f"    {list(p.index)}  A {_num(p.a)} ({p.a_bits})  B {_num(p.b)} ({p.b_bits}){ulp}")
    print(f"  → {d.verdict}")
