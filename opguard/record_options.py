"""How a recording is made, as ``opguard record`` takes it on its command line (outside
``opguard.recorder``, which imports torch: every CLI start reads this).

One object, built once by the CLI, applied by the session, and turned back into switches for
the processes that record elsewhere (torchrun's workers, another interpreter), so that the three
never disagree on which option exists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .capture_spec import DEFAULT_LIMIT, CaptureSpec


@dataclass(frozen=True)
class RecordOptions:
    steps: int | None = None  # record the first N optimizer steps, then end the run
    overwrite: bool = False
    eager: bool = False  # torch.compile turned off
    verify_inputs: bool = False  # fingerprint every input again
    capture: CaptureSpec | None = None
    capture_limit: int = DEFAULT_LIMIT

    def mode_switches(self) -> list[str]:
        """The switches that change how the program runs: part of the command a run records so
        that ``opguard capture`` can run it again the same way."""
        return [
            flag
            for flag, on in (("--eager", self.eager), ("--verify-inputs", self.verify_inputs))
            if on
        ]

    def switches(self) -> list[str]:
        """Every option as ``opguard record`` (or ``python -m opguard.recorder.launch``) takes it."""
        out = ["--steps", str(self.steps)] if self.steps is not None else []
        if self.overwrite:
            out.append("--overwrite")
        out += self.mode_switches()
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
        }
