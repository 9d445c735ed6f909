"""Unknown is never a verdict (issue 38 §1 and §3): under ``opguard diff --tolerant`` a
differing tensor whose distance the sketches cannot give (a view in one run, whose values were
never read, written in the other by ops of that run only) is judged by what it feeds, and listed
as not judged; a view op with other arguments is an argument change named at the view op, as
bit for bit.

Recorded CPU pairs (scripts in tests/data/tolerant/, runs in tests/tolerant_runs.py), one per
class issue 38 found on the GPU: bf16 autocast's cast of a transposed weight in one run (the
tied head's ``mat2``), another attention backend whose gradients are views stacked, a reshape of
one run only before the attention's backward (as another torch build's autograd), and a batch
read through a view one row later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process
from tolerant_runs import SHIFTED, SHIFTED_KINDS, record_runs

RUNS = ["attention", "attention_bf16", "attention_bf16_decay", "attention_math"]
RUNS += ["attention_reshaped", "shifted", *(f"shifted_{kind}" for kind in SHIFTED_KINDS)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return record_runs(tmp_path_factory.mktemp("tolerant_views"), RUNS)


def diff(runs: dict[str, Path], a: str, b: str, *options: str) -> dict[str, Any]:
    """``opguard diff A B OPTIONS --json``: the opguard.diff/1 object (exit status checked)."""
    code, out, err = cli_in_process("diff", str(runs[a]), str(runs[b]), *options, "--json")
    answer = json.loads(out)
    assert code == {"within-rounding": 0, "identical": 0, "diverged": 1}[answer["verdict"]], err
    return answer


def not_judged(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The tensors the rank did not judge for want of a distance (all judged by an op they
    feed: none by nothing)."""
    (rank,) = answer["ranks"]
    rounding = rank["rounding"]
    assert rounding["judged_by_nothing"] == 0
    examples: list[dict[str, Any]] = rounding["not_judged_examples"]
    assert all(e["judged_by"] is not None and e["allowed"] is not None for e in examples)
    return examples


def test_autocasts_cast_of_a_transposed_weight_is_judged_by_the_matmul_reading_it(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """bf16 autocast against fp32: the tied head reads ``embedding.weight.t()``, in run A a
    view (no sketch of its own), in run B autocast's cast of it (an op of run B only). Its
    distance is unknown; taken at what the cast's rounding allows, the ``mm`` reading it is
    within rounding, and the report (and its HTML page) lists it as not judged."""
    answer = diff(runs, "attention", "attention_bf16", "--tolerant")
    assert answer["verdict"] == "within-rounding", answer["first_divergence"]
    notes = not_judged(answer)
    assert any(n["slot"] == "mat2" and n["a"]["op"] == "aten::mm.default" for n in notes)
    mat2 = next(n for n in notes if n["slot"] == "mat2")
    assert "a view in run A" in mat2["why"] and mat2["role"] == "input"
    assert mat2["judged_by"]["a"]["index"] == mat2["a"]["index"]  # by the mm's own outputs
    assert 2**-8 <= mat2["allowed"] < 0.05  # a bf16 cast's rounding, not a free pass
    page = tmp_path / "report.html"
    code, out, _ = cli_in_process(
        "diff",
        str(runs["attention"]),
        str(runs["attention_bf16"]),
        "--tolerant",
        "--html",
        str(page),
    )
    assert code == 0 and "not judged: " in out and "input 'mat2'" in out
    assert "<th>not judged</th>" in page.read_text()


def test_a_weight_decay_changed_behind_autocast_is_named_at_the_optimizer(
    runs: dict[str, Path],
) -> None:
    """The same pair with the weight decay changed in run B: the cast is passed (it is
    rounding), and the change is named where AdamW applies it."""
    first = diff(runs, "attention", "attention_bf16_decay", "--tolerant")["first_divergence"]
    assert (first["kind"], first["step"], first["a"]["phase"]) == ("argument", 0, "optimizer")
    assert first["arguments_differ"][0]["name"] == "other"
    assert "a real change" in first["summary"]


def test_another_attention_backend_whose_gradients_are_stacked_views_is_within_rounding(
    runs: dict[str, Path],
) -> None:
    """``scaled_dot_product_attention`` against attention written out: the q, k and v
    gradients ``stack`` reads are, in the written-out run, views with no sketch; the stack's
    outputs hold their values, so they bound their distance (relative to the fused kernel's
    gradient's norm in run A)."""
    answer = diff(runs, "attention", "attention_math", "--tolerant")
    assert answer["verdict"] == "within-rounding", answer["first_divergence"]


def test_a_reshape_of_one_run_only_before_the_attention_backward_is_within_rounding(
    runs: dict[str, Path],
) -> None:
    """A reshape only run B makes (its rounding perturbed, as another build's): the attention
    backward's ``grad_out`` is a view in run A and the reshape's output in run B. It is taken
    at what the region allows (the aligned gradient it reshapes), and the backward is judged
    with it."""
    answer = diff(runs, "attention", "attention_reshaped", "--tolerant")
    assert answer["verdict"] == "within-rounding", answer["first_divergence"]
    notes = not_judged(answer)
    assert any(n["slot"] == "grad_out" for n in notes), notes


@pytest.mark.parametrize("kind", SHIFTED_KINDS)
def test_a_view_made_with_other_arguments_is_named_at_the_view_op(
    runs: dict[str, Path], kind: str
) -> None:
    """A batch read through a view one row later (a slice, a narrow, a select, an
    as_strided offset), behind rounding that differs everywhere: the view op is named, with
    its arguments, as bit for bit."""
    tolerant = diff(runs, "shifted", f"shifted_{kind}", "--tolerant")["first_divergence"]
    bitwise = diff(runs, "shifted", f"shifted_{kind}")["first_divergence"]
    called = {"select": "select(", "narrow": ".narrow(", "as_strided": "as_strided("}
    line = next(
        n
        for n, text in enumerate(SHIFTED.read_text().splitlines(), 1)
        if called.get(kind, "rows[at") in text
    )
    for first in (tolerant, bitwise):
        assert (first["kind"], first["step"]) == ("argument", 0), first["summary"]
        assert first["a"]["call_site"]["line"] == line, first["a"]
        assert first["arguments_differ"], first
    assert tolerant["a"]["op"] == bitwise["a"]["op"]
    assert [a["name"] for a in tolerant["arguments_differ"]] == [
        a["name"] for a in bitwise["arguments_differ"]
    ]
    assert "rounding changes no integer" in tolerant["summary"]
