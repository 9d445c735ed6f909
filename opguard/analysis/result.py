"""What comparing two runs found: per step, per rank and for the whole run, with the verdict.

:mod:`.diff` fills these in; the report, the JSON (:mod:`.contract`), the TUI and the agent
read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .align.steps import StepCount, range_text
from .divergence.compilation import known_difference
from .divergence.model import Divergence
from .divergence.nonfinite import Nonfinite
from .divergence.reach import Absorbed
from .divergence.roles import ORIGIN, Role, role_of
from .state_diff import StateComparison, StepDivergence
from .tolerant.judgement import DRIFT_AROUND, Judgement, RankTolerance
from .tolerant.layout_judge import LayoutCounts
from .tolerant.rule import Tolerance

# The verdicts, and the exit status each gives ``opguard diff`` and ``explain`` (2: an error).
# ``incomplete``: nothing differed in what could be read, and a run could not be read to its
# end (a damaged record), a rank could not be compared (--ray: its node lost), or with
# --tolerant a difference whose distance is unknown was judged by nothing: never a verdict of
# equality.
EXIT_STATUS = {"identical": 0, "within-rounding": 0, "diverged": 1, "incomplete": 3}


def verdict_of(diverged: bool, tolerant: bool, differs: bool, incomplete: bool) -> str:
    """``identical``, ``diverged``, with --tolerant ``within-rounding`` (the runs differ, by no
    more than rounding explains), or ``incomplete``: no divergence in what was read, but part
    of a run could not be read, or judged (:data:`EXIT_STATUS`)."""
    if diverged:
        return "diverged"
    if incomplete:
        return "incomplete"
    return "within-rounding" if tolerant and differs else "identical"


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0-3, 7``: ranks in order, runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for k in sorted(ranks):
        if runs and runs[-1][1] == k - 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(parts)}"


@dataclass
class StepSummary:
    step: int
    aligned: int = 0
    only_a: int = 0
    only_b: int = 0
    differing: int = 0  # aligned pairs whose outputs differ
    # Aligned pairs (op index in A, in B) whose difference no reader saw (.reach), judged
    # before the first divergence: not counted in ``differing``.
    absorbed_pairs: list[tuple[int, int]] = field(default_factory=list)
    # Aligned pairs that are steps of a computation the runs take in another order (a sum
    # over the parameters reversed), found before the first divergence: their partial results
    # are not compared, and not counted in ``differing``.
    reordered_pairs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def absorbed(self) -> int:
        return len(self.absorbed_pairs)

    @property
    def ops(self) -> int:
        """The step's rows: aligned pairs and ops of one run only."""
        return self.aligned + self.only_a + self.only_b

    @property
    def changed(self) -> int:
        """The rows that are not the same in both runs: differing pairs, ops of one run only
        (where along the run the runs differ, as the TUI's strip and the report's plot draw it)."""
        return self.differing + self.only_a + self.only_b


@dataclass
class RankDiff:
    rank: int
    # The steps each run holds, as every front end counts them (the whole run, also with --step).
    count_a: StepCount = field(default_factory=StepCount)
    count_b: StepCount = field(default_factory=StepCount)
    aligned: int = 0
    only_a: int = 0
    only_b: int = 0
    differing: int = 0
    # Differences judged before the first divergence that reached nothing (the first few).
    absorbed: list[Absorbed] = field(default_factory=list)
    absorbed_count: int = 0
    steps: list[StepSummary] = field(default_factory=list)
    unaligned_a: list[int] = field(default_factory=list)  # first few op indices only in A
    unaligned_b: list[int] = field(default_factory=list)
    first: Divergence | None = None
    notes: list[str] = field(default_factory=list)
    # Where NaN/Inf first appeared in each run (None: never, or not scanned).
    nonfinite_a: Nonfinite | None = None
    nonfinite_b: Nonfinite | None = None
    nonfinite_scanned: bool = False  # False with --step: only part of the runs was read
    nonfinite_same: bool = False  # both runs met the same NaN/Inf values (nonfinite.same_in_both)
    # The step-level records compared (None: a run holds none); ``ops_compared`` False: a
    # run holds step-level records only, which alone gave the verdict.
    states: StateComparison | None = None
    ops_compared: bool = True
    # --tolerant: what rounding explained (``first`` then is the first op it does not explain)
    tolerance: RankTolerance | None = None
    # --tolerant across parallel layouts: the ranks compared (``rank`` is the multi-rank
    # run's) and what was compared by value
    layout: LayoutCounts | None = None
    # What could not be read of a run that the comparison reached: (run "A" or "B", why)
    unread: list[tuple[str, str]] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # runs whose recording did not end

    @property
    def trace_ranks(self) -> tuple[int, int]:
        """The rank of run A and of run B compared (across layouts, the single-rank run's
        one rank against each rank of the other)."""
        if self.layout is not None:
            return self.layout.rank_a, self.layout.rank_b
        return self.rank, self.rank

    @property
    def state_first(self) -> StepDivergence | None:
        """The first step whose state differs, from the step-level records."""
        return self.states.first if self.states is not None else None

    @property
    def diverged(self) -> bool:
        """Whether the rank differs: an op-level divergence, or a step whose state differs
        (with --tolerant only where no op was compared: where ops were, they judge, and the
        state differs by the rounding they were judged to differ by)."""
        if self.first is not None:
            return True
        return self.state_first is not None and self.tolerance is None

    @property
    def differs(self) -> bool:
        """Whether any compared value differs at all (an aligned op's outputs, a state)."""
        states = self.states is not None and self.states.differs
        return states or self.state_first is not None or bool(self.differing or self.absorbed_count)

    @property
    def tolerant(self) -> bool:
        """Whether differences rounding explains were allowed (op records or step-level)."""
        return self.tolerance is not None or (
            self.states is not None and self.states.tolerance is not None
        )

    @property
    def judged_by_nothing(self) -> int:
        """--tolerant: differing tensors whose distance is unknown that no measured output
        judged (before the first divergence): the verdict is then incomplete."""
        return self.tolerance.judged_by_nothing if self.tolerance is not None else 0

    @property
    def verdict(self) -> str:
        """The rank's verdict, as :attr:`RunDiff.verdict` says the run's."""
        incomplete = bool(self.unread or self.judged_by_nothing)
        return verdict_of(self.diverged, self.tolerant, self.differs, incomplete)

    @property
    def steps_a(self) -> int:
        return self.count_a.steps

    @property
    def steps_b(self) -> int:
        return self.count_b.steps

    @property
    def role(self) -> Role | None:
        """Origin or receiver of its first divergence (None when the rank did not diverge)."""
        return role_of(self.first) if self.first is not None else None


@dataclass
class RunDiff:
    """The comparison of two runs: every compared rank, and the verdict."""

    path_a: str
    path_b: str
    meta_a: dict[str, Any]
    meta_b: dict[str, Any]
    ranks: list[RankDiff]
    # Ranks recorded in one run only (runs of different world sizes): listed, not compared.
    only_in_a: list[int] = field(default_factory=list)
    only_in_b: list[int] = field(default_factory=list)
    # --tolerant: how differences were judged (None: bit for bit)
    tolerance: Tolerance | None = None
    # Ranks whose traces could not be read where they are (compared on a cluster's nodes: a
    # node lost, a trace missing or damaged on its node), and why: listed, not compared.
    not_compared: list[tuple[int, str]] = field(default_factory=list)
    # Ranks whose op records were left uncompared after a first pass over every rank's
    # step-level records found their state equal (the divergence did not reach them:
    # opguard.distributed compares op by op only the ranks it reached).
    by_states_only: list[int] = field(default_factory=list)

    @property
    def uncompared(self) -> list[str]:
        """One line per rank recorded in one run only or not compared, and one for the ranks
        compared by their step-level records only."""
        compared = len(self.ranks)
        sizes = f"{compared + len(self.only_in_a)} vs {compared + len(self.only_in_b)}"
        lines = [
            f"rank {k} was recorded only in run {name} (ranks {sizes}): not compared"
            for name, only in (("A", self.only_in_a), ("B", self.only_in_b))
            for k in only
        ]
        lines += [f"rank {k}: not compared: {why}" for k, why in self.not_compared]
        if self.by_states_only:
            lines.append(
                f"op level: {ranks_text(self.by_states_only)} compared by their step-level "
                "records only: their state never differed, so the divergence did not reach them "
                "(their op records were not read)"
            )
        return lines

    @property
    def notes(self) -> list[str]:
        """What could not be compared across ranks, then each compared rank's notes."""
        return self.uncompared + [n for r in self.ranks for n in r.notes]

    @property
    def first(self) -> Divergence | None:
        """The earliest divergence of an origin rank; of any rank when every rank received
        its difference (the sender was not compared, e.g. with ``--rank``)."""
        origins = [r.first for r in self.ranks if r.first is not None and self._is_origin(r)]
        found = origins or [r.first for r in self.ranks if r.first is not None]
        return min(found, key=lambda d: (d.step, d.observed_a.index, d.rank)) if found else None

    @property
    def first_judgement(self) -> Judgement | None:
        """--tolerant: why rounding does not explain :attr:`first` (its distances)."""
        first = self.first
        for r in self.ranks:
            if r.first is first and first is not None and r.tolerance is not None:
                return r.tolerance.first
        return None

    @property
    def origin_ranks(self) -> list[int]:
        return [r.rank for r in self.ranks if r.first is not None and self._is_origin(r)]

    @staticmethod
    def _is_origin(r: RankDiff) -> bool:
        role = r.role
        return role is not None and role.role == ORIGIN

    @property
    def state_first(self) -> StepDivergence | None:
        """The earliest (step, then rank) step whose state differs, from the step-level records
        (the verdict where a run holds step-level records only)."""
        found = [r.state_first for r in self.ranks if r.state_first is not None]
        return min(found, key=lambda d: (d.step, d.rank)) if found else None

    @property
    def diverged(self) -> bool:
        """Whether the runs differ: a rank that diverged (:attr:`RankDiff.diverged`)."""
        return any(r.diverged for r in self.ranks)

    @property
    def verdict(self) -> str:
        """``identical``, ``diverged``, with --tolerant ``within-rounding``, or ``incomplete``
        (:func:`verdict_of`)."""
        return verdict_of(self.diverged, self.tolerance is not None, self.differs, self.incomplete)

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]

    @property
    def incomplete(self) -> bool:
        """Whether reading a run stopped before its end where the comparison reached it, a
        rank could not be compared at all, or (--tolerant) a difference whose distance is
        unknown was judged by nothing."""
        return any(r.unread or r.judged_by_nothing for r in self.ranks) or bool(self.not_compared)

    def scope(self) -> str:
        """What the verdict covers where it is not the whole of both runs, in words (empty
        otherwise): the steps compared, which run could not be read further or did not
        finish, the ranks not compared, and (--tolerant) how many differences were judged by
        nothing."""
        unjudged = sum(r.judged_by_nothing for r in self.ranks)
        cut = [
            *(
                f"run {name} could not be read further ({why})"
                for r in self.ranks
                for name, why in r.unread
            ),
            *(
                [
                    f"{unjudged} differing tensor(s) whose distance is unknown were judged by "
                    "nothing (see 'not judged')"
                ]
                if unjudged
                else []
            ),
            *(
                f"run {name} did not finish"
                for name in sorted({n for r in self.ranks for n in r.unfinished})
            ),
            *(
                [f"{ranks_text([k for k, _ in self.not_compared])} not compared"]
                if self.not_compared
                else []
            ),
        ]
        if not cut:
            return ""
        steps = sorted({s.step for r in self.ranks for s in r.steps})
        compared = f"over {range_text(steps[0], steps[-1])}" if steps else "over no op"
        return f"{compared}: {'; '.join(dict.fromkeys(cut))}"

    @property
    def differs(self) -> bool:
        """Whether any compared value differs at all (an aligned op's outputs, a state)."""
        return any(r.differs for r in self.ranks)

    def drift(self) -> list[tuple[int, float | None]]:
        """--tolerant: the largest relative distance of each step's aligned ops (of its state
        entries, where a rank compared step-level records only) over the ranks, for the steps
        around the first divergence (every step when none); None where a distance was
        unknown."""
        around = self.first.step if self.first is not None else None
        around = around if around is not None else self._state_around()
        largest: dict[int, float | None] = {}
        for r in self.ranks:
            for step, distance in _drift_of(r, around):
                known = largest.get(step, 0.0)
                unknown = distance is None or (step in largest and known is None)
                largest[step] = None if unknown else max(known or 0.0, distance or 0.0)
        return sorted(largest.items())

    def _state_around(self) -> int | None:
        """The step the drift is drawn around where the step-level records gave the verdict."""
        state = self.state_first
        return state.step if state is not None and self.diverged else None

    def changed_share(self) -> list[tuple[int, float]]:
        """The share of each compared step's rows that differ (:attr:`StepSummary.changed`),
        over the ranks: where along the run ops differ."""
        counts: dict[int, list[int]] = {}
        for r in self.ranks:
            for s in r.steps:
                total = counts.setdefault(s.step, [0, 0])
                total[0] += s.changed
                total[1] += s.ops
        return [(step, changed / ops) for step, (changed, ops) in sorted(counts.items()) if ops]

    @property
    def known_difference(self) -> str:
        """Why the first divergence is expected (compiled vs eager recording), or ''."""
        first = self.first
        return known_difference(first, self.meta_a, self.meta_b) if first is not None else ""


def _drift_of(r: RankDiff, around: int | None) -> list[tuple[int, float | None]]:
    """A rank's drift under --tolerant: its aligned ops' where it compared ops, else its
    step-level records' (the steps whose state differed, :mod:`.tolerant.envelope`); the steps
    within ``DRIFT_AROUND`` of ``around`` when given."""
    if r.tolerance is not None:
        return r.tolerance.drift_series([s.step for s in r.steps], around)
    found = r.states.tolerance if r.states is not None else None
    if found is None or r.ops_compared:
        return []
    return [
        (step, None if step in found.unknown_steps else distance)
        for step, distance in sorted(found.drift.items())
        if around is None or abs(step - around) <= DRIFT_AROUND
    ]
