"""Messages from background work to the main screen. Workers never touch widgets: they post
one of these, and their failures arrive as :class:`WorkFailed`, never as a crash."""

from __future__ import annotations

from collections.abc import Mapping

from textual.message import Message

from ..analysis import RankDiff
from ..analysis.browse.rows import Side
from .cursor import Position


class DiffReady(Message):
    def __init__(self, rank: int, diff: RankDiff) -> None:
        super().__init__()
        self.rank = rank
        self.diff = diff


class LossReady(Message):
    def __init__(self, rank: int, series: Mapping[Side, Mapping[int, float]]) -> None:
        super().__init__()
        self.rank = rank
        self.series = series


class Found(Message):
    """A finder ran: ``position`` is where to go, None when nothing was found."""

    def __init__(self, what: str, position: Position | None, jump: bool) -> None:
        super().__init__()
        self.what = what
        self.position = position
        self.jump = jump  # remember where we came from (b returns)


class WorkFailed(Message):
    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error
