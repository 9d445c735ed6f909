"""``torch.compile`` while recording: compiled regions as recorded units, and the kernels Inductor
generated for them.

The dispatch mode never sees what a compiled region computes: Inductor runs fused C++ or Triton
kernels from a generated Python wrapper, and only the ATen ops it falls back to ("extern
kernels" such as GEMMs) reach the dispatcher. PyTorch offers a hook for this
(``torch._inductor.config.wrap_inductor_compiled_regions``): every call of a compiled graph
while a dispatch mode is active becomes the higher-order op ``inductor_compiled_code``, which
this module implements for :class:`OpRecorder`. Each call then records:

- every generated kernel it launches, as ``inductor::<kernel name>`` (Inductor's names carry no
  hashes, ``cpp_fused_mul_relu_0``, so two runs of the same code align them), with its read
  arguments fingerprinted before and its written ones after, and a digest of its source code;
- the ATen ops it falls back to, as ordinary ops;
- the region itself, last, as ``compiled::forward`` or ``compiled::backward`` with its inputs,
  outputs, the user's call site, a digest of its FX graph and the ATen ops in it.

Every op keeps the call site of the compiled code (where the user called the model); a kernel's
record also names its *origins*, the user's source lines of the FX nodes it computes (the
``gelu`` fused into it), from Inductor's provenance tracking, which the recorder turns on.

Kernels are found in the wrapper module's globals, where the wrapper looks them up at each call,
and are replaced there by recording proxies that pass straight through when nothing records.
A kernel's arguments are classified by Inductor's own naming of kernel parameters
(``in_ptr``: read, ``out_ptr``: written, ``in_out_ptr``: both). An ``in_out_ptr`` is not always
read before it is written: Inductor also gives that name to a buffer that one part of a fused
kernel computes and a later part updates in place (a layer norm's mean, then its reciprocal
deviation), freshly allocated by the wrapper. The wrapper's allocators (``empty_strided_cuda``
…) bypass the dispatcher, so they are wrapped too, and what they return is known as memory
nobody wrote: a kernel reading it gets the uninitialized flag, not a fingerprint of what the
allocator's previous user left there, which differs between runs for no reason in either.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.abc
import json
import re
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.machinery import ModuleSpec
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

import torch

from ..store import schema
from .callsite import CallSites, generated_by_inductor
from .ops import OpInfo
from .tensors import PLAIN_TENSORS

if TYPE_CHECKING:
    from .mode import OpRecorder

REGION_NAMESPACE = "compiled"
KERNEL_NAMESPACE = "inductor"
INDUCTOR_CONFIG = "torch._inductor.config"
DYNAMO_CONFIG = "torch._dynamo.config"
FUNCTORCH_CONFIG = "torch._functorch.config"
# Compiled graphs taken from Inductor's on-disk caches keep the stack traces of the compile that
# made them, from another copy of the script, say: while recording, graphs are compiled afresh
# (the same code: the caches only save compile time).
NO_CACHES = {
    INDUCTOR_CONFIG: {"fx_graph_cache": False},
    FUNCTORCH_CONFIG: {"enable_autograd_cache": False},
}

_BACKWARD = schema.PHASES.index("backward")
_FORWARD = schema.PHASES.index("forward")
_OTHER = schema.PHASES.index("other")
_MARK = "__opguard_kernels__"  # set in a wrapper module's globals once its kernels are wrapped
# The wrapper's names for torch's allocators that bypass the dispatcher (empty_strided_cpu,
# empty_strided_cuda, …); the dispatcher's own empty_strided is recorded as an op, and
# empty_strided_p2p's symmetric memory is written by other ranks, which this one never sees.
_ALLOCATOR = re.compile(r"empty_strided_(?!p2p$)\w+")
_KERNEL_SIGNATURE = re.compile(r'extern\s+"C"[^(]*\bkernel\s*\(([^)]*)\)')
# Inductor's provenance tracking at its basic level: each compiled graph then keeps the stack
# traces of the FX nodes every kernel launch of its wrapper computes. Turned on only where the
# user left it off; a torch without it records kernels without origins.
PROVENANCE = "trace.provenance_tracking_level"
PROVENANCE_BASIC = 2
# The wrapper's comment before each kernel launch naming its provenance key, "NAME:HANDLE".
_PROVENANCE_HANDLE = re.compile(r"#\s*\[Provenance debug handles\]\s*(\S+):(\d+)\s*$")
_TRACEBACK_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+?)\s*$', re.MULTILINE)
_CALLER_FRAMES = 16  # how far above a region call its compiled graph's frame is looked for

Site = tuple[str, int, str]  # (file, line, function) of a source line
Origins = dict[str, tuple[Site, ...]]  # a launch's provenance key -> the user's lines

_recorder: OpRecorder | None = None  # the recorder kernel proxies report to, while recording


class _Running(threading.local):
    """Per thread (a CUDA backward runs on autograd's device thread): the origins of the
    compiled graph running now, for its kernel launches."""

    def __init__(self) -> None:  # run in each thread that uses it
        self.origins: Origins = {}


_running = _Running()


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# -- settings applied while recording ------------------------------------------------------------


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``apply(module)`` right after ``name`` is first imported: importing Inductor's
    config eagerly would cost every recording seconds, though most scripts never compile."""

    def __init__(self, name: str, apply: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.apply = apply

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                loader: Any = spec.loader
                loader.exec_module = self._then_apply(loader.exec_module)
                return spec
        return None

    def _then_apply(self, load: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        def exec_module(module: ModuleType) -> None:
            load(module)
            self.apply(module)

        return exec_module


class CompileSettings:
    """The torch settings a recording needs: compiled regions visible to the recorder, their
    kernels' origins kept (``regions``: not for a recording of no op, ``--steps-only``), and
    with ``eager`` Dynamo turned off (``opguard record --eager``). Applied when the config
    modules are imported (now, if they already are), undone by :meth:`restore`."""

    def __init__(self, eager: bool, regions: bool = True) -> None:
        self._wanted: dict[str, dict[str, Any]] = {}
        if regions:
            self._wanted[INDUCTOR_CONFIG] = {
                "wrap_inductor_compiled_regions": True,
                PROVENANCE: PROVENANCE_BASIC,
                **NO_CACHES[INDUCTOR_CONFIG],
            }
            self._wanted[FUNCTORCH_CONFIG] = dict(NO_CACHES[FUNCTORCH_CONFIG])
        self._if_off = {PROVENANCE}  # set only where present and off: the user's choice stands
        if eager:
            self._wanted[DYNAMO_CONFIG] = {"disable": True}
        self._saved: list[tuple[ModuleType, str, Any]] = []
        self._hooks: list[_AfterImport] = []

    def apply(self) -> None:
        for name, values in self._wanted.items():
            module = sys.modules.get(name)
            if module is not None:
                self._set(module, values)
            else:
                hook = _AfterImport(name, partial(self._set, values=values))
                self._hooks.append(hook)
                sys.meta_path.insert(0, hook)

    def _set(self, module: ModuleType, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if not hasattr(module, key):
                continue  # a torch without the setting
            if key in self._if_off and getattr(module, key):
                continue
            self._saved.append((module, key, getattr(module, key)))
            setattr(module, key, value)

    def restore(self) -> None:
        for hook in self._hooks:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
        for module, key, value in reversed(self._saved):
            setattr(module, key, value)
        self._hooks.clear()
        self._saved.clear()


# -- compiled regions ----------------------------------------------------------------------------


def register(recorder_type: type) -> None:
    """Implements the ``inductor_compiled_code`` higher-order op for the recorder's mode."""
    from torch._higher_order_ops.wrap import inductor_compiled_code

    if recorder_type not in inductor_compiled_code.python_key_table:
        inductor_compiled_code.py_impl(recorder_type)(_run_region)


def attach(recorder: OpRecorder | None) -> None:
    """Kernel proxies record into ``recorder`` from now on (None: they only run)."""
    global _recorder
    _recorder = recorder


def _run_region(mode: OpRecorder, func: Any, inputs: list[Any], *, name: str | None = None) -> Any:
    """One call of a compiled graph (``func``: an ``InductorCompiledCallable``) under the
    recorder: its kernels and fallback ops, then the region as a unit."""
    plain = all(type(t) in PLAIN_TENSORS for t in inputs if isinstance(t, torch.Tensor))
    if not mode.active or not plain:
        with mode:
            return func(inputs)
    backward = torch._C._current_autograd_node() is not None
    kind = "backward" if backward else "forward"
    try:
        info = mode.info_for((func, kind), lambda: _region_info(mode, name, kind))
        arguments = _graph_arguments(func)
        _instrument(func)
    except Exception as exc:  # the region still runs, unrecorded
        mode.fail(exc)
        return func(inputs)
    origins = _graph_origins(func, mode.call_sites, sys._getframe(1))
    saved_phase, saved_origins = mode.region_phase, _running.origins
    if not backward:
        # Inside the autograd function that runs a forward graph gradients are off; inputs
        # that require them say it is a training forward, as the same ops would be eagerly.
        needs_grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
        mode.region_phase = _FORWARD if needs_grad or torch.is_grad_enabled() else _OTHER
    _running.origins = origins
    try:
        with mode:  # the fallback ATen ops inside are recorded as ops of their own
            return mode.record_call(info, func, (inputs,), {}, arguments=arguments, nested=True)
    finally:
        mode.region_phase, _running.origins = saved_phase, saved_origins


def unit_info(
    mode: OpRecorder,
    name: str,
    arg_names: tuple[str, ...],
    written: frozenset[str] = frozenset(),
    write_only: frozenset[str] = frozenset(),
) -> OpInfo:
    """An op the dispatcher does not see (a region, a kernel), described like an ATen op."""
    return OpInfo(
        name=name,
        name_id=mode.intern_name(name),
        arg_names=arg_names,
        written_args=written,
        out_args=write_only,
        is_view=False,
        is_random=False,
        uninitialized_output=False,
        uninitialized_slots=frozenset(),
    )


def _region_info(mode: OpRecorder, name: str | None, kind: str) -> OpInfo:
    return unit_info(mode, f"{REGION_NAMESPACE}::{name + '.' if name else ''}{kind}", ("inputs",))


_GRAPHS: weakref.WeakKeyDictionary[Any, list[list[Any]]] = weakref.WeakKeyDictionary()


def _graph_arguments(func: Any) -> list[list[Any]]:
    """A region's FX graph as recorded arguments: its digest and the ATen ops in it, equal in
    two runs of the same code and telling what changed when they are not."""
    arguments = _GRAPHS.get(func)
    if arguments is None:
        graph = getattr(func, "original_gm", None)
        arguments = []
        if graph is not None:
            targets = [
                node.target._schema.name.removeprefix("aten::")
                for node in graph.graph.nodes
                if isinstance(node.target, torch._ops.OpOverload)
            ]
            arguments = [
                ["graph", _digest(graph.code)],
                ["ops", ", ".join(dict.fromkeys(targets))],
            ]
        _GRAPHS[func] = arguments
    return arguments


# -- where generated kernels came from -----------------------------------------------------------

_ORIGINS: weakref.WeakKeyDictionary[Any, Origins] = weakref.WeakKeyDictionary()


def _graph_origins(func: Any, sites: CallSites, caller: FrameType | None) -> Origins:
    """The user's source lines of each kernel launch of the compiled graph ``func``, read once
    per graph from the frames above the region's call (``caller`` outwards). Empty when this
    torch keeps no provenance or reading it fails: origins are evidence, not the trace."""
    origins = _ORIGINS.get(func)
    if origins is None:
        try:
            origins = user_origins(_kernel_stack_traces(caller), sites.is_user_file)
        except Exception:
            origins = {}
        _ORIGINS[func] = origins
    return origins


def _kernel_stack_traces(frame: FrameType | None) -> dict[str, list[str]]:
    """Inductor's provenance record of the compiled graph that called the recorder: for each
    kernel launch of its wrapper (by provenance key), the stack traces of the FX nodes the
    kernel computes. Inductor keeps it on its ``CompiledFxGraph`` but hands the recorder only
    the graph's callable; the graph is ``self`` in its ``__call__``, a few frames up."""
    for _ in range(_CALLER_FRAMES):
        if frame is None:
            break
        graph: Any = frame.f_locals.get("self")
        if hasattr(graph, "inductor_provenance_stack_traces_str"):
            text = graph.inductor_provenance_stack_traces_str
            return json.loads(text) if text else {}
        frame = frame.f_back
    return {}


def user_origins(traces: dict[str, list[str]], is_user_file: Callable[[str], bool]) -> Origins:
    """Each launch's origins: of each stack trace, the innermost frame in user code (as an op's
    call site is the innermost user frame of its stack), in order, once each."""
    origins: Origins = {}
    for key, stack_traces in traces.items():
        innermost = (
            next((f for f in reversed(traceback_frames(t)) if is_user_file(f[0])), None)
            for t in stack_traces
        )
        origins[key] = tuple(dict.fromkeys(site for site in innermost if site is not None))
    return origins


def traceback_frames(stack_trace: str) -> list[Site]:
    """The frames of a stack trace as Python formats them (and FX nodes keep them), outermost
    first."""
    return [(file, int(line), name) for file, line, name in _TRACEBACK_FRAME.findall(stack_trace)]


def kernel_launches(wrapper_source: str) -> dict[str, dict[int, str]]:
    """Where a generated wrapper module launches each kernel: name -> {line of a launch: its
    provenance key}. Inductor writes the key in a comment before the launch it describes
    (``# [Provenance debug handles] NAME:HANDLE``); a kernel launched from several places (one
    kernel serves every fused group whose code is the same) has a key for each."""
    launches: dict[str, dict[int, str]] = {}
    waiting: dict[str, str] = {}  # kernel name -> the key of its next launch
    for number, text in enumerate(wrapper_source.splitlines(), 1):
        handle = _PROVENANCE_HANDLE.search(text)
        if handle is not None:
            waiting[handle.group(1)] = f"{handle.group(1)}:{handle.group(2)}"
            continue
        for name in [n for n in waiting if _launches(text, n)]:
            launches.setdefault(name, {})[number] = waiting.pop(name)
    return launches


def _launches(line: str, kernel: str) -> bool:
    """Whether a line of a wrapper launches ``kernel``: ``NAME(...)``, or ``NAME.run(...)``
    for a Triton kernel."""
    return re.search(rf"(?<![\w.]){re.escape(kernel)}(\.run)?\(", line) is not None


# -- generated kernels ---------------------------------------------------------------------------


def _wrapper_namespace(compiled: Any) -> dict[str, Any] | None:
    """The globals of the generated wrapper module behind what Inductor hands the recorder.

    Its shape differs between torch versions (an ``InductorCompiledCallable`` holding the
    compiled graph, the graph's ``current_callable``, a closure over ``Runner.call``), so the
    objects reachable through those attributes and closure cells are searched, breadth first,
    for a function defined in a module Inductor generated."""
    queue: list[Any] = [compiled]
    seen: set[int] = set()
    while queue and len(seen) < 32:
        obj = queue.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        function = getattr(obj, "__func__", obj)
        namespace = getattr(function, "__globals__", None)
        if namespace is not None and generated_by_inductor(namespace.get("__file__") or ""):
            return namespace
        queue += [
            getattr(obj, name)
            for name in ("compiled_callable", "current_callable", "__wrapped__", "__func__")
            if getattr(obj, name, None) is not None
        ]
        for cell in getattr(function, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                queue.append(cell.cell_contents)
    return None


def _instrument(compiled: Any) -> None:
    """Wraps the kernels of the wrapper module behind ``compiled`` (``Runner.call``), once."""
    namespace = _wrapper_namespace(compiled)
    if namespace is None or namespace.get(_MARK):
        return
    namespace[_MARK] = True
    path = namespace.get("__file__")
    if not path:
        return
    with open(path) as handle:
        wrapper = handle.read()
    launches = kernel_launches(wrapper)
    for name, allocate in list(namespace.items()):
        if _ALLOCATOR.fullmatch(name) and callable(allocate):
            namespace[name] = Allocator(allocate)
    for name, (parameters, source) in kernel_sources(wrapper).items():
        kernel: Any = namespace.get(name)
        code = [["code", _digest(source)]]
        where = launches.get(name, {})
        if hasattr(kernel, "triton_meta") and hasattr(kernel, "run"):  # a CachingAutotuner
            parameters = tuple(kernel.triton_meta.get("signature", {}))
            mutated = frozenset(kernel.inductor_meta.get("mutated_arg_names", ()))
            namespace[name] = TritonKernel(kernel, Kernel(name, parameters, mutated, code, where))
        elif callable(kernel) and parameters:
            namespace[name] = CppKernel(kernel, Kernel(name, parameters, frozenset(), code, where))


def kernel_sources(wrapper_source: str) -> dict[str, tuple[tuple[str, ...], str]]:
    """Kernels a generated wrapper module defines: name -> (parameter names, source code), from
    its ``NAME = async_compile.cpp_pybinding(ARGTYPES, SOURCE)`` and
    ``NAME = async_compile.triton('NAME', SOURCE, …)`` statements. C++ parameters are read from
    the ``kernel(...)`` signature; Triton's come from the compiled kernel at run time."""
    found: dict[str, tuple[tuple[str, ...], str]] = {}
    for node in ast.parse(wrapper_source).body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr in ("cpp_pybinding", "triton")
            and len(node.value.args) >= 2
            and isinstance(node.value.args[1], ast.Constant)
            and isinstance(node.value.args[1].value, str)
        ):
            continue
        source = node.value.args[1].value
        parameters: tuple[str, ...] = ()
        if node.value.func.attr == "cpp_pybinding":
            signature = _KERNEL_SIGNATURE.search(source)
            if signature is None:
                continue
            parameters = tuple(
                re.findall(r"\w+", declaration)[-1]
                for declaration in signature.group(1).split(",")
                if declaration.strip()
            )
        found[node.targets[0].id] = (parameters, source)
    return found


@dataclass(frozen=True, eq=False)  # one per kernel: identity is its cache key
class Kernel:
    """A generated kernel as an op: ``in_ptr*`` parameters are read; ``out_ptr*`` written
    without being read; ``in_out_ptr*`` (and what Inductor lists as mutated) read and written.
    ``arguments``: the digest of its source, recorded with every launch. ``launches``: the
    provenance key of each line of the wrapper that launches it (its origins, per graph)."""

    name: str
    parameters: tuple[str, ...]
    mutated: frozenset[str]
    arguments: list[list[Any]]
    launches: dict[int, str]

    def info(self, mode: OpRecorder) -> OpInfo:
        written = {p for p in self.parameters if p.startswith(("out_ptr", "in_out_ptr"))}
        return unit_info(
            mode,
            f"{KERNEL_NAMESPACE}::{self.name}",
            self.parameters,
            frozenset(written | self.mutated),
            frozenset(p for p in self.parameters if p.startswith("out_ptr")),
        )

    def launch(self, run: Callable[..., Any], args: tuple) -> Any:
        """Runs the kernel, recorded when a region is being recorded. Called by the proxy
        method the wrapper calls: the wrapper's frame, whose line says which launch this is,
        is two frames up."""
        mode = _recorder
        if mode is None or not mode.active:
            return run(*args)
        try:
            info = mode.info_for(self, lambda: self.info(mode))
            launch = self.launches.get(sys._getframe(2).f_lineno, "")
            sites = _running.origins.get(launch, ())
            origins = [mode.call_sites.site_id(*site) for site in sites]
        except Exception as exc:  # the kernel still runs, unrecorded
            mode.fail(exc)
            return run(*args)
        return mode.record_call(info, run, args, {}, arguments=self.arguments, origins=origins)


class Allocator:
    """One of the wrapper's allocators (``empty_strided_cuda`` …): while recording, what it
    returns is known as unwritten memory (the module's docstring says why)."""

    __slots__ = ("allocate",)

    def __init__(self, allocate: Callable[..., torch.Tensor]) -> None:
        self.allocate = allocate

    def __call__(self, *args: Any) -> torch.Tensor:
        tensor = self.allocate(*args)
        mode = _recorder
        if mode is not None and mode.active:
            mode.unwritten(tensor)
        return tensor


class CppKernel:
    """A generated C++ kernel (called with tensors and sizes) in its wrapper module."""

    __slots__ = ("kernel", "spec")

    def __init__(self, kernel: Callable[..., Any], spec: Kernel) -> None:
        self.kernel = kernel
        self.spec = spec

    def __call__(self, *args: Any) -> Any:
        return self.spec.launch(self.kernel, args)


class TritonKernel:
    """A generated Triton kernel (Inductor's ``CachingAutotuner``) in its wrapper module,
    launched by ``run``; any other attribute is the kernel's own."""

    def __init__(self, kernel: Any, spec: Kernel) -> None:
        self.kernel = kernel
        self.spec = spec

    def run(self, *args: Any, **launch: Any) -> Any:
        def run_kernel(*tensors: Any) -> Any:
            return self.kernel.run(*tensors, **launch)  # stream and grid: not recorded

        return self.spec.launch(run_kernel, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)
