"""Origin or receiver: where a rank's first divergence came from in a distributed run.

A rank whose first difference traces back, through its own ops, to a collective that returned
different results from equal inputs did not cause anything: another rank sent the difference
(a *receiver*). Any other first divergence started on the rank itself (an *origin*): its data,
an argument, its RNG, a nondeterministic op. The origin ranks are the ones to look at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...store import OpRecord
from ..words.verdict import Cause
from .model import Divergence

ORIGIN = "origin"
RECEIVER = "receiver"


@dataclass(frozen=True)
class Role:
    """A rank's part in the divergence; ``collective`` is the op a receiver received it by."""

    role: str
    collective: OpRecord | None = None

    @property
    def group(self) -> dict[str, Any] | None:
        """The process group of the collective (name, size, ranks, backend) as recorded."""
        if self.collective is None:
            return None
        group = dict(self.collective.args).get("process_group")
        return group if isinstance(group, dict) and "group" in group else None

    def senders(self, rank: int) -> list[int]:
        """For a receiver on ``rank``, the other ranks of its collective's group: where the
        difference came from (empty where the group was not recorded)."""
        group = self.group
        return [k for k in group["ranks"] if k != rank] if group else []


def role_of(div: Divergence) -> Role:
    """Receiver when the producer chain ends at a collective whose inputs and arguments were
    equal on this rank (its output differs only because another rank's input did)."""
    cause = div.a if div.a is not None else div.observed_a
    if div.cause is Cause.ORIGIN and cause.is_collective:
        return Role(RECEIVER, cause)
    return Role(ORIGIN)
