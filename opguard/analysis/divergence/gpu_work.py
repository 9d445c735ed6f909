"""An op's GPU work as recorded (CUPTI kernels, memcpys, memsets with stream and start/end
times), and what it shows: which kernels an op chose, and stream races.

A stream race: an op's first kernel started reading an input on one stream before the last
kernel that wrote that input, on another stream, had finished (no ``wait_stream`` or event
between them). The op that wrote the memory is not always the input's producer: ops that only
alias memory launch nothing (``view``, ``t``, ``detach``, and the ``_unsafe_view`` a batched
``torch.matmul`` returns of its ``mm`` output), so the writer is found by following such ops
back to the first that ran GPU work.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...store import KernelEntry, OpRecord, RankTrace
from ..words.text import short_kernel_name
from ..words.verdict import Side

MAX_ALIAS_HOPS = 16  # kernel-less ops followed back from an input to the op that wrote it


def kernel_names(op: OpRecord) -> list[str]:
    return [k.name for k in op.kernels if k.is_kernel]


def short_op_name(op: OpRecord) -> str:
    """``aten::index_add_.default`` reads ``index_add_``; other namespaces stay
    (``c10d::allreduce_``)."""
    name = op.op.removeprefix("aten::")
    base, _, _ = name.rpartition(".")
    return base or name


@dataclass(frozen=True, slots=True)
class StreamRace:
    """In run ``run``, ``reader``'s first kernel (``read``) started before ``writer``'s last
    kernel (``write``), on another stream, finished writing an input ``reader`` read, reached
    through the kernel-less ops ``through`` (reader's side first)."""

    run: Side
    reader: OpRecord
    writer: OpRecord
    through: tuple[OpRecord, ...]
    read: KernelEntry  # both timed: start and end recorded
    write: KernelEntry

    @property
    def early_us(self) -> float:
        """How long before the write ended the read started, in µs."""
        return ((self.write.end_ns or 0) - (self.read.start_ns or 0)) / 1e3

    def sentence(self) -> str:
        return (
            f"race: `{short_op_name(self.reader)}` on stream {self.read.stream} started "
            f"{self.early_us:.1f} µs before its input's writer `{short_op_name(self.writer)}` "
            f"on stream {self.write.stream} finished"
        )

    def times(self) -> str:
        """The two kernels' times, from the start of the writing kernel."""
        t = self.write.start_ns or 0
        via = ", ".join(f"{op.op} #{op.index}" for op in self.through)
        return (
            f"{self.writer.op} #{self.writer.index} wrote with "
            f"{short_kernel_name(self.write.name)} on stream "
            f"{self.write.stream} from 0.0 to {((self.write.end_ns or 0) - t) / 1e3:.1f} µs; "
            f"{self.reader.op} #{self.reader.index} read with "
            f"{short_kernel_name(self.read.name)} on stream {self.read.stream} "
            f"from {((self.read.start_ns or 0) - t) / 1e3:.1f} µs"
            + (f"; the input reached it through {via}, which launched no GPU work" if via else "")
        )

    def text(self) -> str:
        return f"run {self.run.name}: {self.sentence()} ({self.times()}): a missing wait_stream or event"


def memory_writer(trace: RankTrace, produced: tuple[int, int]) -> tuple[OpRecord, list[OpRecord]]:
    """The op whose GPU work wrote output ``produced`` (op index, slot), and the kernel-less ops
    it was reached through: an op that launched nothing wrote nothing, so its tensor input
    (``self`` first) is followed back. Returns the last op reached when the chain ends (no GPU
    work recorded anywhere on it)."""
    op = trace.op(produced[0])
    through: list[OpRecord] = []
    for _ in range(MAX_ALIAS_HOPS):
        if op.kernels:
            break
        source = sorted(
            (t for t in op.inputs if t.producer is not None), key=lambda t: t.slot != "self"
        )
        if not source or source[0].producer is None:
            break
        through.append(op)
        op = trace.op(source[0].producer[0])
    return op, through


def stream_race(run: Side, trace: RankTrace, reader: OpRecord) -> StreamRace | None:
    """The stream race at op ``reader`` in run ``run``, if one of its inputs was written on
    another stream by GPU work that had not finished when its own started."""
    reads = [k for k in reader.kernels if k.start_ns is not None]
    if not reads:
        return None
    first_read = min(reads, key=lambda k: k.start_ns or 0)
    for tensor in reader.inputs:
        if tensor.producer is None:
            continue
        writer, through = memory_writer(trace, tensor.producer)
        writes = [k for k in writer.kernels if k.end_ns is not None]
        if not writes:
            continue
        last_write = max(writes, key=lambda k: k.end_ns or 0)
        if last_write.stream != first_read.stream and (last_write.end_ns or 0) > (
            first_read.start_ns or 0
        ):
            return StreamRace(run, reader, writer, tuple(through), first_read, last_write)
    return None
