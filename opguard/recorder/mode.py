"""The dispatch-mode recorder: sees every ATen op and writes one record per op.

It never changes what an op computes: the op runs exactly once, on the caller's arguments, and
everything the recorder does happens before or after, reading tensor memory through raw
pointers. Any failure inside the recorder disables it (the training goes on) and is written to
the trace.
"""

from __future__ import annotations

import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _C
from ..store import schema
from ..store.captures import INPUT, OUTPUT
from .arguments import generator_fingerprint
from .callsite import CallSites
from .capture import Capturer
from .collectives import wait
from .kernels import KernelActivity
from .ops import OpInfo, op_info
from .tensors import HAND_BACK, RUN_AS_IS, entry_recorder, subclass_call

_BACKWARD = schema.PHASES.index("backward")
_OPTIMIZER = schema.PHASES.index("optimizer")
_FORWARD = schema.PHASES.index("forward")
_OTHER = schema.PHASES.index("other")

# Share of the GPU result rings in use at which the trace writer packs the records holding them
# (it writes the trace at the start of each backward pass, or by the number of records queued).
RING_DRAIN = 0.5

# Bookkeeping ops that compute nothing: record_function markers carry object addresses that
# differ between runs of the same program.
UNRECORDED_NAMESPACES = frozenset({"profiler"})


def skip_dynamo_recursively(code: CodeType) -> bool:
    """Has Dynamo skip frames of ``code`` and every frame they call, as
    ``torch._disable_dynamo(recursive=True)`` does for a function it wraps; False when this
    torch has no such mark (its frame execution strategies are private)."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
    except ImportError:
        return False
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return True


class TraceWriteFailed(RuntimeError):
    """The trace writer could not write (a full disk): recording stops, training goes on."""


class StepState:
    """Step counter and phase flags shared by the recorder and the optimizer hooks."""

    def __init__(self) -> None:
        self.step = 0
        self.in_optimizer = False


class OpRecorder(TorchDispatchMode):
    def __init__(
        self,
        writer: Any,
        steps: StepState,
        on_failure: Callable[[int, BaseException], None],
        launcher: frozenset[CodeType] = frozenset(),
    ) -> None:
        """``launcher``: the code beneath the recorded program (:class:`CallSites`)."""
        super().__init__()
        self._writer = writer
        self._thread = threading.get_ident()  # the training's thread: it calls backward()
        writer.pack_deferred = _C.OpRecord.pack_all  # the GPU records it defers (_after)
        self._sites = CallSites(writer, launcher)
        self._on_failure = on_failure
        self._infos: dict[Any, OpInfo] = {}
        # ATen ops' infos by id(): an OpOverload's hash is a Python call (the op itself stays
        # alive as a key of _infos)
        self._op_infos: dict[int, OpInfo] = {}
        # Each tensor's entry, producer and known fingerprint (native: per tensor, per op).
        self._entries = entry_recorder()
        # The per-op path, phase and call-site bookkeeping included (native: one call per op).
        self._calls = _C.CallRecorder(
            entries=self._entries,
            walker=self._sites.walker,
            writer=writer,
            steps=steps,
            autograd=(
                torch._C._current_autograd_node,
                torch.is_grad_enabled,
                torch._C._autograd._get_sequence_nr,
            ),
            phases=(_FORWARD, _BACKWARD, _OPTIMIZER, _OTHER),
            ring_drain=RING_DRAIN,
            fail=weakref.WeakMethod(self.fail),  # a strong one would make a cycle GC can't see
        )
        self._in_flight = False
        self._kernels: KernelActivity | None = None
        self.capture: Capturer | None = None  # set by record --capture
        self.active = True  # recording ops (False: passing them through, paused or stopped)
        self.stopped = False  # for good: a failure, or the step limit

    # -- dispatch -------------------------------------------------------------------------

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Whether torch wraps ``__torch_dispatch__`` in ``torch._disable_dynamo``, so that
        Dynamo, running while a compiled function runs, never compiles it or anything it calls.
        Marking its code object skipped by Dynamo, for itself and what it calls, does the same
        inside the interpreter's frame hook; the wrapper cost a few Python calls per op (~3% of
        a recorded forward pass's host time). It stays where this torch cannot mark code."""
        dispatch = cls.__dict__.get("__torch_dispatch__")
        return dispatch is None or not skip_dynamo_recursively(dispatch.__code__)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Lets ``torch.compile`` compile while recording: without this, Dynamo sees a user
        dispatch mode and silently runs every compiled function eagerly, so the recorded run
        would compute something else than the unrecorded one. Compiled regions come back to
        this mode as units (:mod:`opguard.recorder.compiled`)."""
        return True

    @property
    def call_sites(self) -> CallSites:
        """The trace's call sites: which code is the user's, and interned sites."""
        return self._sites

    @property
    def next_index(self) -> int:
        """The index the next recorded op gets (ops recorded so far)."""
        return int(self._calls.next_index)

    @property
    def kernels(self) -> KernelActivity | None:
        """CUPTI's collection of GPU activity, when on: launches are tied to ops."""
        return self._kernels

    @kernels.setter
    def kernels(self, activity: KernelActivity | None) -> None:
        self._kernels = activity
        self._calls.kernels = activity is not None

    @property
    def region_phase(self) -> int | None:
        """The phase of ops run inside a compiled region's forward graph, where autograd has
        turned gradients off (None: read it from the grad mode)."""
        phase = int(self._calls.region_phase)
        return None if phase < 0 else phase

    @region_phase.setter
    def region_phase(self, phase: int | None) -> None:
        self._calls.region_phase = -1 if phase is None else phase

    @property
    def verify_inputs(self) -> bool:
        """Fingerprint every input again instead of reusing what its producer wrote: finds
        writes the dispatcher never saw (NumPy views, extensions writing through pointers),
        which leave the version counter alone."""
        return bool(self._calls.verify)

    @verify_inputs.setter
    def verify_inputs(self, verify: bool) -> None:
        self._calls.verify = verify

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        info = self._op_infos.get(id(func))
        if not self.active or (info is None and func.namespace in UNRECORDED_NAMESPACES):
            return func(*args, **kwargs)
        subclass = subclass_call(types)
        if subclass == RUN_AS_IS:  # unrecorded
            return func(*args, **kwargs)
        if subclass == HAND_BACK:  # the plain ops it runs come back and are recorded
            return NotImplemented
        if info is None:
            try:
                info = self.info_for(func, lambda: op_info(func, self._writer.intern_name))
            except Exception as exc:
                self.fail(exc)
                return func(*args, **kwargs)
            self._op_infos[id(func)] = info
        try:
            caller: FrameType | None = sys._getframe(1)  # the frame that ran the op
        except ValueError:
            # None: an autograd device thread (a GPU's backward) calls ops from C++ alone while
            # the training's thread waits in backward(): its stack is the op's call site, as
            # it is where the backward runs on that thread (the CPU's)
            caller = sys._current_frames().get(self._thread)
        if info.plain and self.capture is None and self._writer.error is None:
            return self._calls.call(info.plan, info.name_id, info.run, args, kwargs, caller)
        if not info.is_collective:
            return self.record_call(info, func, args, kwargs, caller=caller)
        # An output still in flight is fingerprinted by its first reader, not here.
        return self.record_call(
            info,
            func,
            args,
            kwargs,
            in_flight=lambda out: not wait(func.namespace, func._opname, out),
            caller=caller,
        )

    def record_call(
        self,
        info: OpInfo,
        run: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        *,
        in_flight: Callable[[Any], bool] | None = None,
        arguments: list[list[Any]] | None = None,
        nested: bool = False,
        caller: FrameType | None = None,
        origins: list[int] | None = None,
    ) -> Any:
        """Runs ``run(*args, **kwargs)`` once and records it as one op described by ``info``:
        an ATen op, or a unit the dispatcher does not see (a compiled region, a generated
        kernel). ``arguments``: extra non-tensor arguments to record (e.g. a code digest).
        ``nested``: ``run`` records ops of its own (a compiled region's kernels), which come
        first in the trace and own their GPU work. ``caller``: the frame that ran the op, where
        the walk for its call site starts (the current frame when None). ``origins``: call-site
        ids of the source lines a generated kernel was made from."""
        kernels = self.kernels
        call = (info, run, args, kwargs, in_flight, arguments, nested, caller, origins)
        if kernels is None:
            return self._record_call(*call)
        # The recorder's own GPU work (fingerprints, captures) is never reported; GPU work the
        # thread launches after this call, outside any op, follows the last op recorded.
        kernels.enter()
        try:
            return self._record_call(*call)
        finally:
            kernels.leave(self.next_index - 1)

    def _record_call(
        self,
        info: OpInfo,
        run: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        in_flight: Callable[[Any], bool] | None,
        arguments: list[list[Any]] | None,
        nested: bool,
        caller: FrameType | None,
        origins: list[int] | None,
    ) -> Any:
        try:
            pending = self._before(info, args, kwargs, nested)
            if arguments:
                pending[3].extend(arguments)
        except Exception as exc:
            self.fail(exc)
            return run(*args, **kwargs)
        if self.kernels is None or nested:
            out = run(*args, **kwargs)
        else:  # GPU work launched by the op is tied to its index
            self.kernels.push(self.next_index)
            try:
                out = run(*args, **kwargs)
            finally:
                self.kernels.pop()
        self._in_flight = in_flight is not None and in_flight(out)
        try:
            self._after(pending, out, caller, origins)
        except Exception as exc:
            self.fail(exc)
        return out

    def fail(self, exc: BaseException) -> None:
        """Stops recording (the training goes on) and reports why."""
        self.stop()
        self._entries.discard()
        self._on_failure(self.next_index, exc)

    def stop(self) -> None:
        """Records no more ops; GPU work launched from now on is no longer reported either."""
        self.active = False
        self.stopped = True
        if self.kernels is not None:
            self.kernels.stop_watching()

    def pause(self) -> None:
        """Records no op until :meth:`resume` (outside an op-level window), and has CUPTI
        collect nothing meanwhile."""
        self.active = False
        if self.kernels is not None:
            self.kernels.pause()

    def resume(self) -> None:
        """Records ops again after :meth:`pause`, unless recording stopped for good."""
        if self.stopped:
            return
        self.active = True
        if self.kernels is not None:
            self.kernels.resume()

    def unwritten(self, tensor: torch.Tensor) -> None:
        """``tensor`` holds memory compiled code allocated outside the dispatcher, which no
        recorded op has written yet (:class:`~opguard.recorder.compiled.Allocator`)."""
        try:
            self._entries.unwritten(tensor)
        except Exception as exc:
            self.fail(exc)

    def intern_name(self, name: str) -> int:
        return int(self._writer.intern_name(name))

    def call_site_files(self) -> set[str]:
        """The files of the call sites recorded so far (whose packages the run's environment
        names)."""
        return self._sites.files()

    def info_for(self, key: Any, build: Callable[[], OpInfo]) -> OpInfo:
        """The cached :class:`OpInfo` of ``key`` (an ATen overload, a compiled region, a
        generated kernel), built on first use: op names are interned per trace."""
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = build()
        return info

    def forget_step(self) -> None:
        """Drops per-step state at a step boundary: the forward call sites of backward ops."""
        self._calls.forget_step()

    # -- before the op: inputs, arguments, RNG ----------------------------------------------

    def _before(self, info: OpInfo, args: tuple, kwargs: dict, nested: bool) -> tuple:
        if self._writer.error is not None:
            raise TraceWriteFailed(self._writer.failure_message())
        # A unit with ops of its own inside gets its index only after them: not captured.
        capturing = (
            not nested
            and self.capture is not None
            and self.capture.wants(self.next_index, info.name, self._site_now)
        )
        op, written, arguments, taken = info.plan.inputs(
            self._entries, args, kwargs, self.verify_inputs, capturing
        )
        if taken:
            self._capture(self.next_index, INPUT, taken)
        rng = self._rng_state(kwargs.get("generator"), args, kwargs) if info.is_random else None
        return info, op, written, arguments, rng, capturing

    def _capture(self, index: int, side: str, taken: list[tuple[int, str, Any]]) -> None:
        """Captures the tensors an ``OpPlan`` walk chose (with ``--capture``): (position, slot,
        tensor) of op ``index``'s inputs or outputs."""
        if self.capture is not None:
            for position, slot, tensor in taken:
                self.capture.take(index, side, position, slot, tensor)

    def _site_now(self) -> tuple[str, int] | None:
        """The (file, line) the op will be recorded at, looked up before it runs (for
        ``--capture FILE:LINE``): a backward op's is its forward op's."""
        located = None
        node = torch._C._current_autograd_node()
        if node is not None:
            located = self._calls.forward_site(node._sequence_nr())
        if located is None:
            located = self._sites.capture(None)
        return self._sites.location(located[0]) if located is not None else None

    def _rng_state(
        self, generator: torch.Generator | None, args: tuple, kwargs: dict
    ) -> int | None:
        """Fingerprint of the generator a random op draws from: the explicit one, else the
        default generator of the op's device."""
        if generator is None:
            generator = _default_generator(args, kwargs)
        return generator_fingerprint(generator)

    # -- after the op: outputs, call site, record ------------------------------------------

    def _after(
        self, pending: tuple, out: Any, caller: FrameType | None, origins: list[int] | None
    ) -> None:
        info, op, written, arguments, rng, capturing = pending
        index = self.next_index
        taken = self._calls.finish(
            info.plan,
            op,
            out,
            written,
            info.name_id,
            arguments,
            rng,
            self._in_flight,
            capturing,
            caller,
            origins,
        )
        if taken:
            self._capture(index, OUTPUT, taken)


def failure_info(index: int, exc: BaseException) -> dict[str, Any]:
    return {
        "at_op": index,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


def _default_generator(args: tuple, kwargs: dict) -> torch.Generator:
    """The default generator of an op's device: its first tensor argument's, else its
    ``device`` argument's, else the CPU's."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            # is_cuda and get_device() cost less than building the tensor's torch.device
            if value.is_cuda:
                return torch.cuda.default_generators[value.get_device()]
            return torch.default_generator
    device = kwargs.get("device")
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        return torch.cuda.default_generators[device.index or 0]
    return torch.default_generator
