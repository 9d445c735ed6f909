"""Why an op made different outputs from equal inputs: its likely causes, ranked, each with the
evidence the traces hold for it.

An origin (equal inputs and arguments, different outputs) has few possible causes. Ranked:

1. a **stream race**: the op's GPU work started before the write of one of its inputs, on
   another stream, had finished (the kernels' recorded times; :mod:`.gpu_work`);
2. the runs computed in **different environments** that reach the op: another torch build,
   CUDA, cuDNN, cuBLAS, NCCL, GPU or CPU model, CPU capability, thread count, TF32, matmul
   precision or deterministic settings, a numerics environment variable, or another version of
   a package whose code called the op (:mod:`opguard.store.environment`);
3. the same environment, **different kernels** chosen (library heuristics, autotuning);
4. the same environment, an op PyTorch **documents as nondeterministic** on that device
   (:data:`NONDETERMINISTIC`, from the documentation of ``torch.use_deterministic_algorithms``);
5. GPU work OpGuard did not record ran between an input's producer and the op;
6. only when nothing else explains it: code OpGuard does not record (an extension, a NumPy
   view, a ``.data`` write) changed a CPU input after its fingerprint was taken.

Observed evidence at the op itself (a race) ranks above differences in how the runs were set
up, and those above what is known of the op in general. An unrecorded write is read from a
``propagated`` difference's chain; a race found there ranks first too. Other kinds (argument,
RNG, leaf, structure) name their cause already and get none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ...store import OpRecord, RankTrace
from ...store.environment import (
    ANY,
    COLLECTIVE,
    CPU,
    CUDA,
    ENV_PREFIX,
    ENV_SCOPES,
    FIELDS,
    PACKAGES,
    SETTING,
    Environment,
)
from ..words.text import short_kernel_name
from ..words.verdict import Cause
from .gpu_work import StreamRace, kernel_names, short_op_name
from .model import Divergence, LikelyCause

# Kinds of likely cause (the ``kind`` of each entry of ``likely_causes`` in the JSON).
STREAM_RACE = "stream-race"
ENVIRONMENT = "environment"
KERNELS = "different-kernels"
NONDETERMINISTIC_OP = "nondeterministic-op"
UNRECORDED_GPU_WORK = "unrecorded-gpu-work"
UNRECORDED_WRITE = "unrecorded-write"
UNVERIFIED_INPUT = "unverified-input"  # the last resort: a guess, not evidence

ITEMS_NAMED = 4  # environment differences named in the cause; the evidence lists them all
KERNELS_NAMED = 2  # distinct kernel names per run in the different-kernels cause


# -- ops PyTorch documents as nondeterministic --------------------------------------------------

MAKES_DETERMINISTIC = "make it deterministic"
REFUSES = "refuse it"


@dataclass(frozen=True, slots=True)
class Nondeterministic:
    """Ops (overload left out) PyTorch documents as nondeterministic on ``devices``: why, and
    what ``torch.use_deterministic_algorithms(True)`` does to them. ``when``: a condition on
    the call (an argument value), when only some calls are."""

    ops: frozenset[str]
    devices: frozenset[str]
    why: str
    mode: str  # MAKES_DETERMINISTIC | REFUSES
    when: Callable[[OpRecord], bool] | None = None
    # Settings (store.environment fields) that, on in both runs, made the op deterministic.
    off_when: tuple[str, ...] = ("deterministic_algorithms",)
    source: str = "is documented nondeterministic"


def _argument(name: str, *values: Any) -> Callable[[OpRecord], bool]:
    return lambda op: dict(op.args).get(name) in values


def _overload(*names: str) -> Callable[[OpRecord], bool]:
    return lambda op: op.op.rpartition(".")[2] in names


def _floating_input(op: OpRecord) -> bool:
    return any(t.dtype.startswith(("float", "bfloat", "complex")) for t in op.inputs[:1])


def _has_input(slot: str) -> Callable[[OpRecord], bool]:
    return lambda op: any(t.slot == slot for t in op.inputs)


def _ops(*names: str) -> frozenset[str]:
    return frozenset(f"aten::{name}" for name in names)


_CUDA, _BOTH = frozenset({"cuda"}), frozenset({"cuda", "cpu"})
_ATOMICS = "atomics: the order of its additions varies"
_DUPLICATES = "duplicate indices: which write lands last varies"

# One table, from the lists in the documentation of torch.use_deterministic_algorithms (ops
# that act deterministically when it is on, and ops it refuses), named by the ATen ops they run
# as, plus the fused attention backwards, which PyTorch warns default to a nondeterministic
# algorithm (split key blocks added with atomics) unless it is on.
NONDETERMINISTIC = (
    Nondeterministic(
        _ops("convolution", "_convolution", "convolution_backward", "cudnn_convolution")
        | _ops("cudnn_convolution_transpose"),
        _CUDA,
        "cuDNN may choose a nondeterministic algorithm",
        MAKES_DETERMINISTIC,
        off_when=("deterministic_algorithms", "cudnn_deterministic"),
    ),
    Nondeterministic(
        _ops("index_add_", "index_add", "index_select_backward", "scatter_add_", "scatter_add")
        | _ops("replication_pad1d_backward", "replication_pad2d_backward")
        | _ops("replication_pad3d_backward", "max_pool3d_with_indices_backward"),
        _CUDA,
        _ATOMICS,
        MAKES_DETERMINISTIC,
    ),
    Nondeterministic(
        _ops("scatter_reduce_", "scatter_reduce"),
        _CUDA,
        _ATOMICS,
        MAKES_DETERMINISTIC,
        when=_argument("reduce", "sum", "mean"),
    ),
    Nondeterministic(
        _ops("scatter_", "scatter"),
        _CUDA,
        _DUPLICATES,
        MAKES_DETERMINISTIC,
        _overload("src", "reduce"),
    ),
    Nondeterministic(_ops("index_copy_", "index_copy"), _BOTH, _DUPLICATES, MAKES_DETERMINISTIC),
    Nondeterministic(
        _ops("index_put_", "index_put", "_index_put_impl_"),
        _BOTH,
        _DUPLICATES,
        MAKES_DETERMINISTIC,
        when=_argument("accumulate", False),
    ),
    Nondeterministic(
        _ops("index_put_", "index_put", "_index_put_impl_", "put_", "put"),
        frozenset({"cpu"}),
        "parallel accumulation: the order of its additions varies",
        MAKES_DETERMINISTIC,
        when=_argument("accumulate", True),
    ),
    Nondeterministic(
        _ops("_scaled_dot_product_efficient_attention_backward", "_efficient_attention_backward")
        | _ops("_scaled_dot_product_flash_attention_backward", "_flash_attention_backward"),
        _CUDA,
        "key blocks split across thread blocks and added with atomics",
        MAKES_DETERMINISTIC,
        source="defaults to a nondeterministic algorithm, PyTorch warns",
    ),
    Nondeterministic(
        _ops("avg_pool3d_backward", "_adaptive_avg_pool2d_backward")
        | _ops("_adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward")
        | _ops("fractional_max_pool2d_backward", "fractional_max_pool3d_backward")
        | _ops("upsample_linear1d_backward", "upsample_bilinear2d_backward")
        | _ops("upsample_bicubic2d_backward", "upsample_trilinear3d_backward")
        | _ops("reflection_pad1d_backward", "reflection_pad2d_backward")
        | _ops("reflection_pad3d_backward", "grid_sampler_2d_backward")
        | _ops("grid_sampler_3d_backward", "_ctc_loss_backward", "nll_loss_forward")
        | _ops("nll_loss2d_forward", "histc"),
        _CUDA,
        _ATOMICS,
        REFUSES,
        off_when=(),
    ),
    Nondeterministic(
        _ops("_embedding_bag_backward", "_embedding_bag_dense_backward"),
        _CUDA,
        _ATOMICS,
        REFUSES,
        when=_argument("mode", 2),  # mode='max'
        off_when=(),
    ),
    Nondeterministic(
        _ops("bincount"), _CUDA, _ATOMICS, REFUSES, when=_has_input("weights"), off_when=()
    ),
    Nondeterministic(
        _ops("scatter_reduce_", "scatter_reduce"),
        _CUDA,
        _ATOMICS,
        REFUSES,
        when=_argument("reduce", "prod"),
        off_when=(),
    ),
    Nondeterministic(
        _ops("cumsum", "cumsum_"),
        _CUDA,
        "a parallel scan whose order of additions varies",
        REFUSES,
        when=_floating_input,
        off_when=(),
    ),
    Nondeterministic(
        _ops("median"),
        _CUDA,
        "which of equal values' indices it returns varies",
        REFUSES,
        when=_overload("dim", "dim_values"),
        off_when=(),
    ),
    Nondeterministic(
        _ops("max_unpool2d", "max_unpool3d"), _BOTH, _DUPLICATES, REFUSES, off_when=()
    ),
    Nondeterministic(
        _ops("put_", "put"), _BOTH, _DUPLICATES, REFUSES, _argument("accumulate", False), ()
    ),
    Nondeterministic(
        _ops("put_", "put"), _CUDA, _ATOMICS, REFUSES, _argument("accumulate", True), ()
    ),
)


def _device(op: OpRecord) -> str:
    """Where the op ran: ``cuda`` when any of its tensors is on a GPU, else ``cpu``."""
    tensors = (*op.inputs, *op.outputs)
    return "cuda" if any(t.device.startswith("cuda") for t in tensors) else "cpu"


def documented_nondeterministic(op: OpRecord) -> Nondeterministic | None:
    """The table's entry for this call of ``op``, if PyTorch documents it nondeterministic."""
    base = op.op.rpartition(".")[0] or op.op
    device = _device(op)
    return next(
        (
            entry
            for entry in NONDETERMINISTIC
            if base in entry.ops
            and device in entry.devices
            and (entry.when is None or entry.when(op))
        ),
        None,
    )


# -- differences in the environment ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnvDifference:
    key: str  # a store.environment field, env.NAME, or packages.NAME
    label: str
    a: Any
    b: Any
    setting: bool  # a setting (else a build, library or hardware)

    def named(self) -> str:
        return f"{self.label} ({_shown(self.a)} vs {_shown(self.b)})"

    def evidence(self) -> str:
        return f"{self.key}: {_shown(self.a)} (A) vs {_shown(self.b)} (B)"


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _scopes(op: OpRecord) -> set[str]:
    """Which environment fields can change ``op``: those of every op, of its device, and of
    collectives when it is one."""
    collective = op.op.startswith(("c10d::", "_c10d_functional::", "c10d_functional::"))
    return {ANY, CUDA if _device(op) == "cuda" else CPU} | ({COLLECTIVE} if collective else set())


def environment_differences(
    env_a: Environment, env_b: Environment, op: OpRecord, files: tuple[set[str], set[str]]
) -> list[EnvDifference]:
    """The differences between the runs' environments that can change ``op``: fields and
    variables of its device (or of every op), and packages that hold a file of its call stack
    (``files``, per run). A field known in one run only is not a difference."""
    scopes = _scopes(op)
    a, b = env_a.fields, env_b.fields

    def differs(key: str) -> bool:
        return key in a and key in b and a[key] != b[key]

    found = [
        EnvDifference(f.key, f.label, a[f.key], b[f.key], f.kind == SETTING)
        for f in FIELDS
        if f.scope in scopes and differs(f.key) and not (f.refines and differs(f.refines))
    ]
    found += [
        EnvDifference(ENV_PREFIX + name, name, a[ENV_PREFIX + name], b[ENV_PREFIX + name], True)
        for name, scope in ENV_SCOPES.items()
        if scope in scopes and differs(ENV_PREFIX + name)
    ]
    packages_a, packages_b = _packages(a, files[0]), _packages(b, files[1])
    found += [
        EnvDifference(f"{PACKAGES}.{name}", f"{name} versions", version, packages_b[name], False)
        for name, version in sorted(packages_a.items())
        if name in packages_b and packages_b[name] != version
    ]
    return found


def _packages(fields: dict[str, Any], files: set[str]) -> dict[str, str]:
    """Version of each recorded package that holds one of ``files``."""
    recorded = fields.get(PACKAGES)
    if not isinstance(recorded, dict):
        return {}
    return {
        name: str(entry.get("version"))
        for name, entry in recorded.items()
        if isinstance(entry, dict)
        and any(
            file == path or file.startswith(path.rstrip("/") + "/")
            for path in entry.get("paths") or ()
            for file in files
        )
    }


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _environment_cause(found: list[EnvDifference], kernels: str) -> LikelyCause:
    named = [d.named() for d in found[:ITEMS_NAMED]]
    if len(found) > ITEMS_NAMED:
        named.append(f"{len(found) - ITEMS_NAMED} more")
    effect = (
        "the op may run another algorithm, precision or split of its work"
        if all(d.setting for d in found)
        else "the op's implementation differs"
    )
    evidence = "recorded environments: " + "; ".join(d.evidence() for d in found)
    return LikelyCause(
        ENVIRONMENT,
        f"different {_and(named)}: {effect}",
        evidence + (f"; {kernels}" if kernels else ""),
    )


# -- the ranking --------------------------------------------------------------------------------


def _kernel_list(names: list[str]) -> str:
    distinct = list(dict.fromkeys(short_kernel_name(n) for n in names))
    shown = distinct[:KERNELS_NAMED] + (
        [f"+{len(distinct) - KERNELS_NAMED} more"] if len(distinct) > KERNELS_NAMED else []
    )
    return ", ".join(shown) or "none"


def _kernels_text(op_a: OpRecord, op_b: OpRecord) -> str:
    """The op's kernels in both runs, for the evidence ('' when none were recorded)."""
    a, b = kernel_names(op_a), kernel_names(op_b)
    if not a and not b:
        return ""
    if a == b:
        return f"the op's kernels: the same in both runs ({_kernel_list(a)})"
    return f"the op's kernels differ: {_kernel_list(a)} (A) vs {_kernel_list(b)} (B)"


def _stack_files(trace: RankTrace, op: OpRecord) -> set[str]:
    return {op.call_site.file, *(site.file for site in trace.stack(op.stack_id))}


def _reused_cpu_inputs(op: OpRecord) -> bool:
    """Whether ``op`` ran on the CPU and read a tensor a recorded op produced (whose fingerprint
    the recorder reuses unless told to verify inputs)."""
    return all(t.device == "cpu" for t in (*op.inputs, *op.outputs)) and any(
        t.producer is not None for t in op.inputs
    )


def likely_causes(
    div: Divergence,
    traces: tuple[RankTrace, RankTrace],
    race: StreamRace | None,
    unrecorded_gpu_work: str,
    *,
    beyond_rounding: bool = False,
) -> list[LikelyCause]:
    """The likely causes of ``div``, most likely first (see the module's docstring).
    ``race``: the stream race found where the difference was read; ``unrecorded_gpu_work``:
    the hint naming GPU work no recorded op launched before an origin, or ''.
    ``beyond_rounding``: ``div`` differs by more than rounding explains (``--tolerant``), so
    what only changes rounding (a setting such as the thread count or TF32, the kernels a
    library chose) is not a cause; another implementation (a build, a library) still is."""
    found = []
    if race is not None:
        found.append(
            LikelyCause(STREAM_RACE, race.sentence(), f"run {race.run.name}: {race.times()}")
        )
    if div.cause is Cause.UNRECORDED_WRITE and div.chain:
        link = div.chain[-1]
        found.append(
            LikelyCause(
                UNRECORDED_WRITE,
                "code OpGuard did not record changed an input between its producer and its reader",
                "; ".join(w.text() for w in div.windows)
                or f"input '{link.slot}' of {link.a.op} #{link.a.index} was equal in both runs "
                "when written and differs when read",
            )
        )
    elif div.cause is Cause.ORIGIN and div.a is not None and div.b is not None:
        found += _origin_causes(
            div.a,
            div.b,
            traces,
            unrecorded_gpu_work,
            raced=bool(found),
            beyond_rounding=beyond_rounding,
        )
    return found


def _origin_causes(
    op_a: OpRecord,
    op_b: OpRecord,
    traces: tuple[RankTrace, RankTrace],
    unrecorded_gpu_work: str,
    *,
    raced: bool,
    beyond_rounding: bool,
) -> list[LikelyCause]:
    """An origin's causes after a race: the environment (or, the same environment in all that
    can change the op, other kernels), a documented nondeterministic op, unrecorded GPU work;
    and when nothing at all (``raced`` included) explains it, the unverified CPU input."""
    env_a, env_b = traces[0].environment, traces[1].environment
    files = (_stack_files(traces[0], op_a), _stack_files(traces[1], op_b))
    differences = environment_differences(env_a, env_b, op_a, files)
    if beyond_rounding:
        differences = [d for d in differences if not d.setting]
    same = "same environment, " if not differences and env_a.recorded and env_b.recorded else ""
    kernels_a, kernels_b = kernel_names(op_a), kernel_names(op_b)
    found = []
    if differences:
        found.append(_environment_cause(differences, _kernels_text(op_a, op_b)))
    elif kernels_a != kernels_b and not beyond_rounding:
        found.append(
            LikelyCause(
                KERNELS,
                f"{same}different kernels chosen: {_kernel_list(kernels_a)} (A) vs "
                f"{_kernel_list(kernels_b)} (B)",
                f"{_kernels_text(op_a, op_b)}; libraries choose kernels by heuristics, "
                "autotuning (cudnn.benchmark, torch.compile) or the workspace free at the time",
            )
        )
    entry = documented_nondeterministic(op_a)
    if entry is not None and not _made_deterministic(entry, env_a, env_b):
        found.append(_nondeterministic_cause(entry, op_a, same))
    if unrecorded_gpu_work:
        found.append(
            LikelyCause(
                UNRECORDED_GPU_WORK,
                "GPU work OpGuard did not record may have written an input after its "
                "fingerprint was taken",
                unrecorded_gpu_work,
            )
        )
    if not found and not raced and _reused_cpu_inputs(op_a):
        found.append(
            LikelyCause(
                UNVERIFIED_INPUT,
                "code OpGuard does not record may have changed an input after its fingerprint "
                "was taken (nothing else recorded explains the difference)",
                "the op ran on the CPU, where equal inputs give equal outputs unless an op is "
                "nondeterministic; its inputs' fingerprints were taken when they were produced, "
                "not when it read them",
            )
        )
    return found


def _made_deterministic(entry: Nondeterministic, env_a: Environment, env_b: Environment) -> bool:
    """Whether a setting that makes the op deterministic was on in both runs."""
    return any(
        all(env.fields.get(setting) in (True, "on") for env in (env_a, env_b))
        for setting in entry.off_when
    )


def _nondeterministic_cause(entry: Nondeterministic, op: OpRecord, same: str) -> LikelyCause:
    device = "CUDA" if _device(op) == "cuda" else "the CPU"
    return LikelyCause(
        NONDETERMINISTIC_OP,
        f"{same}`{short_op_name(op)}` on {device} {entry.source} ({entry.why}): "
        f"`torch.use_deterministic_algorithms(True)` would {entry.mode}",
        f"{op.op} ran on {_device(op)} with equal inputs and arguments in both runs",
    )


def first_cause(causes: Iterable[LikelyCause]) -> LikelyCause | None:
    """The most likely cause shown by evidence (the last resort, an unverified input, is a
    guess)."""
    return next((c for c in causes if c.kind != UNVERIFIED_INPUT), None)
