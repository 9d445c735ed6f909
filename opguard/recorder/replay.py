"""Re-executing a captured op on its captured inputs (``opguard replay``).

Replaying the op alone, many times, separates the three usual stories of an ``origin``
divergence: a nondeterministic kernel (repeated replays disagree), a device- or
library-specific result (replays agree with each other but not with the recording, or every GPU
but one agrees), and a changed input (the op reproduces run A, and run B's inputs differed).

The op is rebuilt from its recorded name (``torch.ops``), its captured input tensors and its
recorded non-tensor arguments, decoded through the op's schema. Results are compared by the
recorder's own fingerprint, so "matches run A" means bit for bit. A float64 run on the CPU
serves as a reference for how far each result is from the exact value.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.divergence.model import ArgumentDiff, differing_arguments
from ..store import OpRecord, RankTrace, TensorRecord
from ..store.captures import INPUT, OUTPUT, CapturedTensor
from .ops import op_info
from .tensors import fingerprint_fields, returned_tensors

REFERENCE_DTYPES = {torch.complex32: torch.complex128, torch.complex64: torch.complex128}


class ReplayError(Exception):
    """The op cannot be replayed (one line for the CLI)."""


def _tensor(captured: CapturedTensor, device: str | torch.device = "cpu") -> torch.Tensor:
    dtype = getattr(torch, captured.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ReplayError(f"captured {captured.label}: dtype {captured.dtype} unknown to torch")
    if captured.nbytes == 0:
        return torch.empty(captured.shape, dtype=dtype, device=device)
    data = torch.frombuffer(bytearray(captured.raw()), dtype=torch.uint8).view(dtype)
    return data.reshape(captured.shape).to(device)


def _fingerprint(tensor: torch.Tensor) -> int | None:
    fields = fingerprint_fields(tensor.detach().cpu())
    return fields.get("h") if isinstance(fields, dict) else None


def resolve_op(name: str) -> Any:
    """``aten::addmm.default`` -> ``torch.ops.aten.addmm.default``."""
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.rpartition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        raise ReplayError(f"{name}: no such op in this torch ({torch.__version__})") from None


@dataclass
class Call:
    """The op with its arguments, rebuilt from the trace; tensors on the CPU."""

    func: Any
    args: list[Any]
    kwargs: dict[str, Any]
    written: list[str]  # argument names the op writes (their new content is an output)
    out_args: list[str]

    def run(self, device: str, reference: bool = False) -> list[torch.Tensor]:
        """Runs the op once on fresh copies of the inputs; returns the outputs in the order
        the recorder lists them (returned tensors, then written arguments not returned)."""
        args = [_place(a, device, reference) for a in self.args]
        kwargs = {k: _place(v, device, reference) for k, v in self.kwargs.items()}
        with torch.no_grad():
            out = self.func(*args, **kwargs)
        outputs = [t for _, t in returned_tensors(out)]
        seen = {id(t) for t in outputs}
        names = self.func._schema.arguments
        for position, argument in enumerate(names):
            if argument.name not in self.written:
                continue
            value = kwargs.get(argument.name, args[position] if position < len(args) else None)
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                outputs.append(value)
                seen.add(id(value))
        return outputs


@dataclass(frozen=True)
class Input:
    """A captured input (contiguous, on the CPU) and the strides it had when the op read it:
    kernels choose their algorithm, and so the order of their sums, by layout (a transposed
    weight takes another GEMM path), so the replay gives the op the layout it was given."""

    tensor: torch.Tensor
    stride: tuple[int, ...]


def _with_layout(tensor: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``tensor``'s values laid out with ``stride``: dense permutations, gaps and broadcast
    (stride 0) dimensions; an overlapping layout (which no op output has) stays contiguous."""
    if (
        len(stride) != tensor.dim()
        or tuple(tensor.stride()) == stride
        or min(stride, default=0) < 0
    ):
        return tensor
    broadcast = [d for d in range(tensor.dim()) if stride[d] == 0 and tensor.shape[d] != 1]
    base = tensor
    for d in broadcast:
        base = base.narrow(d, 0, 1)
    dims = sorted((s, n) for s, n in zip(stride, base.shape, strict=True) if n > 1)
    reach = 1
    for s, n in dims:
        if s < reach:
            return tensor  # overlapping
        reach = s * n
    span = 1 + sum((n - 1) * s for s, n in zip(stride, base.shape, strict=True))
    laid = torch.zeros(span, dtype=tensor.dtype, device=tensor.device)
    laid = laid.as_strided(base.shape, stride)
    laid.copy_(base)
    return laid.expand(tensor.shape) if broadcast else laid


def _place(value: Any, device: str, reference: bool) -> Any:
    if isinstance(value, Input):
        copy = value.tensor.to(device, copy=True)
        if reference and copy.is_floating_point():
            copy = copy.to(torch.float64)
        elif reference and copy.is_complex():
            copy = copy.to(REFERENCE_DTYPES.get(copy.dtype, copy.dtype))
        return _with_layout(copy, value.stride)
    if isinstance(value, torch.Tensor):  # write-only out= buffers
        return value.to(device, copy=True)
    if isinstance(value, list):
        return [_place(v, device, reference) for v in value]
    if isinstance(value, torch.device):
        return torch.device(device)
    return value


def build_call(op: OpRecord, tensors: list[CapturedTensor]) -> Call:
    func = resolve_op(op.op)
    info = op_info(func, lambda name: 0)
    if info.is_random:
        raise ReplayError(
            f"{op.op} is a random op: its result depends on the RNG state, which the trace "
            "holds only as a fingerprint, so a replay cannot reproduce it"
        )
    if info.is_view or info.uninitialized_output:
        raise ReplayError(f"{op.op} computes no values (a view or uninitialized memory)")
    inputs = {t.slot: t for t in tensors if t.direction == INPUT}
    recorded_inputs = {t.slot: t for t in op.inputs}
    outputs = {t.slot: t for t in op.outputs}
    recorded = dict(op.args)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for argument in func._schema.arguments:
        name = argument.name
        if "Tensor" in str(argument.type):
            value = _tensor_argument(
                argument, inputs, recorded_inputs, recorded, outputs, info.out_args
            )
        elif name in recorded:
            value = _decode(recorded[name], str(argument.type))
        elif argument.has_default_value():
            continue
        else:
            raise ReplayError(f"{op.op}: argument {name} was not recorded")
        if argument.kwarg_only:
            kwargs[name] = value
        else:
            args.append(value)
    return Call(func, args, kwargs, sorted(info.written_args), sorted(info.out_args))


def _tensor_argument(
    argument: Any,
    inputs: dict[str, CapturedTensor],
    recorded: dict[str, TensorRecord],
    values: dict[str, Any],
    outputs: dict[str, TensorRecord],
    out_args: frozenset[str],
) -> Any:
    """What the call passed for an argument the schema types as a tensor (or list of them).

    The recorder keeps the tensors among the inputs (a list's as ``name[k]``) and anything
    else among the arguments: a Python number the caller gave (``x * 1.0`` passes ``other=1.0``,
    which ATen wraps into a tensor), a bool, a None, a list without tensors. A list's
    non-tensor items are not recorded: in ``Tensor?[]`` (``x[:, idx]`` indexes with
    ``[None, idx]``) they can only be None, so the gaps between recorded slots are filled with
    None (trailing Nones, which index nothing, are lost and not needed).
    """
    name = argument.name
    if name in out_args:  # write-only: its old content is no input
        out = outputs.get(name)
        if out is None:
            return None
        return torch.empty(out.shape, dtype=getattr(torch, out.dtype))
    items = {int(s[len(name) + 1 : -1]): s for s in recorded if s.startswith(f"{name}[")}
    if items:
        return [
            _input(items[k], inputs, recorded) if k in items else None
            for k in range(max(items) + 1)
        ]
    if name in recorded:
        return _input(name, inputs, recorded)
    if name in values:
        return _decode(values[name], str(argument.type))
    return None  # an optional tensor the call left out


def _input(slot: str, inputs: dict[str, CapturedTensor], recorded: dict[str, TensorRecord]) -> Any:
    entry = recorded[slot]
    if slot in inputs:
        return Input(_tensor(inputs[slot]), entry.stride)
    if entry.is_uninitialized:  # memory nobody wrote: any content is as good
        return Input(torch.empty(entry.shape, dtype=getattr(torch, entry.dtype)), entry.stride)
    raise ReplayError(f"input {slot} was not captured (re-record with --capture)")


def _decode(value: Any, type_name: str) -> Any:
    """A recorded non-tensor argument back into what the op takes (see arguments.encode)."""
    if isinstance(value, str) and value.startswith("torch."):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
            return found
    if "Device" in type_name and isinstance(value, str):
        return torch.device(value)
    # A complex number is recorded as [real, imag]; where a single tensor is taken (x * 1j)
    # a list can be nothing else.
    if (
        type_name in ("number", "Scalar", "complex", "Tensor", "Optional[Tensor]")
        and isinstance(value, list)
        and len(value) == 2
    ):
        return complex(value[0], value[1])
    return value


@dataclass
class DeviceResult:
    device: str
    results: list[tuple[int | None, ...]]  # output fingerprints of each replay

    @property
    def deterministic(self) -> bool:
        return len(set(self.results)) == 1


@dataclass
class Error:
    max_abs: float
    rel: float  # max |x - ref| / max |ref|: normwise, never divides by a tiny element


@dataclass
class ReferenceOutput:
    slot: str
    replay: Error | None
    a: Error | None
    b: Error | None


@dataclass
class Replay:
    op: OpRecord
    times: int
    devices: list[DeviceResult]
    recorded_a: tuple[int | None, ...]
    inputs_faithful: bool  # the captured inputs have the recorded fingerprints
    op_b: OpRecord | None = None
    recorded_b: tuple[int | None, ...] | None = None
    b_inputs_equal: bool | None = None
    b_arguments: list[ArgumentDiff] = field(default_factory=list)  # differing from A's
    reference: list[ReferenceOutput] = field(default_factory=list)
    reference_error: str | None = None

    @property
    def deterministic(self) -> bool:
        return all(d.deterministic for d in self.devices)

    @property
    def matches_a(self) -> bool:
        return any(self._matches(r, self.recorded_a) for d in self.devices for r in d.results)

    @property
    def matches_b(self) -> bool | None:
        if self.recorded_b is None:
            return None
        return any(self._matches(r, self.recorded_b) for d in self.devices for r in d.results)

    @staticmethod
    def _matches(result: tuple[int | None, ...], recorded: tuple[int | None, ...]) -> bool:
        """Equal fingerprints wherever the recording has one (views are not fingerprinted)."""
        return len(result) == len(recorded) and all(
            r is None or r == x for x, r in zip(result, recorded, strict=True)
        )

    @property
    def suspects(self) -> list[str]:
        """Devices (of several, each deterministic) whose result differs from the one most
        devices give. A nondeterministic op explains differences by itself: none then."""
        if len(self.devices) < 2 or not self.deterministic:
            return []
        votes = Counter(d.results[0] for d in self.devices)
        (majority, count), *rest = votes.most_common()
        if rest and rest[0][1] == count:  # no majority (two GPUs that disagree): name both
            return [d.device for d in self.devices]
        return [d.device for d in self.devices if d.results[0] != majority]

    def findings(self) -> list[str]:
        """What the replay shows, in plain sentences, most telling first."""
        found: list[str] = []
        if not self.inputs_faithful:
            found.append(
                "the captured inputs do not have the recorded fingerprints: the capture is not "
                "the recorded tensor (a write OpGuard did not see between read and op)"
            )
        for d in self.devices:
            if not d.deterministic:
                found.append(
                    f"nondeterministic: {self.times} replays on {d.device} gave "
                    f"{len(set(d.results))} different results (a nondeterministic kernel: atomics, "
                    "split reductions)"
                )
        for device in self.suspects:
            found.append(
                f"{device} gives a result the other GPUs do not: suspect faulty hardware (silent "
                "data corruption)"
            )
        if self.matches_a:
            found.append("a replay reproduces run A's recorded output bit for bit")
        else:
            found.append(
                "no replay reproduces run A's recorded output: this machine computes the op "
                "differently from the recording (another kernel, library, device or setting)"
            )
        if self.matches_b is not None:
            if self.b_inputs_equal is False:
                found.append(
                    "run B's inputs differ from run A's: the difference came into this op "
                    "through its inputs (replaying A's inputs cannot give B's output)"
                )
            elif self.b_arguments:
                changed = ", ".join(
                    f"{d.name}: {d.a!r} (A) vs {d.b!r} (B)" for d in self.b_arguments
                )
                found.append(
                    f"run B called the op with other arguments ({changed}): replaying A's "
                    "arguments cannot give B's output"
                )
            elif self.matches_b:
                found.append("a replay reproduces run B's recorded output as well")
            else:
                found.append(
                    "no replay reproduces run B's output from the same inputs: run B computed "
                    "it differently (its kernel, library, device or settings)"
                )
        return found


def _errors(values: torch.Tensor, reference: torch.Tensor) -> Error | None:
    if values.shape != reference.shape or not (values.is_floating_point() or values.is_complex()):
        return None
    diff = (values.to(reference.dtype) - reference).abs()
    scale = float(reference.abs().max()) if reference.numel() else 0.0
    worst = float(diff.max()) if diff.numel() else 0.0
    return Error(worst, worst / scale if scale else (math.inf if worst else 0.0))


def replay(
    trace: RankTrace,
    index: int,
    *,
    times: int,
    devices: list[str],
    trace_b: RankTrace | None = None,
    op_b: OpRecord | None = None,
) -> Replay:
    op = trace.op(index)
    tensors = trace.captures(index)
    call = build_call(op, tensors)
    faithful = all(  # a view's recorded hash is not of its content (FLAG_VIEW): not checked
        _fingerprint(_tensor(t)) == op.inputs[t.position].hash
        for t in tensors
        if t.direction == INPUT
        and op.inputs[t.position].hash is not None
        and not op.inputs[t.position].is_view
    )
    results = []
    for device in devices:
        runs = []
        for _ in range(times):
            outputs = call.run(device)
            runs.append(tuple(_fingerprint(t) for t in outputs))
        results.append(DeviceResult(device, runs))
    report = Replay(op, times, results, _recorded(op), faithful)
    if op_b is not None and trace_b is not None:
        report.op_b = op_b
        report.recorded_b = _recorded(op_b)
        report.b_inputs_equal = [t.content_key() for t in op.inputs] == [
            t.content_key() for t in op_b.inputs
        ]
        report.b_arguments = differing_arguments(op, op_b)
    _reference(report, call, tensors, trace_b.captures(op_b.index) if op_b and trace_b else [])
    return report


def _recorded(op: OpRecord) -> tuple[int | None, ...]:
    return tuple(None if t.is_view or t.is_uninitialized else t.hash for t in op.outputs)


def _reference(
    report: Replay, call: Call, captured_a: list[CapturedTensor], captured_b: list[CapturedTensor]
) -> None:
    """Float64 on the CPU, and how far the replay and both runs' captured outputs are from it."""
    try:
        reference = call.run("cpu", reference=True)
        replayed = call.run(report.devices[0].device)
    except RuntimeError as exc:  # e.g. no float64 kernel for this op
        report.reference_error = str(exc).splitlines()[0]
        return
    outputs = {
        side: {t.position: _tensor(t) for t in captured if t.direction == OUTPUT}
        for side, captured in (("a", captured_a), ("b", captured_b))
    }
    for position, ref in enumerate(reference):
        if not (ref.is_floating_point() or ref.is_complex()):
            continue
        a, b = outputs["a"].get(position), outputs["b"].get(position)
        report.reference.append(
            ReferenceOutput(
                report.op.outputs[position].slot if position < len(report.op.outputs) else "?",
                _errors(replayed[position].cpu(), ref) if position < len(replayed) else None,
                _errors(a, ref) if a is not None else None,
                _errors(b, ref) if b is not None else None,
            )
        )
