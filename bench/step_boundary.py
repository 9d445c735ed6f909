"""The host time of the step level's fingerprints at a step's end, alone: the native call
(``fingerprint_all``) on GPT-2 124M's gradients, parameters and AdamW states on one GPU, with
nothing else running, per tensor. Set beside the same calls timed inside a training step
(``bench/overhead_profile.py --steps-only``), the difference is what the step around them adds.
With ``--hooks``, on any machine: the step recorder's hooks' own Python instead (walking the
optimizer's parameters and states, labels), the native calls stubbed out, for GPT-2 124M on
the CPU.

    python bench/step_boundary.py [--repeats 20] [--hooks]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from opguard import _C
from opguard.recorder.tensors import _PROBE, fingerprint_all


def state(seq: int = 128) -> dict[str, list[torch.Tensor]]:
    """GPT-2 124M's tensors after one AdamW step: by group, as the step recorder takes them."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (2, seq), device="cuda")
    model(tokens, labels=tokens).loss.backward()
    opt.step()
    params = list(model.parameters())
    states = [v for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return {
        "gradients": [p.grad for p in params if p.grad is not None],
        "parameters": params,
        "states on the GPU": [t for t in states if t.is_cuda],
        "states on the CPU (step counts)": [t for t in states if not t.is_cuda],
    }


def read_seconds(tensors: list[torch.Tensor], repeats: int) -> float:
    """Median host time of reading every tensor's attributes alone (dtype, shape, strides,
    device: what each fingerprint needs of the tensor, through the CPython API)."""
    readable = _PROBE.readable
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for tensor in tensors:
            readable(tensor)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_seconds(tensors: list[torch.Tensor], repeats: int) -> float:
    """Median host time of one call on ``tensors``, the GPU idle and its results collected
    between calls (so no call waits for room to launch)."""
    labels = [_C.state_label("param", k, "x") for k in range(len(tensors))]
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = fingerprint_all(tensors, labels, sketch=True)
        times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        _C.pack_entries([batch])
    return statistics.median(times)


def hook_seconds(repeats: int) -> dict[str, float]:
    """Median host time of each step hook after an AdamW step of GPT-2 124M on the CPU, with
    the native fingerprint calls replaced by a no-op: what the hooks spend in Python."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from opguard.recorder import step_records

    class Writer:  # what the step recorder asks of the trace writer
        def intern_state(self, name: str) -> int:
            return len(name)

        def put_step(self, *args: object) -> None:
            pass

    model = GPT2LMHeadModel(GPT2Config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (1, 8))
    model(tokens, labels=tokens).loss.backward()
    opt.step()
    step_records.fingerprint_all = lambda tensors, labels, sketch=False: None
    recorder = step_records.StepRecorder(Writer(), on_failure=print)
    recorder.active = True
    hooks = {
        "gradients": lambda: recorder.gradients(opt),
        "updated": lambda: recorder.updated(opt),
        "end_step": lambda: recorder.end_step(0),
    }
    times: dict[str, list[float]] = {name: [] for name in hooks}
    for _ in range(repeats + 1):  # the first: labels made
        for name, hook in hooks.items():
            t0 = time.perf_counter()
            hook()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(values[1:]) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hooks", action="store_true", help="the hooks' Python, on the CPU")
    args = parser.parse_args()
    if args.hooks:
        print("GPT-2 124M, AdamW, the step recorder's hooks without their native calls, host time")
        for name, seconds in hook_seconds(args.repeats).items():
            print(f"  {name:10} {seconds * 1e6:7.1f} µs")
        return
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing measured")
        return
    print(f"{torch.cuda.get_device_name()}, GPT-2 124M, fingerprint_all alone, host time")
    for name, tensors in state().items():
        seconds = host_seconds(tensors, args.repeats)
        per = seconds / len(tensors) * 1e6
        read = read_seconds(tensors, args.repeats) / len(tensors) * 1e6
        print(
            f"  {name:32} {len(tensors):4} tensors {seconds * 1e3:7.3f} ms {per:6.2f} µs each"
            f" (reading its attributes {read:5.2f} µs)"
        )


if __name__ == "__main__":
    main()
