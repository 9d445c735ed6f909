"""How much room each op family's bound leaves (opguard/analysis/tolerant/families.py), measured
on a recorded pair: for every output the tolerant walk judges, its distance ``d_out`` over the
analytic bound its family gives it (the margin: 1 is the bound), by family, and the ops closest
to their bound.

    python bench/tolerant_calibration.py RUN_A RUN_B [--top 12]

On a pair that differs by rounding alone (another thread count, TF32, another GPU or torch, a
run recorded with ``opguard record --perturb-rounding``) every margin must stay below 1: the
largest per family says how close the family's constants (ESTIMATE, RHO_EXACT, RHO_LIBM,
SPREAD, FLIP_DENSITY) come to calling rounding a change. On a pair with a real change, the op
named has a margin above 1 and the walk stops there. Reads traces only (no torch): the pairs of
tests/tolerant_runs.py, or GPU pairs recorded with ``bash bench/gpu_session.sh tolerant``.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from dataclasses import dataclass

from opguard.analysis import diff_runs
from opguard.analysis.divergence.model import differing_tensors
from opguard.analysis.tolerant.distance import tensor_distance
from opguard.analysis.tolerant.judge import Judge, Judgement
from opguard.analysis.tolerant.rounding import op_unit
from opguard.analysis.tolerant.rule import Tolerance
from opguard.analysis.words.verdict import Side
from opguard.store import OpRecord, Run


@dataclass(frozen=True)
class Margin:
    """One judged output: its op, family, distance, the distance of its op's inputs, and its
    analytic bound."""

    op: str
    index: int
    step: int
    family: str
    d_out: float
    d_in: float
    limit: float

    @property
    def margin(self) -> float:
        return self.d_out / self.limit if self.limit else float("inf")


class Measuring(Judge):
    """The tolerant judge, keeping the margin of every output it judges (with the judge's own
    pieces: the inputs' distance, the output's bound)."""

    margins: list[Margin]

    def judge(self, op_a: OpRecord, op_b: OpRecord) -> Judgement | None:
        judged = super().judge(op_a, op_b)
        unit = op_unit(op_a, op_b, self.environments)
        # the measured inputs' distance (judging=False: inputs of unknown distance, which the
        # judge took at what rounding allows and noted, are left out, and not noted twice)
        spread = self._inputs(op_a, op_b, unit, judging=False).d_in.spread
        for d in differing_tensors(op_a.outputs, op_b.outputs):
            ta, tb = d.a, d.b
            if ta is None or tb is None or ta.is_view or tb.is_view:
                continue
            distance = tensor_distance(ta, tb)
            if distance is None or ta.sketch is None:
                continue
            bound = self._bound(Side.A, (op_a, op_b), ta, tb)
            self.margins.append(
                Margin(
                    op_a.op,
                    op_a.index,
                    op_a.step,
                    bound.family,
                    distance.estimate,
                    spread,
                    bound.limit(spread),
                )
            )
        return judged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--top", type=int, default=12, help="the ops closest to their bound")
    args = parser.parse_args()
    Measuring.margins = []
    import opguard.analysis.diff as walk

    walk.Judge = Measuring  # type: ignore[misc]  (the walk's judge, for this measurement)
    with Run(args.run_a) as run_a, Run(args.run_b) as run_b:
        result = diff_runs(run_a, run_b, tolerance=Tolerance())
    margins = Measuring.margins
    first = result.first
    said = f"first divergence at #{first.observed_a.index}" if first and first.observed_a else ""
    print(f"{result.verdict} {said}: {len(margins)} outputs judged")
    by_family: dict[str, list[float]] = defaultdict(list)
    for m in margins:
        by_family[m.family].append(m.margin)
    print(f"{'family':16s} {'outputs':>8s} {'median':>9s} {'max':>9s}   (d_out / bound)")
    for family, values in sorted(by_family.items()):
        print(f"{family:16s} {len(values):8d} {statistics.median(values):9.3g} {max(values):9.3g}")
    print("closest to their bound:")
    for m in sorted(margins, key=lambda m: m.margin, reverse=True)[: args.top]:
        print(
            f"  {m.margin:7.3g}  #{m.index} step {m.step} {m.op} ({m.family}): d_out {m.d_out:.2e}, "
            f"d_in {m.d_in:.2e}, bound {m.limit:.2e}"
        )


if __name__ == "__main__":
    main()
