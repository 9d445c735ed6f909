"""The truth oracle of the mutation fuzzer (issue 37): slow, obviously correct, and sharing no code
with ``opguard.analysis`` (neither its alignment nor its judgement) or OpGuard's recorder.

:func:`observe` runs a script as ``__main__`` under the oracle's own ``TorchDispatchMode``, which
keeps every op's full inputs (their bytes, read before the op runs) and outputs (read after it),
its non-tensor arguments, the random generator state it consumed (the generators' state
before the op, where the op changed it), its step (optimizer steps counted by a post-step hook)
and its line in the script, as OpGuard documents call sites (docs/RECORDING.md): the innermost
frame of the script's file on the Python stack, and for a backward op the forward call that
made its autograd node (kept by PyTorch's anomaly mode, without its NaN checks).
It also keeps the training state after every optimizer step (parameters, gradients and
optimizer states, each with the op that wrote it), the losses the script handed to Python
(``LOSSES``) and its final state (the parameters, gradients, buffers and optimizer states of the
modules and optimizers the script leaves at module level).

:func:`compare` then answers, for two runs:

- **whether the training differs at all** (``state_step``): the first step whose losses, or
  parameters, gradients and optimizer states after the step, differ in their bits; ``None`` when
  everything, the final state included, is bit for bit equal. This needs no pairing of ops, so
  it holds for every pair, whatever the mutation did to the code.
- **the first divergence** (``source``), for pairs whose op sequences are the same (the op names
  and their inputs' dtypes and shapes, in execution order): the first op, in execution order,
  whose inputs are all bitwise equal and some output differs, *and whose difference reaches the
  training's results*. Reaching matters:
  a clip whose coefficient changed but is clamped to 1 in both runs, a statistic nobody reads,
  change nothing, and a run whose results are bit for bit equal has no divergence.

How a difference is followed, op by op, in execution order (``_Walk``):

- an input differs when its bytes (dtype, shape and raw bits, so NaN-safe) differ; an input
  whose storage was last written by an ``empty``-like op (uninitialized memory) never differs;
- an input that differs was either made different by a recorded op (its producer, the op that
  last wrote its storage or made the view it is, has that output differing: *internal*), or
  changed where no op wrote it (its producer's output was equal, or it has none: *external*,
  e.g. a write through NumPy);
- an op with an internal input is **propagated**; its differing outputs are internal;
- a view op (its schema says its output aliases its input, it reads no value) with an external
  input and the same arguments passes the difference on as external; it is never a source
  unless its own arguments differ (a slice with another start);
- a random op reads and writes the generators' state (CPU and GPU), one more input and output: its
  state differs *internally* after an earlier random op drew from another state, *externally*
  where no op made it differ (another seed);
- any other op whose outputs differ is a **source**: ``external`` (an external input),
  ``argument`` (equal inputs, other non-tensor arguments), ``rng`` (equal inputs and arguments,
  a generator state that differs externally) or ``origin`` (all equal, outputs differ anyway);
- a source *reaches* the results when a chain of ops with differing outputs, each reading the
  previous one's differing output, leads from it to a value handed to Python
  (``_local_scalar_dense``, ``.item()``) or to the writer of a tensor of the training state
  (after a step, or at the end) whose bytes differ. Gradients count (they outlive the backward
  pass, though an update may round their difference away), and so does the generator's state
  (every later random op draws from it: a seed's first random op is the divergence).
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

Slot = tuple[int, int]  # (op index, output number) of one run
UNINITIALIZED: Slot = (-1, -1)  # the writer of memory an empty-like op allocated
HANDED_TO_PYTHON = "aten::_local_scalar_dense.default"  # .item(): a value leaves torch
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"  # the autograd node that writes .grad


def op_name(func: Any) -> str:
    """``aten::addmm.default``: the schema name and overload, as traces name ops."""
    return f"{func._schema.name}.{func._overloadname or 'default'}"


# Non-tensor values whose text says all of them (an object's default text holds its address,
# which differs between any two runs: such a value is compared by its type alone).
_PLAIN = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def value_bytes(x: Any) -> bytes:
    """Everything that makes two values equal: dtype, shape and raw bits (NaN-safe: bits, not
    numbers), or the exact text of a non-tensor (a float in hex)."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        head = f"{t.dtype}{tuple(t.shape)}|".encode()
        if t.numel() == 0:
            return head
        return head + t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes()
    if isinstance(x, float):
        return x.hex().encode()
    return (repr(x) if isinstance(x, _PLAIN) else type(x).__name__).encode()


def generator_state() -> torch.Tensor:
    """The states of the random generators a script's ops draw from, as one byte tensor: the
    CPU's and, on a machine with a GPU, the first GPU's (a dropout on the GPU draws from it)."""
    states = [torch.default_generator.get_state()]
    if torch.cuda.is_available():
        torch.cuda.init()  # the GPU's generator exists from the start, not from CUDA's first use
        states.append(torch.cuda.default_generators[0].get_state())
    return torch.cat(states)


def _leaves(x: Any) -> Iterator[Any]:
    """The values in ``x``, through its lists, tuples and dicts (an op's arguments, results)."""
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    else:
        yield x


def _argument_text(x: Any) -> str:
    """An op's non-tensor arguments, exactly (floats as hex), in the structure they came in."""
    if isinstance(x, torch.Tensor):
        return "T"
    if isinstance(x, (list, tuple)):
        return "(" + ", ".join(_argument_text(v) for v in x) + ")"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_argument_text(v)}" for k, v in x.items()) + "}"
    return value_bytes(x).decode()


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass
class Event:
    """One op as the oracle saw it in one run."""

    op: str
    signature: str  # the inputs' dtypes and shapes
    step: int
    line: int  # of the script's innermost frame; 0 when the script was not on the stack
    view: bool
    arguments: str
    random: bool  # it drew random numbers: its last input and output are the generators' state
    inputs: list[bytes | None]  # None: uninitialized memory
    producers: list[Slot | None]
    outputs: list[bytes]


class _Observer(TorchDispatchMode):
    """Keeps every op of one run as an :class:`Event`; ``paused`` while the oracle itself reads
    tensors (the step hook), so that its reads are not the script's ops."""

    def __init__(self, script: str) -> None:
        super().__init__()
        self.script = script
        self._frame_prefix = f'File "{script}", line '  # a traceback's frame in the script
        self.events: list[Event] = []
        self.step = 0
        self.paused = False
        # storage -> (a weak reference keeping its address from reuse, the slot that wrote it)
        self._writers: dict[int, tuple[StorageWeakRef, Slot]] = {}
        self._views: WeakIdKeyDictionary = WeakIdKeyDictionary()  # view tensor -> its slot
        self._generator_writer: Slot | None = None  # the random op that last drew

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self.paused or func.namespace == "profiler":  # record_function marks compute nothing
            return func(*args, **kwargs)
        index = len(self.events)
        read = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        inputs = [self.read(t) for t in read]
        rng_before = generator_state()
        result = func(*args, **kwargs)
        rng_after = generator_state()
        consumed = not torch.equal(rng_before, rng_after)
        view = any(
            r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
        )
        changed = (
            []
            if view
            else [t for t, (v, _) in zip(read, inputs, strict=True) if v != value_bytes(t)]
        )
        outputs = self._outputs(func, args, kwargs, result, changed)
        if consumed:  # the generator is one more input and output of a random op
            inputs.append((value_bytes(rng_before), self._generator_writer))
            outputs.append(rng_after)
            self._generator_writer = (index, len(outputs) - 1)
        self.events.append(
            Event(
                op=op_name(func),
                signature=", ".join(f"{t.dtype}{tuple(t.shape)}" for t in read),
                step=self.step,
                line=self._line(),
                view=view,
                arguments=_argument_text((args, kwargs)),
                random=consumed,
                inputs=[value for value, _ in inputs],
                producers=[producer for _, producer in inputs],
                outputs=[value_bytes(o) for o in outputs],
            )
        )
        uninitialized = op_name(func).startswith(("aten::empty", "aten::new_empty"))
        for slot, out in enumerate(outputs[: len(outputs) - consumed]):  # the tensors
            if not isinstance(out, torch.Tensor) or out.numel() == 0:
                continue
            if view:
                self._views[out] = (index, slot)
            else:
                writer = UNINITIALIZED if uninitialized else (index, slot)
                self._writers[_storage_key(out)] = (StorageWeakRef(out.untyped_storage()), writer)
        return result

    def read(self, t: torch.Tensor) -> tuple[bytes | None, Slot | None]:
        """A tensor's bytes and the slot whose output it is: the later of the op that last wrote
        its storage and the view op that made it. Uninitialized memory has no bytes."""
        if t.numel() == 0:
            return value_bytes(t), None
        written = self._writers.get(_storage_key(t))
        writer = written[1] if written is not None else None
        if writer == UNINITIALIZED:
            return None, None
        made = self._views.get(t)
        candidates = [s for s in (writer, made) if s is not None]
        return value_bytes(t), max(candidates) if candidates else None

    def snapshot(self, tensors: dict[str, torch.Tensor]) -> State:
        """Named tensors' bytes, each with the slot that last wrote it, and the generators'
        state (state too: every later random op draws from it)."""
        state = {name: (value_bytes(t), self.read(t)[1]) for name, t in tensors.items()}
        state["generator"] = (value_bytes(generator_state()), self._generator_writer)
        return state

    def _outputs(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        changed: list[torch.Tensor],
    ) -> list[Any]:
        """What the op wrote: the arguments its schema marks as written (``add_``'s self, the
        lists of ``_foreach_mul_``) and the inputs whose bytes it changed (``native_batch_norm``
        updates its running statistics without saying so), then the returned values that are
        not one of them."""
        written: list[Any] = []
        for position, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            given = args[position] if position < len(args) else kwargs.get(argument.name)
            written += [t for t in _leaves(given) if isinstance(t, torch.Tensor)]
        written += [t for t in changed if not any(t is w for w in written)]
        returned = [r for r in _leaves(result) if r is not None]
        return written + [r for r in returned if not any(r is w for w in written)]

    def _line(self) -> int:
        """The op's line in the script: a backward op's is the forward call that made its
        autograd node (anomaly mode keeps that call's stack in the node), as OpGuard reports
        it (docs/RECORDING.md); else, and for gradients accumulated into ``.grad``, the
        innermost frame of the script on the Python stack (``loss.backward()`` in backward)."""
        node = torch._C._current_autograd_node()
        if node is not None and node.name() != ACCUMULATE_GRAD:
            for text in reversed(node.metadata.get("traceback_", ())):
                if text.lstrip().startswith(self._frame_prefix):
                    return int(text.split(", line ", 1)[1].split(",", 1)[0])
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename == self.script:
                return frame.f_lineno
            frame = frame.f_back  # type: ignore[assignment]
        return 0


State = dict[str, tuple[bytes, Slot | None]]  # name -> (bytes, the slot that wrote it)


def _optimizer_tensors(optimizer: torch.optim.Optimizer, prefix: str = "") -> dict[str, Any]:
    """The training state an optimizer sees: parameters, gradients, optimizer states."""
    found: dict[str, Any] = {}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            name = f"{prefix}param[{g}][{i}]"
            found[name] = p
            if p.grad is not None:
                found[f"{name}.grad"] = p.grad
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    found[f"{name}.{key}"] = value
    return found


def _final_tensors(namespace: dict[str, Any]) -> dict[str, Any]:
    """The final state of the modules and optimizers the script left at module level."""
    found: dict[str, Any] = {}
    for name, obj in sorted(namespace.items()):
        if isinstance(obj, torch.nn.Module):
            for key, t in obj.state_dict(keep_vars=True).items():
                found[f"{name}.{key}"] = t
                if t.grad is not None:
                    found[f"{name}.{key}.grad"] = t.grad
        elif isinstance(obj, torch.optim.Optimizer):
            found.update(_optimizer_tensors(obj, f"{name}."))
    return found


@dataclass
class Observation:
    """One run of a script. ``events`` is None where ops were not observed (a compiled
    program, whose code a dispatch mode would run eagerly)."""

    events: list[Event] | None
    states: list[State]  # the training state after each optimizer step
    losses: list[list[str]]  # each step's LOSSES, exactly (float.hex)
    final: State


def observe(script: Path, *, ops: bool = True) -> Observation:
    """Runs ``script`` as ``__main__`` (as ``python script.py`` would, its output discarded)
    and keeps what :func:`compare` needs."""
    path = str(script.resolve())
    observer = _Observer(path)
    states: list[State] = []

    def step_ended(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        observer.paused = True
        states.append(observer.snapshot(_optimizer_tensors(optimizer)))
        observer.step += 1
        observer.paused = False

    hook = register_optimizer_step_post_hook(step_ended)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            torch.autograd.set_detect_anomaly(ops, check_nan=False),  # forward stacks, kept
            observer if ops else contextlib.nullcontext(),
        ):
            namespace = runpy.run_path(path, run_name="__main__")
    finally:
        hook.remove()
    losses = [float(v).hex() for v in namespace.get("LOSSES", [])]
    per_step = len(losses) // max(len(states), 1)
    return Observation(
        observer.events if ops else None,
        states,
        [losses[k * per_step : (k + 1) * per_step] for k in range(len(states))],
        observer.snapshot(_final_tensors(namespace)),
    )


class Difference(Enum):
    EQUAL = "equal"
    INTERNAL = "internal"  # a recorded op made it differ
    EXTERNAL = "external"  # it differs where no recorded op wrote it


@dataclass(frozen=True)
class Source:
    """The true first divergence of a pair whose op sequences are the same."""

    index: int
    op: str
    step: int
    line_a: int
    line_b: int
    occurrence: int  # how many earlier ops of run A have the same op, line and step
    kind: str  # "origin", "argument", "rng" or "external"

    def describe(self) -> str:
        lines = f"line {self.line_a}" + (
            f" (B: {self.line_b})" if self.line_b != self.line_a else ""
        )
        return f"{self.kind} at {self.op} #{self.occurrence} of {lines}, step {self.step}"


@dataclass
class Truth:
    """What :func:`compare` found of two runs."""

    state_step: int | None  # the first step whose state differs; None: bit for bit equal
    observed: bool  # the ops were observed (not in compiled programs)
    same_ops: bool  # the op sequences are the same (``source`` is then the true divergence)
    source: Source | None = None
    notes: list[str] = field(default_factory=list)  # what the oracle cannot explain


def _bytes(state: State) -> dict[str, bytes]:
    return {name: value for name, (value, _) in state.items()}


def _state_step(a: Observation, b: Observation) -> int | None:
    for step in range(max(len(a.states), len(b.states))):
        if step >= min(len(a.states), len(b.states)):
            return step
        if a.losses[step] != b.losses[step] or _bytes(a.states[step]) != _bytes(b.states[step]):
            return step
    return None if _bytes(a.final) == _bytes(b.final) else len(a.states)


def compare(a: Observation, b: Observation) -> Truth:
    """The truth about runs A and B (see the module's docstring)."""
    state_step = _state_step(a, b)
    if a.events is None or b.events is None:
        return Truth(state_step, observed=False, same_ops=False)
    same = [(e.op, e.signature) for e in a.events] == [(e.op, e.signature) for e in b.events]
    truth = Truth(state_step, observed=True, same_ops=same)
    if same:
        walk = _Walk(a, b)
        truth.source = walk.first_source()
        truth.notes = walk.notes
        if (truth.source is None) != (state_step is None):
            truth.notes.append(
                f"the state {'differs' if state_step is not None else 'is equal'} but the "
                f"walk found {'no' if truth.source is None else 'a'} divergence"
            )
    return truth


class _Walk:
    """The difference of two runs with the same op sequence, followed op by op."""

    def __init__(self, a: Observation, b: Observation) -> None:
        assert a.events is not None and b.events is not None
        self.a, self.b = a.events, b.events
        self.notes: list[str] = []
        self.state: dict[Slot, Difference] = {}
        self.readers: dict[int, set[int]] = {}  # op -> ops that read its differing outputs
        self.sources: list[tuple[int, str]] = []
        for index in range(len(self.a)):
            self._visit(index)
        self.sinks = self._sinks(a, b)

    def _input(self, index: int, number: int) -> tuple[Difference, Slot | None]:
        ea, eb = self.a[index], self.b[index]
        if number >= len(eb.inputs):  # a random op that drew in run A only
            return Difference.INTERNAL, None
        va, vb = ea.inputs[number], eb.inputs[number]
        if va is None or vb is None or va == vb:
            return Difference.EQUAL, None
        pa, pb = ea.producers[number], eb.producers[number]
        if pa != pb:  # the data flow itself differs: only a recorded op can have done that
            return Difference.INTERNAL, pa
        if pa is None or self.state.get(pa, Difference.EQUAL) is Difference.EQUAL:
            return Difference.EXTERNAL, None
        return self.state[pa], pa

    def _visit(self, index: int) -> None:
        ea, eb = self.a[index], self.b[index]
        differing = [
            n
            for n in range(max(len(ea.outputs), len(eb.outputs)))
            if n >= len(ea.outputs) or n >= len(eb.outputs) or ea.outputs[n] != eb.outputs[n]
        ]
        if not differing:
            return
        inputs = [self._input(index, n) for n in range(max(len(ea.inputs), len(eb.inputs)))]
        generator = inputs.pop() if ea.random and eb.random else (Difference.EQUAL, None)
        drawn = generator[0]
        external = any(d is Difference.EXTERNAL for d, _ in inputs)
        arguments = ea.arguments != eb.arguments
        outcome = Difference.INTERNAL
        if drawn is Difference.INTERNAL or any(d is Difference.INTERNAL for d, _ in inputs):
            for d, slot in [*inputs, generator]:
                if d is Difference.INTERNAL and slot is not None:
                    self.readers.setdefault(slot[0], set()).add(index)
        elif ea.view and external and not arguments:
            outcome = Difference.EXTERNAL
        elif external:
            self.sources.append((index, "external"))
        elif arguments:
            self.sources.append((index, "argument"))
        elif drawn is Difference.EXTERNAL:
            self.sources.append((index, "rng"))
        else:
            self.sources.append((index, "origin"))
        for n in differing:
            self.state[(index, n)] = outcome

    def _sinks(self, a: Observation, b: Observation) -> set[int]:
        """Ops whose differing output is a result: a value handed to Python, or the training
        state after a step (parameters, gradients, optimizer states) or at the end."""
        sinks = {
            i
            for i, e in enumerate(self.a)
            if e.op == HANDED_TO_PYTHON and self.state.get((i, 0)) is not None
        }
        for state_a, state_b in zip([*a.states, a.final], [*b.states, b.final], strict=False):
            for name, (bytes_a, slot_a) in state_a.items():
                bytes_b, slot_b = state_b.get(name, (b"", None))
                if bytes_a == bytes_b:
                    continue
                if slot_a is not None and slot_a == slot_b and self.state.get(slot_a):
                    sinks.add(slot_a[0])
                elif (note := f"{name} differs where no observed op wrote it") not in self.notes:
                    self.notes.append(note)
        return sinks

    def _reaches(self, index: int) -> bool:
        seen, queue = {index}, deque([index])
        while queue:
            op = queue.popleft()
            if op in self.sinks:
                return True
            for reader in self.readers.get(op, ()):
                if reader not in seen:
                    seen.add(reader)
                    queue.append(reader)
        return False

    def first_source(self) -> Source | None:
        for index, kind in self.sources:
            if self._reaches(index):
                ea, eb = self.a[index], self.b[index]
                occurrence = sum(
                    1 for e in self.a[:index] if (e.op, e.line, e.step) == (ea.op, ea.line, ea.step)
                )
                return Source(index, ea.op, ea.step, ea.line, eb.line, occurrence, kind)
        return None
