"""The two runs the debugger compares: opened and checked before any UI starts, so a run that
cannot be read is one line on stderr (exit status 2), never a half-drawn screen."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..analysis import RankDiff
from ..analysis.browse.rows import RankRows, Side
from ..analysis.diff import RankPair, by_steps_only, compared_ranks
from ..analysis.tolerant.rule import Tolerance
from ..store import RankTrace, Run

# Below this share of aligned ops the runs are probably not two versions of one program.
SAME_PROGRAM_ALIGNED = 0.5
# How the diff's notes of absorbed differences begin (each one's, and the count of the rest:
# analysis.divergence.reach.Absorbed.text): the list marks those rows, one toast says it.
ABSORBED_NOTE = "absorbed: "


@dataclass(frozen=True, slots=True)
class RunState:
    """What the header says about one run."""

    label: str
    status: str  # from meta.json: running, finished, failed, stopped …
    finished: bool  # the rank's trace has its end record

    def describe(self) -> str:
        if not self.finished:
            return "unfinished: still recording, or killed"
        return self.status


class Session:
    """Two opened runs, the ranks compared (as the diff pairs them: rank by rank, or under
    ``--tolerant`` each rank of a TP=N run against the one rank of a TP=1 run, known by the
    larger run's rank), and one row model per rank."""

    def __init__(
        self,
        run_a: Run,
        run_b: Run,
        labels: tuple[str, str],
        tolerance: Tolerance | None = None,
    ) -> None:
        self.runs = (run_a, run_b)
        self.labels = labels
        self.tolerance = tolerance  # --tolerant: differences judged against rounding
        self._pairs: dict[int, RankPair] = {
            pair.reported: pair
            for pair in compared_ranks(run_a.ranks, run_b.ranks, None, tolerance)
        }
        self.ranks = sorted(self._pairs)
        self._rows: dict[int, RankRows] = {}

    @classmethod
    def open(
        cls, path_a: str | Path, path_b: str | Path, tolerance: Tolerance | None = None
    ) -> Session:
        """Opens both runs and the first rank they share; raises :class:`TraceError` with a
        one-line reason when that is impossible."""
        runs: list[Run] = []
        try:
            for path in (path_a, path_b):
                runs.append(Run(path))
            session = cls(runs[0], runs[1], (str(path_a), str(path_b)), tolerance)
            session.rows(session.ranks[0])
        except BaseException:
            for run in runs:
                run.close()
            raise
        return session

    def trace(self, side: Side, rank: int) -> RankTrace:
        """The trace of run ``side`` that rank ``rank``'s comparison reads."""
        return self.runs[side.value].rank(self._pairs[rank].ranks[side.value])

    def rows(self, rank: int) -> RankRows:
        """The row model of ``rank`` (opened on first use; :class:`TraceError` if unreadable)."""
        rows = self._rows.get(rank)
        if rows is None:
            rows = self._rows[rank] = RankRows(
                self.trace(Side.A, rank),
                self.trace(Side.B, rank),
                across_layouts=self._pairs[rank].layout is not None,
            )
        return rows

    def by_steps(self, rank: int) -> bool:
        """Whether ``rank`` is compared by its step-level records (a run recorded no ops)."""
        return by_steps_only(self.trace(Side.A, rank), self.trace(Side.B, rank))

    def state(self, side: Side, rank: int) -> RunState:
        run = self.runs[side.value]
        return RunState(self.labels[side.value], run.status, self.trace(side, rank).finished)

    def notices(self, rank: int) -> list[str]:
        """What a person should know before trusting the picture of ``rank``."""
        notes = []
        for side in Side:
            run, trace = self.runs[side.value], self.trace(side, rank)
            if not len(trace):
                what = "step-level records only" if trace.has_steps else "no ops"
                notes.append(f"run {side.name} recorded {what} on rank {rank}")
            if trace.failure:
                notes.append(
                    f"run {side.name}: recording stopped at op {trace.failure['at_op']}: "
                    f"{trace.failure['error']}"
                )
            compared = {pair.ranks[side.value] for pair in self._pairs.values()}
            only = sorted(set(run.ranks) - compared)
            if only:
                notes.append(f"rank(s) {only} only in run {side.name}: not compared")
        return notes

    def close(self) -> None:
        for run in self.runs:
            run.close()


def diff_notices(diff: RankDiff) -> list[str]:
    """The diff's own notes, its absorbed differences in one (a note each would pile up over
    the detail pane), and a warning when so little aligned that the runs look like different
    programs (then every "difference" is noise)."""
    notes = [note for note in diff.notes if not note.startswith(ABSORBED_NOTE)]
    if diff.absorbed_count:
        notes.append(
            f"{diff.absorbed_count} difference(s) absorbed: every op that read them produced "
            "the same outputs in both runs (rows marked absorbed)"
        )
    total = diff.aligned + max(diff.only_a, diff.only_b)
    if total and diff.aligned / total < SAME_PROGRAM_ALIGNED:
        notes.append(
            f"only {diff.aligned / total:.0%} of ops aligned: these look like different "
            "programs, so most differences shown are not meaningful"
        )
    return notes
