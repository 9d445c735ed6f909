"""When a rank records ops: always, only inside a window of steps (``opguard record --window
START:STOP``), and for how long it keeps them (``--keep-last N``, the flight recorder).

Outside a window the recorder is truly off, not idle: its dispatch mode is popped off the
stack (so ops dispatch as they do unrecorded), compiled kernels no longer report to it, and
CUPTI's launch callbacks and activity records are turned off; the step pays the step-level
records' cost only. Inside, everything is as in a full recording, op indices continuing where
the last op recorded left off.

The flight recorder keeps the ops of the last N completed steps and of the step in progress:
at each step boundary the trace writer is asked to delete what came before, as it writes (LMDB
reuses the freed pages, so the file stops growing once N steps are held).
"""

from __future__ import annotations

import collections
import sys
from typing import Any

from . import compiled
from .mode import OpRecorder
from .perturb import PerturbingMode
from .tensors import dispatch_stack

Window = tuple[int, int]


class OpLevel:
    """Pushes and pops ``recorder`` as the steps enter and leave ``window`` (None: records all
    of them), and drops ops older than the last ``keep_last`` completed steps (None: keeps
    all)."""

    def __init__(
        self, recorder: OpRecorder, writer: Any, window: Window | None, keep_last: int | None
    ) -> None:
        self._recorder = recorder
        self._writer = writer
        self._window = window
        self._pushed = False
        self._on: bool | None = None  # unknown until the first step number is known
        self._refused_at: int | None = None
        # Op indices where the last keep_last + 1 steps started, the current one last.
        self._starts: collections.deque[int] | None = (
            collections.deque([0], maxlen=keep_last + 1) if keep_last is not None else None
        )
        self._floor = 0

    def wanted(self, step: int) -> bool:
        return self._window is None or self._window[0] <= step < self._window[1]

    def at_step(self, step: int) -> None:
        """The step now starting is ``step``: records its ops, or not."""
        on = self.wanted(step)
        if on == self._on:
            return
        if on:
            self._turn_on(step, first=self._on is None)
        else:
            self._turn_off()

    def step_ended(self, next_index: int) -> None:
        """A step ended; the next starts at op ``next_index``. The flight recorder drops the
        ops of the step that is now one too many. Steps that recorded no op (outside a
        window, after recording stopped) do not count: the last steps with ops stay."""
        starts = self._starts
        if starts is None or next_index == starts[-1]:
            return
        starts.append(next_index)
        if len(starts) == starts.maxlen and starts[0] > self._floor:
            self._floor = starts[0]
            self._writer.drop_ops(self._floor)

    def close(self) -> None:
        """Pops the recorder if it is on the stack."""
        if self._pushed:
            self._recorder.__exit__(None, None, None)
            self._pushed = False
        self._on = False

    def _turn_on(self, step: int, first: bool) -> None:
        if self._recorder.stopped:  # for good (the step limit, a failure)
            return
        if not self._pushed:
            if not first and any(not isinstance(m, PerturbingMode) for m in dispatch_stack()):
                # Pushed above a mode the script entered since recording started, the recorder
                # would be popped by that mode's exit: these ops stay unrecorded rather than
                # break it. (A control run's perturbation, pushed when recording started, is
                # beneath it as it should be.)
                if self._refused_at is None:
                    self._refused_at = step
                    print(
                        f"opguard: ops of step {step} not recorded: another dispatch mode is "
                        "active at its start (the recorder can only be entered outside it)",
                        file=sys.stderr,
                    )
                return
            self._recorder.__enter__()
            self._pushed = True
        self._recorder.resume()
        compiled.attach(self._recorder)
        self._on = True

    def _turn_off(self) -> None:
        self._recorder.pause()
        compiled.attach(None)
        stack = dispatch_stack()
        if self._pushed and stack and stack[-1] is self._recorder:
            self._recorder.__exit__(None, None, None)
            self._pushed = False
        # else a mode entered later sits above it: it stays, passing ops through
        self._on = False
