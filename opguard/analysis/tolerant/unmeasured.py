"""The differing tensors of one rank whose distance is unknown, for the tolerant judge: no op is
named for an unknown distance (DIVERGED only on evidence). Such a tensor is taken at what
rounding allows the ops that wrote it, and the op that reads it is judged by its own measured
outputs with it taken so: it is judged by what it feeds. This ledger keeps what was taken for
each unmeasured output (for the ops that read it), which tensors some measured output judged,
and which nothing did (:class:`~.judgement.RankTolerance`: the examples and the counts)."""

from __future__ import annotations

from dataclasses import replace

from ...store import OpRecord
from .judgement import UNJUDGED_SHOWN, Producer, RankTolerance, Unjudged


class Unmeasured:
    """One rank's unmeasured tensors, noted into ``found`` as the walk meets them."""

    def __init__(self, found: RankTolerance) -> None:
        self.found = found
        # Tensors no measured output judged yet: note number -> the notes judged with it (an
        # op whose outputs are unmeasured too passes what it read on to what reads them).
        self._open: dict[int, tuple[int, ...]] = {}
        # Run A's unmeasured outputs: (op index, slot) -> (what rounding allows them, note)
        self._outputs: dict[Producer, tuple[float, int]] = {}
        self._pair: list[int] = []  # the notes of the pair judged last

    def begin(self) -> None:
        """Starts the notes of the next pair judged (:attr:`left_open`)."""
        self._pair.clear()

    @property
    def left_open(self) -> bool:
        """Whether the pair judged last left a tensor no measured output judged (yet): the
        walk asks then whether its difference reaches anything (:meth:`reached_nothing`)."""
        return any(number in self._open for number in self._pair)

    def note(self, unjudged: Unjudged, upstream: tuple[int, ...] = ()) -> int:
        """Notes a tensor not judged (with the open notes it carries on: ``upstream``) and
        returns its number."""
        number = self.found.unjudged_count
        self.found.unjudged_count += 1
        if number < UNJUDGED_SHOWN:
            self.found.unjudged.append(unjudged)
        self._open[number] = upstream
        self._pair.append(number)
        self.found.unknown_steps.add(unjudged.step)
        self._count()
        return number

    def reached_nothing(self) -> None:
        """Notes that the difference of the pair judged last reached nothing (no reader's
        output changed with it: absorbed): its open notes need no judging."""
        for number in self._pair:
            if self._open.pop(number, None) is not None and number < UNJUDGED_SHOWN:
                shown = self.found.unjudged
                shown[number] = replace(shown[number], reached_nothing=True)
        self._count()

    def output(
        self, unjudged: Unjudged, producer: Producer | None, upstream: tuple[int, ...]
    ) -> None:
        """Notes an output whose distance is unknown, and keeps what rounding allows it
        (``unjudged.allowed``) for the ops that read it (``producer``: run A's op and slot;
        None for an output of run B only)."""
        number = self.note(unjudged, upstream)
        if unjudged.allowed is not None and producer is not None:
            self._outputs[producer] = (unjudged.allowed, number)

    def taken(self, producer: Producer | None) -> tuple[float, int] | None:
        """What rounding allows run A's unmeasured output ``producer``, and its note; None
        where it was measured or nothing bounds it."""
        return self._outputs.get(producer) if producer is not None else None

    def judged(self, numbers: tuple[int, ...], by: tuple[OpRecord, OpRecord]) -> None:
        """Notes that the measured outputs of aligned ops ``by`` judged the tensors
        ``numbers`` (and what each carried on)."""
        pending = list(numbers)
        while pending:
            number = pending.pop()
            upstream = self._open.pop(number, None)
            if upstream is None:
                continue
            pending.extend(upstream)
            if number < UNJUDGED_SHOWN:
                shown = self.found.unjudged
                shown[number] = replace(shown[number], judged_by=by)
        self._count()

    def _count(self) -> None:
        self.found.judged_by_nothing = len(self._open)
