"""The on-disk layout of an OpGuard trace: one place that names every key and field.

A run directory holds ``meta.json`` (the run as a whole) and one LMDB environment per rank,
``rank-K/``. Each environment has these named databases:

``ops``
    key: 8-byte big-endian sequence number (cursor order is execution order);
    value: msgpack map, fields below.
``names`` / ``sites`` / ``stacks``
    interned op names, call sites and user stacks; key: 4-byte big-endian id.
``info``
    ``schema`` (written first), ``start`` and, on a clean end, ``end``; plus ``failure`` when
    the recorder itself stopped early, and ``gpu`` (what GPU recording could use).
``kernels``
    GPU activity of an op (kernels, memcpys, memsets from CUPTI), written when CUPTI delivers
    it; key: the op's key; value: list of maps ``k`` kind, ``n`` name, ``g`` grid, ``b``
    block, ``s`` stream, ``d`` device, ``t0``/``t1`` start/end (ns), ``z`` bytes, and ``u``
    (``1``) on GPU work launched *after* the op, outside any recorded op, by code OpGuard did
    not record (a custom extension, a raw Triton launch, a ctypes call into libcuda).
``captures``
    full contents of the tensors of ops chosen with ``opguard record --capture``; key: the op's
    key + ``x`` (input) or ``y`` (output) + 2-byte big-endian position in the record's list;
    value: map ``n`` slot, ``d`` dtype, ``s`` shape, ``c`` codec (``zlib``), ``z`` raw byte
    length, ``b`` the bytes of the elements in logical (row-major) order, compressed. The
    ``info`` entry ``capture`` says what was asked, what was stored and whether the size cap
    stopped it (:mod:`opguard.store.captures`).
``steps``
    the training state at each step boundary (step-level records, :mod:`opguard.store.states`):
    key: the step's number as an 8-byte big-endian integer; value: map ``s`` step, ``e`` list
    of state entries ``[kind, name id, slot, tensor entry]`` (kinds: STATE_KINDS; ``slot``: an
    optimizer state's key, such as ``exp_avg``, else ``""``; the tensor entry holds ``d``,
    ``s``, ``h``, ``z``, ``b``, ``m``, ``w``, ``f`` as below, ``w`` the sketch for the kinds
    of SKETCHED_STATE_KINDS only, and in traces recorded before them for none); or map ``s``
    step, ``z`` that list packed
    and zlib-compressed (what the recorder writes). Absent in traces recorded before it.
``states``
    interned names of state tensors (``transformer.h.3.mlp.c_fc.weight``, or ``group 0 param
    5`` where no module owns the parameter); key: 4-byte big-endian id.

Op record fields (short keys keep traces small; readers map them to names)::

    i  sequence number            o  op-name id            s  step
    p  phase (PHASES index)       c  call-site id          k  stack id
    f  forward op index (backward ops)                     a  non-tensor arguments [[name, value]]
    x  input tensors              y  output tensors         r  RNG-state fingerprint (random ops)
    v  non-tensor return value (e.g. of ``.item()``)    g  kernels (GPU)
    l  origins: call-site ids of the user's source lines a kernel Inductor generated was made
       from (``inductor::`` ops under ``torch.compile``; absent elsewhere and in traces
       recorded before it existed). ``c`` stays where the user called the compiled code.

Tensor entry fields::

    n  argument slot (``self``, ``tensors[2]``, ``out``, ``0`` for returns)
    d  dtype name   s  shape   t  strides   v  device
    h  64-bit fingerprint (absent: not read, see ``f``)   b  raw bytes of the first elements
    z  logical byte length    m  stats [min, max, mean, absmax, nan, inf]
    p  producer [op index, output slot] (absent: leaf)    f  flags (FLAG_*)
    w  sketch: 60 bytes, the float32 L2 norm and 14 int32 buckets from which two runs' relative
       distance is estimated (:mod:`opguard.store.sketch`); only floating-point tensors with a
       finite value (NaN and Inf add 0), and views holding their base's values in its order; absent in
       traces recorded before it
"""

from __future__ import annotations

import struct

SCHEMA_VERSION = 1
DB_NAMES = ("ops", "names", "sites", "stacks", "info", "kernels", "captures", "steps", "states")

# Kinds of step-level state entries, in the order a step computes them: the loss (the tensor
# ``backward()`` was called on), each parameter's gradient as the optimizer saw it, the
# parameters and optimizer states after its update, the modules' buffers, the RNG states.
STATE_KINDS = ("loss", "grad", "param", "state", "buffer", "rng")
# The kinds whose step-level entries keep their sketch: what ``opguard diff --tolerant`` judges
# at the step level (how far apart the runs' losses, gradients, parameters and buffers are).
# Optimizer states leave it out, as a step's record stays small (GPT-2's AdamW holds three per
# parameter); what changes them shows in the parameters they update. RNG states are bytes,
# which have no sketch.
SKETCHED_STATE_KINDS = frozenset({"loss", "grad", "param", "buffer"})
META_FILE = "meta.json"
RANK_DIR_PREFIX = "rank-"

PHASES = ("forward", "backward", "optimizer", "other")
# Namespaces of the c10d collectives' op names (``c10d::allreduce_``, ``_c10d_functional::
# all_reduce``; ``wait_tensor`` included: it returns the collective's output).
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})

# Tensor flags.
FLAG_VIEW = 1  # output of a view op: shares its input's data, not re-read
FLAG_UNINITIALIZED = 2  # memory not yet written (torch.empty and friends): content meaningless
FLAG_UNREADABLE = 4  # no raw storage to read (meta, sparse, nested, subclass)
FLAG_WRITTEN = 8  # an argument the op wrote in place (its "output" entry is the new content)

KERNEL_UNCLAIMED = "u"  # the key that flags a kernels entry as launched after the op, unrecorded

_KEY = struct.Struct(">Q")
_ID = struct.Struct(">I")
OP_KEY_SIZE = _KEY.size
ID_KEY_SIZE = _ID.size


MAX_OP_INDEX = (1 << 64) - 1  # the largest index an op key holds


def op_key(index: int) -> bytes:
    return _KEY.pack(index)


def op_index(key: bytes) -> int:
    return int(_KEY.unpack(key)[0])


def id_key(ident: int) -> bytes:
    return _ID.pack(ident)


def id_of(key: bytes) -> int:
    return int(_ID.unpack(key)[0])


def rank_dir_name(rank: int) -> str:
    return f"{RANK_DIR_PREFIX}{rank}"
