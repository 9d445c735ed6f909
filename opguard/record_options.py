"""How a recording is made, as ``opguard record`` takes it on its command line (outside
``opguard.recorder``, which imports torch: every CLI start reads this).

One object, built once by the CLI, applied by the session, and turned back into switches for
the processes that record elsewhere (torchrun's workers, another interpreter), so that the three
never disagree on which option exists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .capture_spec import DEFAULT_LIMIT, CaptureSpec

Window = tuple[int, int]  # op-level recording for steps START <= s < STOP


class OptionError(ValueError):
    """Options that cannot go together, or a value out of range: one line saying why."""


def parse_window(text: str) -> Window:
    """``START:STOP`` (``--window``) as two step numbers; :class:`OptionError` otherwise."""
    start, sep, stop = text.partition(":")
    try:
        window = (int(start), int(stop))
    except ValueError:
        window = None
    if not sep or window is None:
        raise OptionError(f"--window takes START:STOP (step numbers, STOP excluded), not {text!r}")
    return window


def window_text(window: Window) -> str:
    return f"{window[0]}:{window[1]}"


@dataclass(frozen=True)
class RecordOptions:
    # End the run when step N is reached: steps are numbered from 0 (or --first-step), so a
    # fresh run records the first N steps, and a resumed one ends where the original did.
    steps: int | None = None
    overwrite: bool = False
    eager: bool = False  # torch.compile turned off
    verify_inputs: bool = False  # fingerprint every input again
    capture: CaptureSpec | None = None
    capture_limit: int = DEFAULT_LIMIT
    steps_only: bool = False  # step-level records only, no op is recorded
    first_step: int = 0  # the number of the first step (a script resumed from a checkpoint)
    window: Window | None = None  # op-level recording only for these steps
    keep_last: int | None = None  # op-level records of the last N completed steps only

    def check(self) -> None:
        """Refuses what cannot be recorded, in one line (:class:`OptionError`)."""
        if self.steps is not None and self.steps < 1:
            raise OptionError("--steps must be at least 1")
        if self.first_step < 0:
            raise OptionError("--first-step must be 0 or more")
        if self.keep_last is not None and self.keep_last < 1:
            raise OptionError("--keep-last must be at least 1")
        if self.steps is not None and self.steps <= self.first_step:
            raise OptionError(
                f"--steps {self.steps} ends the run before step {self.first_step} "
                "(--first-step): step numbers are absolute, --steps N ends it after step N-1"
            )
        if self.window is not None:
            start, stop = self.window
            text = window_text(self.window)
            if start < 0 or stop <= start:
                raise OptionError(f"--window {text}: needs 0 <= START < STOP")
            if stop <= self.first_step:
                raise OptionError(f"--window {text} ends before step {self.first_step} starts")
            if self.steps is not None and start >= self.steps:
                raise OptionError(f"--window {text} starts after --steps {self.steps} ends the run")
        if self.steps_only:
            op_level = (
                ("--window", self.window is not None),
                ("--keep-last", self.keep_last is not None),
                ("--capture", self.capture is not None),
                ("--verify-inputs", self.verify_inputs),
            )
            for flag, given in op_level:
                if given:
                    raise OptionError(f"{flag} needs op-level recording: not with --steps-only")

    def mode_switches(self) -> list[str]:
        """The switches that change how the program runs, or which ops and steps get which
        numbers: part of the command a run records so that ``opguard capture`` can run it again
        the same way (its op indices then name the same ops)."""
        out = [
            flag
            for flag, on in (("--eager", self.eager), ("--verify-inputs", self.verify_inputs))
            if on
        ]
        if self.first_step:
            out += ["--first-step", str(self.first_step)]
        if self.window is not None:
            out += ["--window", window_text(self.window)]
        return out

    def switches(self) -> list[str]:
        """Every option as ``opguard record`` (or ``python -m opguard.recorder.launch``) takes it."""
        out = ["--steps", str(self.steps)] if self.steps is not None else []
        if self.overwrite:
            out.append("--overwrite")
        if self.steps_only:
            out.append("--steps-only")
        out += self.mode_switches()
        if self.keep_last is not None:
            out += ["--keep-last", str(self.keep_last)]
        if self.capture is not None:
            out += ["--capture", self.capture.text]
            if self.capture_limit != DEFAULT_LIMIT:
                out += ["--capture-limit", str(self.capture_limit)]
        return out

    def session_arguments(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~opguard.recorder.session.RecordingSession`."""
        return {
            "steps": self.steps,
            "overwrite": self.overwrite,
            "eager": self.eager,
            "verify_inputs": self.verify_inputs,
            "capture": self.capture,
            "capture_limit": self.capture_limit,
            "steps_only": self.steps_only,
            "first_step": self.first_step,
            "window": self.window,
            "keep_last": self.keep_last,
        }
