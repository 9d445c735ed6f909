"""How a recording is made, as ``opguard record`` takes it on its command line (outside
``opguard.recorder``, which imports torch: every CLI start reads this).

Each option is declared once, as a field of :class:`RecordOptions` with its :class:`Switch`:
the CLI's switches (:func:`add_switches`), the ``record`` tool's parameters, the keyword
arguments of the recording session and the switches handed to the processes that record
elsewhere (torchrun's workers, another interpreter) are all derived from it, so that they never
disagree on which option exists. Adding an option is one field here."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal

from .capture_spec import DEFAULT_LIMIT, CaptureSpec, SpecError, parse_size

Window = tuple[int, int]  # op-level recording for steps START <= s < STOP
# The largest step number or count of steps an option takes: past any run, within the signed
# 64-bit step numbers a trace stores (and the sizes Python's containers take).
LARGEST = 10**18


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


def unreached_window(window: Window, ended_at: int) -> str:
    """What a run whose steps ended (at step ``ended_at``: the step it was in, after the last
    one it took) before its ``--window`` began recorded, as the recording and every reader
    of the run say it; '' when the window was reached."""
    if ended_at >= window[0]:
        return ""
    return (
        f"--window {window_text(window)} was never reached: the run ended at step {ended_at}, "
        "so no op was recorded (step-level records were)"
    )


@dataclass(frozen=True, slots=True)
class Switch:
    """How one option is given: its switch, what it takes (``kind``, as the tool's JSON types
    name it: a flag, a number, or text that ``read`` turns into the option's value and
    ``write`` back), its help, and its part in the rules below."""

    flag: str
    kind: Literal["boolean", "integer", "string"]
    help: str
    metavar: str | None = None
    minimum: int | None = None
    read: Callable[[str], Any] = str
    write: Callable[[Any], str] = str
    mode: bool = False  # changes how the program runs, or which ops and steps get which numbers
    op_level: bool = False  # needs op-level recording (refused with --steps-only)
    needs: str | None = None  # passed on only when this other option is given

    @property
    def maximum(self) -> int | None:
        """The largest value an integer option takes (:data:`LARGEST`)."""
        return LARGEST if self.kind == "integer" else None

    @property
    def metadata(self) -> dict[str, Switch]:
        """The option's field metadata: its switch."""
        return {"switch": self}


@dataclass(frozen=True)
class RecordOptions:
    """Every option of ``opguard record``, in the order its switches are written."""

    steps: int | None = field(
        default=None,
        metadata=Switch(
            flag="--steps",
            kind="integer",
            metavar="N",
            minimum=1,
            help="end the run when step N is reached: steps are numbered from 0 (or --first-step), "
            "so a fresh run records its first N optimizer steps",
        ).metadata,
    )
    overwrite: bool = field(
        default=False,
        metadata=Switch(
            flag="--overwrite", kind="boolean", help="replace an earlier run in RUN_DIR"
        ).metadata,
    )
    steps_only: bool = field(
        default=False,
        metadata=Switch(
            flag="--steps-only",
            kind="boolean",
            help="record no op, only the training state at each step boundary (loss, gradients, "
            "parameters, optimizer states, buffers, RNG): cheap enough for a whole long run",
        ).metadata,
    )
    eager: bool = field(
        default=False,
        metadata=Switch(
            flag="--eager",
            kind="boolean",
            mode=True,
            help="turn torch.compile off: compiled functions run eagerly, op by op",
        ).metadata,
    )
    verify_inputs: bool = field(
        default=False,
        metadata=Switch(
            flag="--verify-inputs",
            kind="boolean",
            mode=True,
            op_level=True,
            help="fingerprint every op input again (slower): shows writes no recorded op made",
        ).metadata,
    )
    first_step: int = field(
        default=0,
        metadata=Switch(
            flag="--first-step",
            kind="integer",
            metavar="N",
            minimum=0,
            mode=True,
            help="number the first step N (a script resumed from a checkpoint at step N), so its "
            "steps line up with the original run's; the script may say it with opguard.step(N)",
        ).metadata,
    )
    window: Window | None = field(
        default=None,
        metadata=Switch(
            flag="--window",
            kind="string",
            metavar="START:STOP",
            read=parse_window,
            write=window_text,
            mode=True,
            op_level=True,
            help="record ops only in steps START to STOP-1 (step-level records everywhere)",
        ).metadata,
    )
    keep_last: int | None = field(
        default=None,
        metadata=Switch(
            flag="--keep-last",
            kind="integer",
            metavar="N",
            minimum=1,
            op_level=True,
            help="flight recorder: keep the ops of the last N completed steps only (step-level "
            "records of all), so the trace stays bounded however long the run",
        ).metadata,
    )
    perturb_rounding: int | None = field(
        default=None,
        metadata=Switch(
            flag="--perturb-rounding",
            kind="integer",
            metavar="SEED",
            minimum=0,
            mode=True,
            help="a control run for opguard diff --tolerant --noise: CHANGES THIS RUN'S NUMBERS "
            "BY DESIGN, moving the results of the ops another implementation rounds "
            "otherwise (maths functions, sums, matmuls, normalizations) by one unit in the "
            "last place, at random from SEED",
        ).metadata,
    )
    capture: CaptureSpec | None = field(
        default=None,
        metadata=Switch(
            flag="--capture",
            kind="string",
            metavar="SPEC",
            read=CaptureSpec.parse,
            write=lambda spec: spec.text,
            op_level=True,
            help="also store the full input and output tensors of these ops: comma-separated op "
            "indices (812), ranges (800-820), op names (aten::addmm.default) or call sites "
            "(train.py:42)",
        ).metadata,
    )
    capture_limit: int = field(
        default=DEFAULT_LIMIT,
        metadata=Switch(
            flag="--capture-limit",
            kind="string",
            metavar="SIZE",
            read=parse_size,
            needs="capture",
            help=f"most bytes of tensors captured per rank (default: {DEFAULT_LIMIT >> 20}MiB)",
        ).metadata,
    )

    @classmethod
    def from_switches(cls, given: argparse.Namespace) -> RecordOptions:
        """The options :func:`add_switches` parsed, checked (:class:`OptionError`)."""
        values = {}
        for f, switch in declared():
            raw = getattr(given, f.name)
            if raw is not None:
                try:
                    values[f.name] = switch.read(raw) if switch.kind == "string" else raw
                except SpecError as exc:
                    raise OptionError(str(exc)) from None
        options = cls(**values)
        options.check()
        return options

    def check(self) -> None:
        """Refuses what cannot be recorded, in one line (:class:`OptionError`)."""
        for f, switch in declared():
            value = getattr(self, f.name)
            if switch.minimum is not None and value is not None and value < switch.minimum:
                least = "0 or more" if switch.minimum == 0 else f"at least {switch.minimum}"
                raise OptionError(f"{switch.flag} must be {least}")
            if switch.maximum is not None and value is not None and value > switch.maximum:
                raise OptionError(f"{switch.flag} must be at most {switch.maximum}")
        if self.steps is not None and self.steps <= self.first_step:
            raise OptionError(
                f"--steps {self.steps} ends the run before step {self.first_step} "
                "(--first-step): step numbers are absolute, --steps N ends it after step N-1"
            )
        if self.window is not None:
            start, stop = self.window
            text = window_text(self.window)
            if start < 0 or stop <= start or stop > LARGEST:
                raise OptionError(f"--window {text}: needs 0 <= START < STOP <= {LARGEST}")
            if stop <= self.first_step:
                raise OptionError(f"--window {text} ends before step {self.first_step} starts")
            if self.steps is not None and start >= self.steps:
                raise OptionError(f"--window {text} starts after --steps {self.steps} ends the run")
        if self.steps_only:
            for f, switch in declared():
                if switch.op_level and getattr(self, f.name) != f.default:
                    raise OptionError(
                        f"{switch.flag} needs op-level recording: not with --steps-only"
                    )

    def mode_switches(self) -> list[str]:
        """The switches that change how the program runs, or which ops and steps get which
        numbers: part of the command a run records so that ``opguard capture`` can run it again
        the same way (its op indices then name the same ops)."""
        return self._switches(mode_only=True)

    def switches(self) -> list[str]:
        """Every option as ``opguard record`` (or ``python -m opguard.recorder.launch``) takes it."""
        return self._switches(mode_only=False)

    def _switches(self, *, mode_only: bool) -> list[str]:
        out: list[str] = []
        for f, switch in declared():
            value = getattr(self, f.name)
            if value == f.default or (mode_only and not switch.mode):
                continue
            if switch.needs is not None and getattr(self, switch.needs) is None:
                continue
            out += [switch.flag] if switch.kind == "boolean" else [switch.flag, switch.write(value)]
        return out

    def session_arguments(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~opguard.recorder.session.RecordingSession`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def declared() -> Iterator[tuple[Field[Any], Switch]]:
    """Each option's field and switch, in the order of the declaration."""
    for f in fields(RecordOptions):
        yield f, f.metadata["switch"]


def add_switches(parser: argparse.ArgumentParser) -> None:
    """The options' switches, on a parser of ``opguard record``'s command line: values are
    kept as typed (:meth:`RecordOptions.from_switches` reads and checks them)."""
    for f, switch in declared():
        if switch.kind == "boolean":
            parser.add_argument(switch.flag, dest=f.name, action="store_true", help=switch.help)
        else:
            parser.add_argument(
                switch.flag,
                dest=f.name,
                type=int if switch.kind == "integer" else str,
                metavar=switch.metavar,
                help=switch.help,
            )
