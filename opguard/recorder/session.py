"""A recording session: the run directory, the trace writer, the optimizer hooks and the mode.

``opguard.record(RUN_DIR)`` and ``opguard record`` both go through :class:`RecordingSession`.
"""

from __future__ import annotations

import gc
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path
from types import CodeType
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from .. import _C, __version__
from ..capture_spec import DEFAULT_LIMIT, CaptureSpec, format_size
from ..record_options import RecordOptions, unreached_window
from ..store import TraceError, TraceWriter, schema
from ..store.environment import KEY as ENVIRONMENT
from ..store.meta import read_meta, recorded_environment, write_meta
from . import compiled
from .capture import Capturer
from .environment import environment
from .kernels import KernelActivity
from .mode import OpRecorder, StepState, TraceWriteFailed, failure_info
from .op_level import OpLevel
from .perturb import PerturbingMode
from .ranks import distributed_info, env_rank, prepared_by_parent, wait_for_rank0
from .step_records import StepRecorder
from .termination import Terminated, catch_sigterm, die_of_sigterm, release_sigterm

_active: RecordingSession | None = None
TERMINATED = "terminated"  # the run's status after a SIGTERM
RECORDING_GC_THRESHOLD = 10_000  # young-generation allocations between collections (default 700)


class StepLimitReached(SystemExit):
    """Raised from ``optimizer.step()`` after the last requested step when the whole process
    should end there (``opguard record --steps N``)."""


def prepare_run_dir(path: Path, overwrite: bool) -> None:
    """Creates ``path`` for a new run. Refuses a non-empty directory unless it is an earlier
    OpGuard run and ``overwrite`` is set: OpGuard never deletes what it did not write."""
    if path.exists() and not path.is_dir():
        raise TraceError(f"{path}: exists and is not a directory")
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise TraceError(
                f"{path}: output directory is not empty (use --overwrite to replace a run)"
            )
        if not (path / schema.META_FILE).exists():
            raise TraceError(f"{path}: not an OpGuard run, refusing to overwrite it")
        shutil.rmtree(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".opguard-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise TraceError(f"{path}: cannot write the output directory ({exc.strerror})") from None


def _devices() -> list[str]:
    devices = [f"cpu: {platform.processor() or platform.machine()}"]
    if torch.cuda.is_available():
        devices += [
            f"cuda:{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())
        ]
    return devices


class RecordingSession:
    """Records this process into ``run_dir/rank-K`` until :meth:`close`: every op (or those
    of a window of steps, or of the last steps only), and the training state at every step
    boundary (``steps_only``: that alone)."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        exit_after_steps: bool = False,
        command: list[str] | None = None,
        rank: int | None = None,
        **options: Any,
    ) -> None:
        """``options``: the fields of :class:`RecordOptions` (``opguard record``'s options, by
        name); what cannot be recorded raises :class:`~opguard.record_options.OptionError`."""
        chosen = RecordOptions(**options)
        chosen.check()
        self.run_dir = Path(run_dir)
        self.rank = env_rank() if rank is None else rank
        # The run directory (and meta.json) belong to whoever prepared it: opguard record
        # before torchrun, else rank 0.
        self._prepared = prepared_by_parent()
        self._distributed: dict[str, Any] | None = None
        self.steps_limit = chosen.steps
        self.exit_after_steps = exit_after_steps
        self.command = command or [sys.executable, *sys.argv]
        self.failure: dict[str, Any] | None = None
        self.state = StepState()
        self.steps_only = chosen.steps_only
        self.first_step = chosen.first_step
        self.window = chosen.window
        self.keep_last = chosen.keep_last
        self._op_level: OpLevel | None = None
        self._step_records: StepRecorder | None = None
        self._perturbing: PerturbingMode | None = None  # --perturb-rounding: a control run
        self._gc_threshold: tuple[int, ...] | None = None
        self._renumber_refused = False
        self._overwrite = chosen.overwrite
        self.capture = chosen.capture
        self.capture_limit = chosen.capture_limit
        self._capturer: Capturer | None = None
        self._recorder: OpRecorder | None = None
        self._hooks: list[Any] = []
        self._stopped_reason: str | None = None
        # The code beneath the recorded program, where `opguard record` runs it from (launch.py)
        self.launcher: frozenset[CodeType] = frozenset()
        self.eager = chosen.eager
        self.verify_inputs = chosen.verify_inputs
        self.perturb_rounding = chosen.perturb_rounding
        self._compile_settings = compiled.CompileSettings(
            chosen.eager, regions=not chosen.steps_only
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> RecordingSession:
        global _active
        if _active is not None:
            raise RuntimeError("opguard: a recording is already active in this process")
        started = time.time()
        if self._owns_meta:
            prepare_run_dir(self.run_dir, self._overwrite)
        elif not self._prepared:
            wait_for_rank0(self.run_dir, started)
        self.meta = self._initial_meta()
        if self._owns_meta:
            write_meta(self.run_dir, self.meta)
        self.writer = TraceWriter(
            self.run_dir / schema.rank_dir_name(self.rank),
            start_info={
                "rank": self.rank,
                "world_size": self.meta["world_size"],
                "pid": os.getpid(),
                "started": started,
                "devices": self.meta["devices"],
                # the node whose disk holds this trace (a job's ranks spread over nodes'
                # local disks are one run: opguard.distributed finds each where it is)
                "host": socket.gethostname(),
            },
        )
        self.writer.put_info(ENVIRONMENT, self.meta[ENVIRONMENT])
        self.state.step = self.first_step
        self._step_records = StepRecorder(self.writer, self._on_step_failure)
        self._step_records.start()
        if self.perturb_rounding is not None:  # beneath the op recorder: it reads the results
            self._perturbing = PerturbingMode(self.perturb_rounding)
            self._perturbing.__enter__()
        if not self.steps_only:
            self._start_op_level()
        self._hooks = [
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
        ]
        catch_sigterm()
        self._compile_settings.apply()
        if self._op_level is not None:
            self._op_level.at_step(self.state.step)
        _active = self
        return self

    def _start_op_level(self) -> None:
        """The op recorder, its GPU activity collection and the settings it runs best with."""
        self._recorder = OpRecorder(self.writer, self.state, self._on_failure, self.launcher)
        self._recorder.verify_inputs = self.verify_inputs
        if self.capture is not None:
            self._capturer = Capturer(self.capture, self.capture_limit, self.writer)
            self._recorder.capture = self._capturer
        self._start_gpu_activity()
        # The heap that exists now (model, libraries) is moved out of the cyclic collector's
        # view while recording: the recorder allocates a few small objects per op, and full
        # collections scanning the whole heap for them cost a third of its time. Numerics are
        # untouched; cycles that become garbage among those objects wait until close().
        gc.freeze()
        # GPU records wait as Python objects until their fingerprints land (hundreds of ops):
        # at the default threshold the collector's young passes ran ~70 times per GPT-2 step,
        # promoting and rescanning them (~20 ms per step). Collections are made rarer, not
        # skipped; the thresholds are restored at close().
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(
            max(self._gc_threshold[0], RECORDING_GC_THRESHOLD), *self._gc_threshold[1:]
        )
        compiled.register(OpRecorder)
        self._op_level = OpLevel(self._recorder, self.writer, self.window, self.keep_last)

    def close(
        self, status: str = "finished", exit_code: int | None = None, error: str | None = None
    ) -> None:
        """Ends the recording: flushes the trace and writes how it ended. After a SIGTERM
        (status ``terminated``) the process then dies of it, as it would have unrecorded."""
        global _active
        if self._step_records is None:
            return
        step_records, self._step_records = self._step_records, None
        step_records.close()
        recorder, self._recorder = self._recorder, None
        if self._op_level is not None:
            self._op_level.close()
        if self._perturbing is not None:
            self._perturbing.close()
            self._perturbing = None
        release_sigterm()
        compiled.attach(None)
        self._compile_settings.restore()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            gc.unfreeze()
        self._note_distributed()
        if self._distributed is not None:
            self.writer.put_info("distributed", self._distributed)
        # Settings the script made after recording started, and the packages of its call sites.
        files = recorder.call_site_files() if recorder is not None else set()
        self.meta[ENVIRONMENT] = environment(files)
        self.writer.put_info(ENVIRONMENT, self.meta[ENVIRONMENT])
        if self._capturer is not None:
            self._report_capture(self._capturer)
        for hook in self._hooks:
            hook.remove()
        _active = None
        if self._stopped_reason is not None and status == "finished":
            status = "stopped"
        ops = recorder.next_index if recorder is not None else 0
        end = {
            "status": status,
            "ops": ops,
            "steps": self.state.step,
            "exit_code": exit_code,
            "error": error,
            "stopped": self._stopped_reason,
        }
        write_error = self.writer.close(end)
        if write_error is not None and self.failure is None:  # the last batch failed
            self._on_failure(ops, TraceWriteFailed(self.writer.failure_message()))
        if self._owns_meta:
            self._finish_meta(end)
        if self.rank == 0 and self.window is not None:
            missed = unreached_window(self.window, self.state.step)
            if missed:
                print(f"opguard: {missed}", file=sys.stderr)
        if status == TERMINATED:
            die_of_sigterm()

    def _finish_meta(self, end: dict[str, Any]) -> None:
        """Adds how the run ended to ``meta.json``; a disk too full even for that is said on
        stderr (the trace's own end record says it too, when it could be written)."""
        try:
            self.meta = {
                **read_meta(self.run_dir),
                **end,
                ENVIRONMENT: self.meta[ENVIRONMENT],
                "ended": time.time(),
                "recorder_failure": self.failure and self.failure["error"],
            }
            write_meta(self.run_dir, self.meta)
        except (OSError, TraceError) as exc:
            print(f"opguard: could not complete {schema.META_FILE}: {exc}", file=sys.stderr)

    def _report_capture(self, capturer: Capturer) -> None:
        """Writes what was captured into the trace, and says on stderr when the cap stopped
        it or when the SPEC chose no op: evidence the person asked for and will not find."""
        summary = capturer.summary()
        self.writer.put_info("capture", summary)
        if not capturer.matched:  # a typo, or a line or index the run never reached
            print(
                f"opguard: capture {capturer.spec.text} matched no op: nothing was captured "
                "(opguard show RUN --ops START:END lists the ops' indices, names and call sites)",
                file=sys.stderr,
            )
        if summary["limit_hit"]:
            op, direction, slot = summary["first_skipped"]
            print(
                f"opguard: capture limit {format_size(self.capture_limit)} reached: "
                f"{summary['skipped']} tensor(s) not captured, the first {direction} {slot} "
                f"of op {op} (raise --capture-limit)",
                file=sys.stderr,
            )

    @property
    def _owns_meta(self) -> bool:
        return self.rank == 0 and not self._prepared

    def _note_distributed(self) -> None:
        """Keeps the process group's backend and world size while it exists: scripts often
        destroy it before the session closes."""
        if self._distributed is None:
            self._distributed = distributed_info()

    def __enter__(self) -> RecordingSession:
        return self.start()

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, StepLimitReached):
            self.close("finished")
        elif isinstance(exc, Terminated):
            self.close(TERMINATED, exc.code, "terminated by SIGTERM")  # type: ignore[arg-type]
        else:
            self.close("failed", error=f"{type(exc).__name__}: {exc}")

    def _start_gpu_activity(self) -> None:
        """On a machine with a GPU, collects each op's kernels through CUPTI (unless
        ``OPGUARD_KERNELS=0``: it costs under 1% of a step in bench/overhead.py);
        says in the trace what GPU recording could and could not use."""
        if not torch.cuda.is_available():
            return
        fingerprints = _C.cuda_status()
        if os.environ.get("OPGUARD_KERNELS", "1") == "0":
            activity, reason = None, "kernel collection turned off (OPGUARD_KERNELS=0)"
        else:
            activity, reason = KernelActivity.start()
        if self._recorder is not None and activity is not None:
            self._recorder.kernels = activity
            self.writer.poll_kernels = activity.drain
        self.writer.put_info(
            "gpu",
            {
                "fingerprints": fingerprints[1],
                "kernels": reason if activity else None,
                "kernels_unavailable": None if activity else reason,
            },
        )
        if activity is None:
            print(f"opguard: GPU kernels will not be recorded: {reason}", file=sys.stderr)

    # -- steps ----------------------------------------------------------------------------

    def end_step(self) -> None:
        """The step in progress ended: its step-level record is written, the next begins."""
        self._note_distributed()
        if self._step_records is not None:
            self._step_records.end_step(self.state.step)
        self.state.step += 1
        if self._recorder is not None:
            self._recorder.forget_step()
        if self._op_level is not None:
            self._op_level.step_ended(self._recorder.next_index if self._recorder else 0)
        self._step_changed()

    def set_step(self, step: int) -> None:
        """The step now starting is number ``step`` (``opguard.step(n)``: a script resumed
        from a checkpoint). Numbers only grow along a trace: going back is refused, with one
        line on stderr, and the numbering goes on as it was."""
        if step == self.state.step:
            return
        if step < self.state.step:
            if not self._renumber_refused:
                self._renumber_refused = True
                print(
                    f"opguard: opguard.step({step}) ignored: step {self.state.step} has begun "
                    "and step numbers only grow along a recording",
                    file=sys.stderr,
                )
            return
        self.state.step = step
        self._step_changed()

    def _step_changed(self) -> None:
        """A new step number: op-level recording follows the window; the step limit ends the
        recording (and with ``opguard record``, the run)."""
        if self._op_level is not None:
            self._op_level.at_step(self.state.step)
        if self.steps_limit is not None and self.state.step >= self.steps_limit:
            self._stop_recording(f"step limit {self.steps_limit} reached")
            if self.exit_after_steps:
                raise StepLimitReached(0)

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.state.in_optimizer = True
        if self._step_records is not None:
            self._step_records.gradients(optimizer)

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.state.in_optimizer = False
        if self._step_records is not None:
            self._step_records.updated(optimizer)
        self.end_step()

    def _stop_recording(self, reason: str) -> None:
        if self._stopped_reason is not None:
            return
        self._stopped_reason = reason
        if self._recorder is not None:
            self._recorder.stop()
        if self._step_records is not None:
            self._step_records.stop()

    # -- failures -------------------------------------------------------------------------

    def _on_step_failure(self, exc: BaseException) -> None:
        """Step-level recording failed: it stops (ops go on being recorded, the training
        goes on), and the trace and stderr say where."""
        failure = {"at_step": self.state.step, "error": f"{type(exc).__name__}: {exc}"}
        self.writer.put_info("step_failure", failure)
        print(
            f"opguard: step-level recording stopped at step {self.state.step}: "
            f"{failure['error']} (training continues)",
            file=sys.stderr,
        )

    def _on_failure(self, index: int, exc: BaseException) -> None:
        self.failure = failure_info(index, exc)
        self.writer.put_info("failure", self.failure)
        print(
            f"opguard: recording stopped at op {index}: {self.failure['error']} "
            "(training continues unrecorded)",
            file=sys.stderr,
        )

    # -- metadata -------------------------------------------------------------------------

    def _initial_meta(self) -> dict[str, Any]:
        return {
            "schema": schema.SCHEMA_VERSION,
            "opguard": __version__,
            "command": self.command,
            "argv": list(sys.argv),
            "cwd": os.getcwd(),
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "devices": _devices(),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "env": recorded_environment(),
            ENVIRONMENT: environment(),
            "steps_limit": self.steps_limit,
            # which steps have op-level records (opguard record --steps-only, --window,
            # --keep-last) and the first step's number (--first-step)
            "steps_only": self.steps_only,
            "window": list(self.window) if self.window is not None else None,
            "keep_last": self.keep_last,
            "first_step": self.first_step,
            # "disabled": recorded with torch.compile turned off (opguard record --eager)
            "torch_compile": "disabled" if self.eager else "enabled",
            "verify_inputs": self.verify_inputs,
            **(
                {"capture": {"spec": self.capture.text, "limit": self.capture_limit}}
                if self.capture is not None
                else {}
            ),
            "started": time.time(),
            "status": "running",
        }


def record(
    run_dir: str | Path,
    *,
    steps: int | None = None,
    overwrite: bool = False,
    rank: int | None = None,
    eager: bool = False,
    verify_inputs: bool = False,
    capture: str | None = None,
    capture_limit: int = DEFAULT_LIMIT,
    steps_only: bool = False,
    first_step: int = 0,
    window: tuple[int, int] | None = None,
    keep_last: int | None = None,
    perturb_rounding: int | None = None,
) -> RecordingSession:
    """Records every op run inside the ``with`` block into ``run_dir``, and the training state
    at every step boundary.

    ``steps`` stops recording (not the training) when step ``steps`` is reached (steps are
    numbered from ``first_step``, 0 by default, or as ``opguard.step(n)`` says). ``rank``
    (default: ``RANK`` from the environment) picks ``run_dir/rank-K``; in a job of several
    processes rank 0 prepares ``run_dir`` and the others wait for it. ``eager`` turns
    ``torch.compile`` off while recording (compiled functions run their Python code).
    ``verify_inputs`` fingerprints every input when it is read, so writes no recorded op made
    show up (slower). ``capture`` (a SPEC, see :mod:`opguard.capture_spec`) also stores the
    full tensors of those ops, up to ``capture_limit`` bytes per rank.

    Long runs: ``steps_only`` records no op, only the step-level state; ``window=(START,
    STOP)`` records ops only in steps START to STOP-1; ``keep_last=N`` keeps the ops of the
    last N completed steps only. Options that cannot go together raise ``ValueError``.

    ``perturb_rounding=SEED`` makes this run a control for ``opguard diff --tolerant --noise``:
    it changes the run's numbers by design (:mod:`opguard.recorder.perturb`).
    """
    return RecordingSession(
        run_dir,
        steps=steps,
        overwrite=overwrite,
        rank=rank,
        eager=eager,
        verify_inputs=verify_inputs,
        capture=CaptureSpec.parse(capture) if capture is not None else None,
        capture_limit=capture_limit,
        steps_only=steps_only,
        first_step=first_step,
        window=window,
        keep_last=keep_last,
        perturb_rounding=perturb_rounding,
    )


def step(n: int | None = None) -> None:
    """Without ``n``: marks the end of a training step, in custom loops that have no
    ``optimizer.step()``. With ``n``: the step now starting is number ``n`` (a script resumed
    from a checkpoint at step ``n`` says so, and its steps then carry the original run's
    numbers); no step ends."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"opguard.step(n) takes a step number (an int, 0 or more), not {n!r}")
    if _active is None:
        return
    if n is None:
        _active.end_step()
    else:
        _active.set_step(n)
