"""Evidence for the constants of ``opguard diff --tolerant`` (issue 30) from recorded pairs (beside
bench/tolerant_calibration.py's float32-against-float64 MLP): in pairs of runs that
differ by rounding alone, and in pairs with a real change behind the rounding, each aligned op
whose outputs differ, with its output's and its inputs' relative L2 distances ``d = ||a-b||/||a||``
(``a``: run A's value) and the unit roundoff ``u`` of its outputs' dtypes. The rule under
calibration calls an op's difference rounding when ``d_out <= A * d_in + R * u``; the report gives,
per pair, the distributions of ``d_out / u`` where the inputs were equal and of ``d_out / d_in``
where they were not, the smallest ``R`` that explains every op of the pair for a few ``A``, and,
for pairs with a real change, the first op that the rounding pairs' ``(A, R)`` leave unexplained.

Distances are the true ones: every op of every run is recorded with ``--capture`` and compared
element by element (the sketch's estimates replace them once the recorder writes sketches).
Runs in different layouts (TP=2 against TP=1) are paired by :mod:`opguard.analysis.layouts`; a
shard's logical value is the TP ranks' shards concatenated in rank order (DTensor's even
``Shard`` placement, which this script's author knows and the trace does not record), a partial
value's (the bias DTensor halves before the row-wise matmul) their sum.

    python bench/tolerant_pairs.py [--root DIR] [--pairs fp32:bf16,tp1:tp2] [--json FILE]
                                   [--rule A,R]

``--rule A,R`` lists, per pair, the ops a proposed rule leaves unexplained (rounding pairs: none
should be; real changes: the changed op first).

The runs are the CPU scenarios of ``tests/tolerant_runs.py``, recorded into ``--root`` (kept and
reused when present; a temporary directory otherwise) with every op captured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opguard.analysis.align.keys import KeyTable, OpKeys
from opguard.analysis.align.layouts import (
    OnlyKind,
    PairKind,
    Relation,
    layout_degree,
    layout_step,
    relate,
)
from opguard.analysis.align.passes import align_step, pairs_of, records_of
from opguard.analysis.align.steps import StepIndex
from opguard.analysis.elementwise import Elements
from opguard.store import RankTrace, Run
from opguard.store.captures import INPUT, OUTPUT
from opguard.store.light import LightReader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the scenario runs
from tolerant_runs import RUNS, record_runs

ROUNDING, REAL = "rounding", "real change"
PAIRS: dict[str, tuple[str, str, str]] = {
    "fp32:bf16": ("fp32", "bf16", ROUNDING),
    "tp1:tp2": ("tp1", "tp2", ROUNDING),
    "gpt:gpt_fused": ("gpt", "gpt_fused", ROUNDING),
    "gpt:gpt_flash": ("gpt", "gpt_flash", ROUNDING),
    "bf16:bf16_eps": ("bf16", "bf16_eps", REAL),
    "fp32:bf16_eps": ("fp32", "bf16_eps", REAL),
    "tp1:tp2_bug": ("tp1", "tp2_bug", REAL),
    "gpt_flash:gpt_scale": ("gpt_flash", "gpt_scale", REAL),
    "mlp:mlp_momentum": ("mlp", "mlp_momentum", REAL),
}
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
AMPLIFICATIONS = (1.0, 2.0, 4.0, 8.0, 16.0)
QUANTILES = (0.5, 0.9, 0.99, 1.0)
RULE_SHOWN = 5
CAPTURE_ALL = ("--capture", "0-99999999", "--capture-limit", "4GiB")


@dataclass(frozen=True)
class OpDistance:
    step: int
    a: int  # op index in run A
    b: int  # in run B (rank 0)
    op: str
    phase: str
    site: str
    d_out: float
    d_in: float
    u: float


class Values:
    """The captured tensors of one run's ranks, as float64 arrays with their dtypes."""

    def __init__(self, traces: list[RankTrace]) -> None:
        self.traces = traces
        self._cache: dict[tuple[int, int], dict[tuple[str, int], tuple[str, np.ndarray]]] = {}

    def get(self, index: int, direction: str, position: int, rank: int = 0) -> Any:
        """(dtype, values) of a captured float tensor, or None."""
        key = (rank, index)
        if key not in self._cache:
            tensors = {}
            for captured in self.traces[rank].captures(index):
                elements = Elements.of(captured)
                if elements.is_float and elements.values is not None:
                    tensors[(captured.direction, captured.position)] = (
                        captured.dtype,
                        elements.values.reshape(captured.shape),
                    )
            self._cache[key] = tensors
        return self._cache[key].get((direction, position))

    def logical(self, index: int, direction: str, position: int, shape: tuple, how: str) -> Any:
        """A tensor's logical value across the ranks: ``own`` (rank 0's), ``sum`` (a partial
        value), or ``cat:D`` (shards along dimension D, in rank order)."""
        parts = [self.get(index, direction, position, r) for r in range(len(self.traces))]
        if how == "own" or any(p is None for p in parts):
            return parts[0]
        dtype = parts[0][0]
        if how == "sum":
            return dtype, sum(p[1] for p in parts)
        whole = np.concatenate([p[1] for p in parts], axis=int(how.split(":")[1]))
        return (dtype, whole) if whole.shape == shape else None


def distance(a: Any, b: Any) -> float | None:
    """``||a - b|| / ||a||`` of two (dtype, values); None where it says nothing."""
    if a is None or b is None or a[1].shape != b[1].shape:
        return None
    if not (np.all(np.isfinite(a[1])) and np.all(np.isfinite(b[1]))):
        return None
    norm = float(np.linalg.norm(a[1]))
    gap = float(np.linalg.norm(a[1] - b[1]))
    if norm == 0.0:
        return 0.0 if gap == 0.0 else None
    return gap / norm


def _roundoff(*values: Any) -> float:
    return max((UNIT_ROUNDOFF.get(v[0], 0.0) for v in values if v is not None), default=0.0)


def _site(trace: RankTrace, index: int) -> tuple[str, str, str]:
    op = trace.op(index)
    site = op.call_site
    where = f"{site.file.rsplit('/', 1)[-1]}:{site.line}" if site is not None else "?"
    return op.op, op.phase, where


def _steps(trace: RankTrace) -> list[int]:
    return [r.step for r in StepIndex(trace).ranges]


def same_layout(run_a: Run, run_b: Run) -> Iterator[OpDistance]:
    """Each rank against the same rank, aligned as the diff aligns them."""
    for rank in run_a.ranks:
        ta, tb = run_a.rank(rank), run_b.rank(rank)
        va, vb = Values([ta]), Values([tb])
        steps_b = set(_steps(tb))
        for step in (s for s in _steps(ta) if s in steps_b):
            table = KeyTable()
            ranges = StepIndex(ta).get(step), StepIndex(tb).get(step)
            assert ranges[0] is not None and ranges[1] is not None
            columns = (
                LightReader(ta, OpKeys(ta, table)).read(ranges[0].start, ranges[0].stop),
                LightReader(tb, OpKeys(tb, table)).read(ranges[1].start, ranges[1].stop),
            )
            for i, j in pairs_of(align_step(*columns, records_of(ta, tb))):
                a, b = columns[0].index[i], columns[1].index[j]
                found = _positional(step, ta, a, b, va, vb)
                if found is not None:
                    yield found


def _positional(
    step: int, ta: RankTrace, a: int, b: int, va: Values, vb: Values
) -> OpDistance | None:
    op_a = ta.op(a)
    outs = [
        (va.get(a, OUTPUT, k), vb.get(b, OUTPUT, k))
        for k, entry in enumerate(op_a.outputs)
        if not entry.is_view
    ]
    d_outs = [d for d in (distance(x, y) for x, y in outs) if d is not None]
    if not d_outs or max(d_outs) == 0.0:
        return None
    d_ins = [distance(va.get(a, INPUT, k), vb.get(b, INPUT, k)) for k in range(len(op_a.inputs))]
    u = _roundoff(*(v for pair in outs for v in pair))
    return OpDistance(
        step, a, b, *_site(ta, a), max(d_outs), max((d for d in d_ins if d), default=0.0), u
    )


def across_layouts(run_a: Run, run_b: Run, degree: int) -> Iterator[OpDistance]:
    """Run A's one rank against run B's TP ranks, paired by :mod:`opguard.analysis.layouts`."""
    ta = run_a.rank(run_a.ranks[0])
    tbs = [run_b.rank(rank) for rank in run_b.ranks]
    va, vb = Values([ta]), Values(tbs)
    for step in _steps(ta):
        layout = layout_step(ta, tbs[0], step, degree)
        partial_inputs = {o.index for o in layout.only if o.kind is OnlyKind.LAYOUT_INPUT}
        for pair in layout.pairs:
            if pair.kind is PairKind.UNRELATED:
                continue
            op_a, op_b = ta.op(pair.a), tbs[0].op(pair.b)
            outs = []
            for k, (out_a, out_b) in enumerate(zip(op_a.outputs, op_b.outputs, strict=True)):
                if out_a.is_view:
                    continue
                logical = next((t for t in pair.compared if t.a == (pair.a, k)), None)
                if logical is not None:
                    where_b = (logical.b[0], OUTPUT, logical.b[1])
                    outs.append((va.get(pair.a, OUTPUT, k), vb.get(*where_b)))
                    continue
                how = _how(out_a.shape, out_b.shape, degree, partial=False)
                if how is not None:
                    b_value = vb.logical(pair.b, OUTPUT, k, out_a.shape, how)
                    outs.append((va.get(pair.a, OUTPUT, k), b_value))
            d_outs = [d for d in (distance(x, y) for x, y in outs) if d is not None]
            if not d_outs or max(d_outs) == 0.0:
                continue
            d_ins = []
            for k, (in_a, in_b) in enumerate(zip(op_a.inputs, op_b.inputs, strict=True)):
                partial = in_b.producer is not None and in_b.producer[0] in partial_inputs
                how = _how(in_a.shape, in_b.shape, degree, partial)
                if how is not None:
                    b_value = vb.logical(pair.b, INPUT, k, in_a.shape, how)
                    d_ins.append(distance(va.get(pair.a, INPUT, k), b_value))
            u = _roundoff(*(v for o in outs for v in o))
            yield OpDistance(
                step,
                pair.a,
                pair.b,
                *_site(ta, pair.a),
                max(d_outs),
                max((d for d in d_ins if d), default=0.0),
                u,
            )


def _how(shape_a: tuple, shape_b: tuple, degree: int, partial: bool) -> str | None:
    relation, dim = relate(shape_a, shape_b, degree)
    if relation is Relation.SAME:
        return "sum" if partial else "own"
    return f"cat:{dim}" if relation is Relation.SHARD else None


def measure(dir_a: Path, dir_b: Path) -> list[OpDistance]:
    with Run(dir_a) as run_a, Run(dir_b) as run_b:
        degree = layout_degree(run_a.ranks, run_b.ranks)
        if degree is None:
            raise SystemExit(f"{dir_a} and {dir_b}: world sizes that do not divide")
        if degree == 1:
            return list(same_layout(run_a, run_b))
        return list(across_layouts(run_a, run_b, degree))


def quantiles(values: list[float]) -> list[float]:
    if not values:
        return []
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] for q in QUANTILES]


def r_needed(ops: list[OpDistance], amplification: float) -> float:
    """The smallest R explaining every op: max over ops of ``(d_out - A d_in) / u``."""
    return max(((o.d_out - amplification * o.d_in) / o.u for o in ops if o.u), default=0.0)


def summary(ops: list[OpDistance]) -> dict[str, Any]:
    origin = [o.d_out / o.u for o in ops if o.d_in == 0.0 and o.u]
    propagated = [o.d_out / o.d_in for o in ops if o.d_in > 0.0]
    return {
        "ops_differing": len(ops),
        "equal_inputs": len(origin),
        "d_out_over_u_quantiles": quantiles(origin),
        "d_out_over_d_in_quantiles": quantiles(propagated),
        "r_needed": {a: r_needed(ops, a) for a in AMPLIFICATIONS},
        "largest_d_out_over_d_in_by_phase": {
            phase: max(o.d_out / o.d_in for o in ops if o.d_in > 0.0 and o.phase == phase)
            for phase in sorted({o.phase for o in ops if o.d_in > 0.0})
        },
    }


def first_unexplained(ops: list[OpDistance], amplification: float, r: float) -> Any:
    for o in sorted(ops, key=lambda o: (o.step, o.a)):
        if o.d_out > amplification * o.d_in + r * o.u:
            return o
    return None


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:9.3g}" for v in values) if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="where the runs are recorded (kept, reused)")
    parser.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated A:B names")
    parser.add_argument("--json", type=Path, help="also write every op's distances here")
    parser.add_argument(
        "--rule", help="A,R: also list the ops each pair leaves unexplained under this rule"
    )
    args = parser.parse_args()
    chosen = [name.strip() for name in args.pairs.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in PAIRS]
    if unknown:
        raise SystemExit(f"unknown pair(s) {', '.join(unknown)}; known: {', '.join(PAIRS)}")
    with tempfile.TemporaryDirectory() as scratch:
        root = args.root or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        needed = sorted({run for name in chosen for run in PAIRS[name][:2]} & set(RUNS))
        missing = [run for run in needed if not (root / run / "meta.json").exists()]
        if missing:
            record_runs(root, missing, CAPTURE_ALL)
        results = {name: measure(root / PAIRS[name][0], root / PAIRS[name][1]) for name in chosen}
    report(results)
    if args.rule:
        amplification, r = (float(x) for x in args.rule.split(","))
        for name, ops in results.items():
            left = [o for o in ops if o.d_out > amplification * o.d_in + r * o.u]
            print(
                f"\n{name} ({PAIRS[name][2]}) at A={amplification:g}, R={r:g}: {len(left)} unexplained"
            )
            for o in left[:RULE_SHOWN]:
                print(f"  {_describe(o)}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    name: {
                        "expected": PAIRS[name][2],
                        "summary": summary(ops),
                        "ops": [asdict(o) for o in ops],
                    }
                    for name, ops in results.items()
                },
                indent=1,
            )
        )


def report(results: dict[str, list[OpDistance]]) -> None:
    rounding = [o for name, ops in results.items() if PAIRS[name][2] == ROUNDING for o in ops]
    print(f"quantiles {' '.join(f'{q:>9}' for q in QUANTILES)}")
    for name, ops in results.items():
        s = summary(ops)
        print(
            f"\n{name} ({PAIRS[name][2]}): {s['ops_differing']} aligned ops differ, "
            f"{s['equal_inputs']} of them from equal inputs"
        )
        print(f"  d_out/u    (equal inputs)  {_fmt(s['d_out_over_u_quantiles'])}")
        print(f"  d_out/d_in (inputs differ) {_fmt(s['d_out_over_d_in_quantiles'])}")
        needed = "  ".join(f"A={a:g}: {r:.3g}" for a, r in s["r_needed"].items())
        print(f"  R needed   {needed}")
        by_phase = s["largest_d_out_over_d_in_by_phase"].items()
        print("  largest d_out/d_in: " + ", ".join(f"{p} {v:.3g}" for p, v in by_phase))
        if PAIRS[name][2] == REAL and rounding:
            for amplification in AMPLIFICATIONS:
                r = r_needed(rounding, amplification)
                o = first_unexplained(ops, amplification, r)
                where = "none" if o is None else _describe(o)
                print(f"  first unexplained at A={amplification:g}, R={r:.3g}: {where}")


def _describe(o: OpDistance) -> str:
    return (
        f"step {o.step} #{o.a} {o.op} at {o.site} ({o.phase}): "
        f"d_out {o.d_out:.3g}, d_in {o.d_in:.3g}, d_out/u {o.d_out / o.u:.3g}"
    )


if __name__ == "__main__":
    main()
