"""Step-level records: the fingerprints of the training state at every step boundary
(:mod:`opguard.store.states`), written in every recording mode, and alone with
``opguard record --steps-only``.

Per step, in the order a step computes them: the loss (each tensor ``backward()`` is called on:
``torch.autograd.backward`` is wrapped while recording, so several calls in a step give slots
``0``, ``1`` …), every parameter's gradient as the optimizer sees it (its pre-hook: after any
all-reduce or unscaling), the parameters and optimizer states after the update (its post-hook),
the buffers of the modules owning the parameters (norm running stats), and the RNG states (the
CPU generator's and each CUDA device's). Sharded tensors (DTensor, FSDP2) are fingerprinted as
this rank's local shard.

Cost is what makes an always-on step level possible: each group of tensors is fingerprinted by
one native call (GPU fingerprints queued on the current stream and launched together, no host
sync), labels are made once per tensor name, and the record is packed and compressed on the
trace writer's thread, which waits there for the GPU results. A failure here stops step-level
recording, never the training.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import _C
from ..store.schema import SKETCHED_STATE_KINDS
from ..store.states import encode_packed_step
from .mode import RING_DRAIN
from .owners import Owners, find_owners, param_name
from .tensors import PLAIN_TENSORS, fingerprint_all, ring_load

LOSS = "loss"  # the kind and the name of loss entries, told apart by their slot: "0", "1", …
CPU_RNG = "cpu"


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as this rank holds it: a DTensor's local shard (read as an attribute: its
    ``to_local()`` would run ops), anything else as it is."""
    if type(tensor) in PLAIN_TENSORS:
        return tensor
    shard = getattr(tensor, "_local_tensor", None)
    return shard if isinstance(shard, torch.Tensor) else tensor


@dataclass
class Layout:
    """One optimizer's parameters in its order, with their entries' labels (``slot_labels``:
    each parameter's state entries' labels by state key, made as the keys appear)."""

    params: list[torch.Tensor]
    grad_labels: list[bytes]
    param_labels: list[bytes]
    names: list[str]
    slot_labels: list[dict[Any, bytes]]


class StepRecorder:
    """Collects one rank's training state during a step and queues its record at the end."""

    def __init__(self, writer: Any, on_failure: Callable[[BaseException], None]) -> None:
        self._writer = writer
        self._on_failure = on_failure
        self._batches: list[Any] = []  # this step's _C.StateBatch objects, in order
        self._losses = 0  # tensors backward() was called on in this step
        self._labels: dict[tuple[str, str, str], bytes] = {}
        self._layouts: weakref.WeakKeyDictionary[Any, Layout] = weakref.WeakKeyDictionary()
        # (label, module, key) of every buffer of the modules found so far (the modules held
        # weakly: a model the script drops is not kept alive by the recording)
        self._buffers: list[tuple[bytes, weakref.ref[torch.nn.Module], str]] = []
        self._buffer_names: set[str] = set()
        self._original: Callable[..., Any] = torch.autograd.backward
        self._backward: Callable[..., Any] | None = None
        self.active = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Wraps ``torch.autograd.backward`` (``Tensor.backward`` calls it) to see each loss."""
        original = self._original = torch.autograd.backward

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.loss(args[0] if args else kwargs.get("tensors"))
            return original(*args, **kwargs)

        self._backward = backward
        torch.autograd.backward = backward
        self.active = True

    def close(self) -> None:
        """Restores ``torch.autograd.backward``; a step left unfinished is not written."""
        self.stop()
        if self._backward is not None and torch.autograd.backward is self._backward:
            torch.autograd.backward = self._original
        self._backward = None

    def stop(self) -> None:
        """Records nothing more (the step limit, a failure)."""
        self.active = False
        self._batches = []

    # -- during a step --------------------------------------------------------------------

    def loss(self, tensors: Any) -> None:
        """``backward()`` is about to run on ``tensors`` (one tensor or a sequence)."""
        if isinstance(tensors, torch.Tensor):
            tensors = (tensors,)
        try:
            found = [local(t) for t in tensors if isinstance(t, torch.Tensor)]
            first, self._losses = self._losses, self._losses + len(found)
            labels = [self._label(LOSS, LOSS, str(first + k)) for k in range(len(found))]
            self._add(LOSS, found, labels)
        except Exception as exc:
            self._fail(exc)

    def gradients(self, optimizer: Any) -> None:
        """The optimizer is about to step: its parameters' gradients as it will read them."""
        if not self.active:
            return
        try:
            layout = self._layout(optimizer)
            tensors, labels = [], []
            for param, label in zip(layout.params, layout.grad_labels, strict=True):
                grad = param.grad
                if grad is not None:
                    tensors.append(local(grad))
                    labels.append(label)
            self._add("grad", tensors, labels)
        except Exception as exc:
            self._fail(exc)

    def updated(self, optimizer: Any) -> None:
        """The optimizer has stepped: its parameters, then its states."""
        if not self.active:
            return
        try:
            layout = self._layout(optimizer)
            self._add("param", [local(p) for p in layout.params], list(layout.param_labels))
            tensors, labels = [], []
            # found by identity: looking a tensor up in the state dict calls Tensor.__hash__, a
            # Python method, once a parameter
            states = {id(param): slots for param, slots in optimizer.state.items()}
            for param, name, slot_labels in zip(
                layout.params, layout.names, layout.slot_labels, strict=True
            ):
                for key, value in states.get(id(param), {}).items():
                    if isinstance(value, torch.Tensor):
                        label = slot_labels.get(key)
                        if label is None:
                            label = slot_labels[key] = self._label("state", name, str(key))
                        tensors.append(local(value))
                        labels.append(label)
            self._add("state", tensors, labels)
        except Exception as exc:
            self._fail(exc)

    def end_step(self, step: int) -> None:
        """Step ``step`` ended: adds the buffers and RNG states, and queues its record."""
        if not self.active:
            return
        try:
            held = [(label, _buffer(module(), key)) for label, module, key in self._buffers]
            tensors = [local(buffer) for _, buffer in held if buffer is not None]
            labels = [label for label, buffer in held if buffer is not None]
            rng, rng_labels = self._rng_states()
            # STATE_KINDS' order (the RNG states are bytes, which have no sketch to keep)
            self._add("buffer", tensors + rng, labels + rng_labels)
            batches, self._batches, self._losses = self._batches, [], 0
            self._writer.put_step(step, functools.partial(_packed_step, step, batches))
            if ring_load() > RING_DRAIN:
                self._writer.wake()  # collect the GPU results before the rings fill
        except Exception as exc:
            self._fail(exc)

    # -- helpers --------------------------------------------------------------------------

    def _add(self, kind: str, tensors: list[torch.Tensor], labels: list[bytes]) -> None:
        """Fingerprints tensors of ``kind`` (their entries keep their sketch where the kind's
        distances are judged, :data:`~opguard.store.schema.SKETCHED_STATE_KINDS`)."""
        if tensors:
            sketch = kind in SKETCHED_STATE_KINDS
            self._batches.append(fingerprint_all(tensors, labels, sketch=sketch))

    def _label(self, kind: str, name: str, slot: str) -> bytes:
        key = (kind, name, slot)
        label = self._labels.get(key)
        if label is None:
            label = self._labels[key] = _C.state_label(kind, self._writer.intern_state(name), slot)
        return label

    def _layout(self, optimizer: Any) -> Layout:
        """The optimizer's parameters and labels, made on its first step (and again when its
        groups change)."""
        layout = self._layouts.get(optimizer)
        count = sum(len(group["params"]) for group in optimizer.param_groups)
        if layout is not None and len(layout.params) == count:
            return layout
        groups = [(g, list(group["params"])) for g, group in enumerate(optimizer.param_groups)]
        params = [p for _, ps in groups for p in ps]
        owners = find_owners(params)
        names = [param_name(owners, p, g, k) for g, ps in groups for k, p in enumerate(ps)]
        layout = Layout(
            params,
            [self._label("grad", name, "") for name in names],
            [self._label("param", name, "") for name in names],
            names,
            [{} for _ in names],
        )
        self._layouts[optimizer] = layout
        self._note_buffers(owners)
        return layout

    def _note_buffers(self, owners: Owners) -> None:
        for name, module, key in owners.buffers:
            if name not in self._buffer_names:
                self._buffer_names.add(name)
                self._buffers.append((self._label("buffer", name, ""), weakref.ref(module), key))

    def _rng_states(self) -> tuple[list[torch.Tensor], list[bytes]]:
        tensors = [torch.default_generator.get_state()]
        labels = [self._label("rng", CPU_RNG, "")]
        if torch.cuda.is_initialized():
            for device, generator in enumerate(torch.cuda.default_generators):
                tensors.append(generator.get_state())
                labels.append(self._label("rng", f"cuda:{device}", ""))
        return tensors, labels

    def _fail(self, exc: BaseException) -> None:
        self.stop()
        self._on_failure(exc)


def _buffer(module: torch.nn.Module | None, key: str) -> torch.Tensor | None:
    """The module's buffer ``key`` as it is now (a module may replace it; None: gone)."""
    return None if module is None else module._buffers.get(key)


def _packed_step(step: int, batches: list[Any]) -> dict[str, Any]:
    """Step ``step``'s stored value: run on the writer thread, which waits (without the GIL)
    for the GPU fingerprints."""
    return encode_packed_step(step, _C.pack_entries(batches))
