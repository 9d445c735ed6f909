"""Where the recorder's host time per op goes, by part, from a sampling profile of native and
Python frames together (py-spy, which is not an OpGuard dependency: ``pip install py-spy``).

Two steps: record a workload under py-spy, then fold its stacks into the recorder's parts::

    py-spy record --native -r 200 -f raw -o stacks.txt -- \\
        python bench/host_profile.py [--model gpt2-tiny] [--steps 300]
    python bench/host_profile.py --fold stacks.txt

The workload records ``--steps`` training steps of one of ``bench/record_cpu.py``'s models on the
CPU (one intra-op thread), or with ``--gpu`` ``bench/overhead.py``'s GPT-2 124M step (``--bf16``
for autocast; on a GPU host keep ``--steps`` to a few and the rate low: native unwinding stops
the process at every sample). Build the extension with symbols for the native parts to show by
name: ``pip install . -C install.strip=false -C cmake.build-type=RelWithDebInfo``.

Only the samples inside the recorder's dispatch handler during the measured steps are folded
(an unrecorded step and a recorded one come first, to pay one-off costs), each into one part:
the op itself (the call back into PyTorch, its kernel included) wherever it appears on the
stack, else the innermost frame that names a part. The shares say what a per-op host path built
below Python would no longer pay (the dispatch into Python, the attribute reads through the
CPython API) and what it would still do (provenance, call sites, records).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# (part, frame name patterns): a sample counts in the part of its innermost frame that matches
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("tensor attributes read through the CPython API", ("THPVariable", "THPSize", "THPDtype")),
    ("fingerprints (hashing, GPU launches)", ("fingerprint", "launch", "TensorProbe::flush")),
    (
        "provenance (which op wrote each tensor)",
        (
            "EntryRecorder::find",
            "EntryRecorder::remember",
            "EntryRecorder::sweep",
            "EntryRecorder::settle",
            "EntryRecorder::Known",
            "storage_of",
            "view_content",
        ),
    ),
    ("call site (stack walk)", ("CallRecorder::locate", "StackWalker", "callstack")),
    (
        "record building and packing",
        (
            "OpRecord::",
            "Entry::pack",
            "Content::pack",
            "MsgpackOut",
            "EntryRecorder::entry",
            "CallRecorder::finish",
            "returned_tensors",
        ),
    ),
    ("argument walk (op plan)", ("OpPlan::",)),
    (
        "handing over the GIL and waking the writer",
        ("PyThread_release_lock", "sem_post", "take_gil", "drop_gil", "TraceWriter"),
    ),
    (
        "the dispatch into Python and back",
        (
            "__torch_dispatch__",
            "OpRecorder.",
            "subclass_call",
            "pybind11::cpp_function",
            "pythonFallback",
            "handle_torch_function",
            "CallRecorder::call",
        ),
    ),
]
THE_OP = "_get_operation_for_overload_or_packet"  # OpOverload.__call__: the op run from Python
HANDLER = "OpRecorder.__torch_dispatch__"
MEASURED = "measured_steps"  # the workload's function around the steps whose samples count


def part_of(frames: list[str]) -> str:
    """The part one sample's stack (outermost frame first) is counted in: the op itself wherever
    it is on the stack, else the part of the innermost frame that names one (frames of the C++
    library, pybind11 and CPython's object handling name none and count for their caller)."""
    inner = frames[frames.index(HANDLER) :]
    if any(THE_OP in frame for frame in inner):
        return "the op itself (PyTorch, its kernel included)"
    for frame in reversed(inner):
        for part, patterns in PARTS:
            if any(pattern in frame for pattern in patterns):
                return part
    return "other"


def fold(path: Path) -> None:
    """Prints each part's share of the samples taken inside the recorder's dispatch handler."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r" \(.*", "", frame) for frame in stack.split(";")]
        if HANDLER in frames and MEASURED in frames and count.isdigit():
            counts[part_of(frames)] += int(count)
    total = sum(counts.values())
    if not total:
        print(f"no sample of {path} is inside {HANDLER} in {MEASURED}: was the workload recorded?")
        return
    print(f"{total} samples inside the recorder's dispatch handler, by part:")
    for part, count in counts.most_common():
        print(f"  {count / total:6.1%}  {part}")


def workload(args: argparse.Namespace) -> None:
    """Records ``args.steps`` steps of the chosen model, and says how long a step took."""
    import torch

    import opguard

    bench = Path(__file__).resolve().parent
    sys.path.insert(0, str(bench))
    if args.gpu:
        from overhead import build

        step, _ = build(8, 1024, bf16=args.bf16)
    else:
        from record_cpu import MODELS

        torch.set_num_threads(1)
        step = MODELS[args.model][1]()
    step()  # torch's one-off work: cuDNN's attention plans (compiled by NVRTC), the allocator
    with opguard.record(tempfile.mkdtemp(prefix="opguard-profile-")):
        step()  # the recorder's one-off work: op plans, call sites
        started = time.perf_counter()
        measured_steps(step, args.steps)
        if args.gpu:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / args.steps
    print(f"{args.steps} recorded steps, {seconds * 1e3:.1f} ms each")


def measured_steps(step: Callable[[], object], steps: int) -> None:
    """Runs the steps whose samples :func:`fold` counts (it looks for this frame): the steps
    before it pay one-off costs that would otherwise dominate a short profile (on a GPU, the
    first bf16 step's attention plans took 60% of the samples inside the handler)."""
    for _ in range(steps):
        step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fold", type=Path, help="py-spy's raw output to fold into parts")
    parser.add_argument("--model", default="gpt2-tiny", help="a bench/record_cpu.py model")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--gpu", action="store_true", help="GPT-2 124M on the GPU instead")
    parser.add_argument("--bf16", action="store_true", help="with --gpu: under bf16 autocast")
    args = parser.parse_args()
    if args.fold:
        fold(args.fold)
    else:
        workload(args)


if __name__ == "__main__":
    main()
