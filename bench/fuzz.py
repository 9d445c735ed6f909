"""The mutation fuzzer at scale (issue 37): N generated pairs of training programs, each with one
mutation of the catalogue (tests/fuzz_mutations.py), recorded with OpGuard, diffed bit for bit
and with ``--tolerant``, and scored against the truth oracle (tests/fuzz_oracle.py) or the
catalogue's known answer. Prints the score by mutation class: pairs run, right answers bit for
bit and under ``--tolerant``, pairs the fuzzer could not score (its own errors).

    python bench/fuzz.py [--pairs 1000] [--start 0] [--workers 2] [--mutations lr,threads]
                         [--compile-rate 0.0] [--device cpu] [--save-failures DIR] [--write-docs]

Pair ``i`` is mutation ``i mod N`` of the N classes that run on the device (in the catalogue's
order) on the program of seed ``i`` (or the next one it applies to), so ``--start`` and
``--pairs`` name the same pairs on every machine; each worker process runs many pairs
(``import torch`` costs seconds, a pair about one). ``--save-failures DIR`` keeps each wrong
or unscored pair as ``DIR/NAME/`` with its two scripts and ``failure.json`` (what OpGuard
said, bit for bit and tolerant, the right answer, the oracle's truth and the whole
``opguard.diff/1`` objects), so each can become a scenario test. ``--write-docs`` writes the
table, with the command, date and machine, into the marked block of docs/COMPARING.md.

``--device cuda`` runs the GPU programs of the same seeds (the CPU program moved to the GPU,
with a fused optimizer, bf16 autocast or a side stream drawn on top; ``numpy_write`` does not
apply there), its table for the GPU block (``bench/gpu_session.sh fuzz`` runs it on the GPU
machine and brings the table back).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fuzzer's modules
from fuzz_harness import MODES, Outcome, run_pair
from fuzz_mutations import BY_NAME, MUTATIONS, make_pair, pair_of, runnable
from readme_demo import cpu_model

DOCS = Path(__file__).resolve().parent.parent / "docs" / "COMPARING.md"
# The marked blocks of docs/COMPARING.md that --write-docs fills, by device.
BLOCKS = {
    "cpu": (
        "<!-- fuzz score: written by python bench/fuzz.py --write-docs -->",
        "<!-- end of the fuzz score -->",
    ),
    "cuda": (
        "<!-- fuzz score on a GPU: written by python bench/fuzz.py --device cuda --write-docs -->",
        "<!-- end of the GPU fuzz score -->",
    ),
}


_ROOT = ""  # each worker's scratch directory


def _start_worker() -> None:
    global _ROOT
    _ROOT = tempfile.mkdtemp(prefix="opguard-fuzz-")
    warnings.simplefilter("ignore")  # the generated programs' own (bf16 RMSNorm, …), each pair
    import torch  # noqa: F401  (once per worker, before its first pair)


@dataclass(frozen=True)
class Draw:
    """Which pairs a run draws, beside their indices: the classes (all when empty), the share of
    compiled programs and the device."""

    mutations: tuple[str, ...] = ()
    compile_rate: float = 0.0
    device: str = "cpu"


def _pair(task: tuple[int, Draw]) -> Outcome:
    """Runs the ``index``-th pair (of ``draw.mutations`` in turn, when given) in a worker."""
    index, draw = task
    if draw.mutations:
        mutation = draw.mutations[index % len(draw.mutations)]
        pair = make_pair(mutation, index, compile_rate=draw.compile_rate, device=draw.device)
    else:
        pair = pair_of(index, compile_rate=draw.compile_rate, device=draw.device)
    return run_pair(pair, Path(_ROOT))


def run(indices: range, workers: int, draw: Draw) -> Iterator[Outcome]:
    """The outcomes of the pairs ``indices``, as the workers finish them."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch state
    with context.Pool(workers, initializer=_start_worker, maxtasksperchild=200) as pool:
        yield from pool.imap_unordered(_pair, [(i, draw) for i in indices])


def table(outcomes: list[Outcome]) -> list[str]:
    """The score by mutation class as a Markdown table (classes in the catalogue's order)."""
    rows = [
        "| class | family | pairs | right bit for bit | right `--tolerant` | not scored |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    total = Counter[str]()
    for mutation in MUTATIONS:
        mine = [o for o in outcomes if o.mutation == mutation.name]
        if not mine:
            continue
        counts = _counts(mine)
        total.update(counts)
        rows.append(_row(f"`{mutation.name}`", mutation.family, counts))
    rows.append(_row("**all**", "", total))
    return rows


def _counts(outcomes: list[Outcome]) -> Counter[str]:
    counts = Counter(pairs=len(outcomes), errors=sum(bool(o.error) for o in outcomes))
    for mode in MODES:
        counts[mode] = sum(o.right(mode) for o in outcomes)
    return counts


def _row(name: str, family: str, counts: Counter[str]) -> str:
    scored = counts["pairs"] - counts["errors"]
    cells = [
        f"{counts[m]}/{scored} ({100 * counts[m] / scored:.0f}%)" if scored else "–" for m in MODES
    ]
    return f"| {name} | {family} | {counts['pairs']} | {' | '.join(cells)} | {counts['errors']} |"


def machine(device: str) -> str:
    import torch

    gpu = f"{torch.cuda.get_device_name()}, " if device == "cuda" else ""
    return (
        f"{gpu}{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), Python {platform.python_version()}"
    )


def save_failure(outcome: Outcome, root: Path, device: str) -> None:
    """``ROOT/NAME/``: the pair's scripts and ``failure.json``."""
    where = root / outcome.name
    where.mkdir(parents=True, exist_ok=True)
    for side, text in outcome.scripts.items():
        (where / f"{side}.py").write_text(text)
    failure = {
        "pair": outcome.name,
        "mutation": outcome.mutation,
        "seed": outcome.seed,
        "truth": outcome.truth,
        "error": outcome.error,
        **{
            mode: {
                "right": outcome.scores[mode].right,
                "said": outcome.scores[mode].answer,
                "right_answer": outcome.expected[mode],
                "reason": outcome.scores[mode].reason,
            }
            for mode in outcome.scores
        },
        "results": outcome.results,
        "rebuild": f"fuzz_mutations.make_pair({outcome.mutation!r}, {outcome.seed}, "
        f"device={device!r})",
    }
    (where / "failure.json").write_text(json.dumps(failure, indent=1) + "\n")


def write_docs(block: list[str], device: str) -> None:
    begin, end = BLOCKS[device]
    text = DOCS.read_text()
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOCS}: no block marked {begin!r} … {end!r}")
    DOCS.write_text(pattern.sub(lambda _: "\n".join([begin, *block, end]), text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--mutations", default="", help="comma-separated classes (default all)")
    parser.add_argument("--compile-rate", type=float, default=0.0, help="torch.compile share")
    parser.add_argument("--device", choices=tuple(BLOCKS), default="cpu")
    parser.add_argument("--save-failures", type=Path, metavar="DIR")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    mutations = tuple(m for m in args.mutations.split(",") if m)
    unknown = [m for m in mutations if m not in BY_NAME]
    if unknown:
        parser.error(f"unknown mutation classes {unknown}; known: {', '.join(BY_NAME)}")
    idle = [
        m
        for m in mutations
        if not runnable(BY_NAME[m], compile_rate=args.compile_rate, device=args.device)
    ]
    if idle:
        parser.error(
            f"mutation classes {idle} apply to no program on {args.device} with --compile-rate"
            f" {args.compile_rate}"
        )
    indices = range(args.start, args.start + args.pairs)
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    draw = Draw(mutations, args.compile_rate, args.device)
    for outcome in run(indices, args.workers, draw):
        outcomes.append(outcome)
        if len(outcomes) % 25 == 0:
            rate = len(outcomes) / (time.perf_counter() - started)
            print(f"{len(outcomes)}/{len(indices)} pairs, {rate:.2f}/s", file=sys.stderr)
        wrong = [m for m in MODES if m in outcome.scores and not outcome.scores[m].right]
        if (outcome.error or wrong) and args.save_failures is not None:
            save_failure(outcome, args.save_failures, args.device)
    seconds = time.perf_counter() - started
    command = "python bench/fuzz.py " + " ".join(sys.argv[1:])
    block = [
        f"`{command.strip()}`, {date.today().isoformat()}, {machine(args.device)}: {len(outcomes)} pairs "
        f"in {seconds / 60:.1f} min ({len(outcomes) / seconds:.2f} pairs/s, "
        f"{args.workers} workers).",
        "",
        *table(outcomes),
    ]
    print("\n".join(block))
    if args.write_docs:
        write_docs(block, args.device)


if __name__ == "__main__":
    main()
