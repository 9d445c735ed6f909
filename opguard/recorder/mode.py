"""The dispatch-mode recorder: sees every ATen op and writes one record per op.

It never changes what an op computes: the op runs exactly once, on the caller's arguments, and
everything the recorder does happens before or after, reading tensor memory through raw
pointers. Any failure inside the recorder disables it (the training goes on) and is written to
the trace.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _C
from ..store import schema
from ..store.captures import INPUT, OUTPUT
from ..store.writer import packb as _pack_head
from .arguments import encode, generator_fingerprint
from .callsite import CallSites
from .capture import Capturer
from .collectives import is_collective, wait
from .kernels import KernelActivity
from .ops import OpInfo, op_info
from .tensors import entry_recorder

_BACKWARD = schema.PHASES.index("backward")
_OPTIMIZER = schema.PHASES.index("optimizer")
_FORWARD = schema.PHASES.index("forward")
_OTHER = schema.PHASES.index("other")
# How an output gets its content fields (csrc/provenance.h, OutputKind).
_READ, _UNINITIALIZED, _IN_FLIGHT = _C.OUTPUT_READ, _C.OUTPUT_UNINITIALIZED, _C.OUTPUT_IN_FLIGHT
_VIEW, _VIEW_OF_UNINITIALIZED = _C.OUTPUT_VIEW, _C.OUTPUT_VIEW_OF_UNINITIALIZED

# Share of the GPU result rings in use at which the trace writer is woken to collect them (it is
# otherwise woken at the start of each backward pass, or by the number of records queued).
RING_DRAIN = 0.5

# Bookkeeping ops that compute nothing: record_function markers carry object addresses that
# differ between runs of the same program.
UNRECORDED_NAMESPACES = frozenset({"profiler"})
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
DATALESS_TENSORS = (FakeTensor, FunctionalTensor)


class TraceWriteFailed(RuntimeError):
    """The trace writer could not write (a full disk): recording stops, training goes on."""


class StepState:
    """Step counter and phase flags shared by the recorder and the optimizer hooks."""

    def __init__(self) -> None:
        self.step = 0
        self.in_optimizer = False


class OpRecorder(TorchDispatchMode):
    def __init__(
        self, writer: Any, steps: StepState, on_failure: Callable[[int, BaseException], None]
    ) -> None:
        super().__init__()
        self._writer = writer
        writer.pack_deferred = _C.OpRecord.pack_all  # the GPU records it defers (_after)
        self._steps = steps
        self._sites = CallSites(writer)
        self._on_failure = on_failure
        self._infos: dict[Any, OpInfo] = {}
        # Each tensor's entry, producer and known fingerprint (native: per tensor, per op).
        self._entries = entry_recorder()
        self._op = _C.OpRecord()  # the entries of the op being recorded
        self._forward_sites: dict[int, tuple[int, int | None, int | None]] = {}
        self._last_sequence_nr = -1
        self._in_backward = False  # the last op recorded ran in a backward pass
        self._in_flight = False
        self.next_index = 0
        self.kernels: KernelActivity | None = None  # set when CUPTI collects GPU activity
        # The phase of ops run inside a compiled region's forward graph, where autograd has
        # turned gradients off (None: read it from the grad mode).
        self.region_phase: int | None = None
        self.capture: Capturer | None = None  # set by record --capture
        self._capturing = False  # whether the current op's tensors are captured
        self.active = True
        # Fingerprint every input again instead of reusing what its producer wrote: finds
        # writes the dispatcher never saw (NumPy views, extensions writing through pointers),
        # which leave the version counter alone.
        self.verify_inputs = False

    # -- dispatch -------------------------------------------------------------------------

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Lets ``torch.compile`` compile while recording: without this, Dynamo sees a user
        dispatch mode and silently runs every compiled function eagerly, so the recorded run
        would compute something else than the unrecorded one. Compiled regions come back to
        this mode as units (:mod:`opguard.recorder.compiled`)."""
        return True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        info = self._infos.get(func)
        if not self.active or (info is None and func.namespace in UNRECORDED_NAMESPACES):
            return func(*args, **kwargs)
        for t in types:
            if t not in PLAIN_TENSORS:
                if any(issubclass(t, DATALESS_TENSORS) for t in types):
                    # Fake and functional tensors (DTensor's sharding propagation, tracing)
                    # hold no data, and refuse to run while another mode is active: run them
                    # unrecorded.
                    return func(*args, **kwargs)
                # A tensor subclass (the functional collectives' AsyncCollectiveTensor,
                # DTensor) may hold no storage to read: let it unwrap itself; the ops it runs
                # on plain tensors come back through this mode and are recorded.
                return NotImplemented
        if info is None:
            try:
                info = self.info_for(func, lambda: op_info(func, self._writer.intern_name))
            except Exception as exc:
                self.fail(exc)
                return func(*args, **kwargs)
        if not is_collective(func.namespace):
            return self.record_call(info, func, args, kwargs)
        # An output still in flight is fingerprinted by its first reader, not here.
        return self.record_call(
            info,
            func,
            args,
            kwargs,
            in_flight=lambda out: not wait(func.namespace, func._opname, out),
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
    ) -> Any:
        """Runs ``run(*args, **kwargs)`` once and records it as one op described by ``info``:
        an ATen op, or a unit the dispatcher does not see (a compiled region, a generated
        kernel). ``arguments``: extra non-tensor arguments to record (e.g. a code digest).
        ``nested``: ``run`` records ops of its own (a compiled region's kernels), which come
        first in the trace and own their GPU work."""
        kernels = self.kernels
        if kernels is None:
            return self._record_call(info, run, args, kwargs, in_flight, arguments, nested)
        # The recorder's own GPU work (fingerprints, captures) is never reported; GPU work the
        # thread launches after this call, outside any op, follows the last op recorded.
        kernels.enter()
        try:
            return self._record_call(info, run, args, kwargs, in_flight, arguments, nested)
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
            self._after(pending, out)
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
        if self.kernels is not None:
            self.kernels.stop_watching()

    def intern_name(self, name: str) -> int:
        return int(self._writer.intern_name(name))

    def info_for(self, key: Any, build: Callable[[], OpInfo]) -> OpInfo:
        """The cached :class:`OpInfo` of ``key`` (an ATen overload, a compiled region, a
        generated kernel), built on first use: op names are interned per trace."""
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = build()
        return info

    def forget_step(self) -> None:
        """Drops per-step state at a step boundary: the forward call sites of backward ops."""
        self._forward_sites.clear()

    # -- before the op: inputs, arguments, RNG ----------------------------------------------

    def _before(self, info: OpInfo, args: tuple, kwargs: dict, nested: bool) -> tuple:
        if self._writer.error is not None:
            raise TraceWriteFailed(self._writer.failure_message())
        self._entries.settle()
        self._op = op = _C.OpRecord()
        # A unit with ops of its own inside gets its index only after them: not captured.
        self._capturing = (
            not nested
            and self.capture is not None
            and self.capture.wants(self.next_index, info.name, self._site_now)
        )
        written: list[tuple[str, torch.Tensor]] = []
        arguments: list[list[Any]] = []
        names = info.arg_names
        for position, value in enumerate(args):
            name = names[position] if position < len(names) else str(position)
            self._classify(info, name, value, written, arguments)
        for name, value in kwargs.items():
            self._classify(info, name, value, written, arguments)
        if info.defaults:
            given = len(args)
            arguments.extend(
                [name, value]
                for name, value, position in info.defaults
                if position >= given and name not in kwargs
            )
        rng = self._rng_state(kwargs.get("generator"), args, kwargs) if info.is_random else None
        self._entries.flush()  # the inputs' GPU fingerprints run before the op can change them
        if not info.is_view:
            # Only a view's outputs need their base. Holding it while the op runs would keep a
            # compiled region's first input alive after Inductor frees it (it clears the
            # argument list as it goes).
            op.drop_base()
        return info, op, written, arguments, rng, self._capturing

    def _classify(
        self,
        info: OpInfo,
        name: str,
        value: Any,
        written: list[tuple[str, torch.Tensor]],
        arguments: list[list[Any]],
    ) -> None:
        if isinstance(value, torch.Tensor):
            if name in info.written_args:
                written.append((name, value))
            if name not in info.out_args:
                self._add_input(name, value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            # A _foreach_ op's lists hold one tensor per parameter: decide once per list.
            if name in info.written_args:
                written.extend(
                    (f"{name}[{k}]", item)
                    for k, item in enumerate(value)
                    if isinstance(item, torch.Tensor)
                )
            if name in info.out_args:
                return
            if self._capturing or info.is_view:  # captures and views' bases: one at a time
                for k, item in enumerate(value):
                    if isinstance(item, torch.Tensor):
                        self._add_input(f"{name}[{k}]", item)
            else:
                self._entries.inputs(self._op, name, value, self.verify_inputs)
        elif name != "generator":
            arguments.append([name, encode(value)])

    def _add_input(self, slot: str, tensor: torch.Tensor) -> None:
        position = self._op.input_count
        flags = self._entries.input(self._op, slot, tensor, self.verify_inputs)
        if self._capturing and self.capture is not None and not flags & schema.FLAG_UNINITIALIZED:
            self.capture.take(self.next_index, INPUT, position, slot, tensor)

    def _site_now(self) -> tuple[str, int] | None:
        """The (file, line) the op will be recorded at, looked up before it runs (for
        ``--capture FILE:LINE``): a backward op's is its forward op's."""
        site: int | None = None
        node = torch._C._current_autograd_node()
        if node is not None:
            forward = self._forward_sites.get(node._sequence_nr())
            site = forward[1] if forward is not None else None
        if site is None:
            located = self._sites.capture()
            site = located[0] if located is not None else None
        return self._sites.location(site) if site is not None else None

    def _rng_state(
        self, generator: torch.Generator | None, args: tuple, kwargs: dict
    ) -> int | None:
        """Fingerprint of the generator a random op draws from: the explicit one, else the
        default generator of the op's device."""
        if generator is None:
            device = _op_device(args, kwargs)
            if device.type == "cuda":
                generator = torch.cuda.default_generators[device.index or 0]
            else:
                generator = torch.default_generator
        return generator_fingerprint(generator)

    # -- after the op: outputs, call site, record ------------------------------------------

    def _after(self, pending: tuple, out: Any) -> None:
        # The scratch state of this op, which ops recorded inside it (a compiled region's) reset.
        info, op, written, arguments, rng, self._capturing = pending
        self._op = op
        index = self.next_index
        items = [(slot, t, False) for slot, t in returned_tensors(out)]
        if written:  # in-place and out= ops: their written arguments are outputs too
            items = self._with_written(items, written)
        if self._capturing or self._in_flight or info.is_view or info.has_uninitialized:
            for slot, tensor, was_written in items:
                self._output(index, info, slot, tensor, was_written)
        else:  # every output read: all in one native call
            self._entries.outputs(op, items, index)
        # The record's other fields; its entries ("x", "y") are packed natively.
        record: dict[str, Any] = {"i": index, "o": info.name_id, "s": self._steps.step}
        self._locate(index, record)
        if arguments:
            record["a"] = arguments
        if rng is not None:
            record["r"] = rng
        if out is not None and not op.output_count:
            record["v"] = encode(out)  # a returned scalar, e.g. the value of .item()
        self._entries.flush()  # launched before the writer can wait for them
        packed = op.finish(_pack_head(record))
        if packed is None:  # a GPU fingerprint is pending: the writer packs it once landed
            self._writer.append(index, op)
            if self._entries.ring_load() > RING_DRAIN:  # before launches wait for space
                self._writer.wake()
        else:
            self._writer.append(index, packed)
        # Counted once queued: a failure above reports this op as the first one not recorded.
        self.next_index = index + 1

    @staticmethod
    def _with_written(
        items: list[tuple[str, torch.Tensor, bool]], written: list[tuple[str, torch.Tensor]]
    ) -> list[tuple[str, torch.Tensor, bool]]:
        """The returned tensors flagged when written, then the written ones not returned."""
        written_ids = {id(t) for _, t in written}
        flagged = [(slot, t, id(t) in written_ids) for slot, t, _ in items]
        seen = {id(t) for _, t, _ in items}
        for slot, tensor in written:
            if id(tensor) not in seen:
                flagged.append((slot, tensor, True))
                seen.add(id(tensor))
        return flagged

    def _output(
        self,
        index: int,
        info: OpInfo,
        slot: str,
        tensor: torch.Tensor,
        was_written: bool,
    ) -> None:
        op = self._op
        if info.uninitialized_output or slot in info.uninitialized_slots:
            kind = _UNINITIALIZED
        elif self._in_flight:
            kind = _IN_FLIGHT
        elif info.is_view:
            base_uninitialized = op.first_input_flags & schema.FLAG_UNINITIALIZED
            kind = _VIEW_OF_UNINITIALIZED if base_uninitialized else _VIEW
        else:
            kind = _READ
        output_slot = op.output_count
        flags = self._entries.output(op, slot, tensor, index, kind, was_written)
        if (
            self._capturing
            and self.capture is not None
            and not self._in_flight
            and not flags & schema.FLAG_UNINITIALIZED
        ):
            self.capture.take(index, OUTPUT, output_slot, slot, tensor)

    def _locate(self, index: int, record: dict[str, Any]) -> None:
        """Phase, call site and stack; backward ops borrow their forward op's call site."""
        node = torch._C._current_autograd_node()
        if node is not None:
            if not self._in_backward:  # the host has time to spare: let the writer catch up
                self._in_backward = True
                self._writer.wake()
            record["p"] = _BACKWARD
            forward = self._forward_sites.get(node._sequence_nr())
            if forward is not None:
                record["f"], site, stack = forward
                if site is not None:
                    record["c"], record["k"] = site, stack
                return
            located = self._sites.capture()
        else:
            self._in_backward = False
            steps = self._steps
            record["p"] = (
                _OPTIMIZER
                if steps.in_optimizer
                else self.region_phase
                if self.region_phase is not None
                else (_FORWARD if torch.is_grad_enabled() else _OTHER)
            )
            located = self._sites.capture()
            sequence_nr = torch._C._autograd._get_sequence_nr()
            if sequence_nr != self._last_sequence_nr:
                # The first op after the counter moved is the one whose autograd node took it.
                self._last_sequence_nr = sequence_nr
                self._forward_sites[sequence_nr - 1] = (
                    index,
                    located[0] if located else None,
                    located[1] if located else None,
                )
        if located is not None:
            record["c"], record["k"] = located


def failure_info(index: int, exc: BaseException) -> dict[str, Any]:
    return {
        "at_op": index,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


def returned_tensors(out: Any) -> list[tuple[str, torch.Tensor]]:
    """(slot, tensor) for every plain tensor an op returned, nested lists included. A tensor
    subclass wrapping another (``_c10d_functional::_wrap_tensor_autograd``) is left out: it
    may have no storage, and its content is recorded where it is unwrapped."""
    if isinstance(out, torch.Tensor):
        return [("0", out)] if type(out) in PLAIN_TENSORS else []
    found: list[tuple[str, torch.Tensor]] = []
    if isinstance(out, (tuple, list)):
        for position, value in enumerate(out):
            if type(value) in PLAIN_TENSORS:
                found.append((str(position), value))
            elif isinstance(value, (tuple, list)):
                found.extend(
                    (f"{position}[{k}]", item)
                    for k, item in enumerate(value)
                    if type(item) in PLAIN_TENSORS
                )
    return found


def _op_device(args: tuple, kwargs: dict) -> torch.device:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    device = kwargs.get("device")
    return torch.device(device) if device is not None else torch.device("cpu")
