"""The scenario suite: pairs of small training scripts with answers a user would recognise.

Each script under ``tests/scenarios/`` is recorded once per session with the real CLI
(``opguard record``, a subprocess) and each pair is compared with ``opguard diff --json``. The
tests assert the verdict, the kind of the first divergence, the user's line responsible for it
(found by its ``# <- NAME`` tag in the script, never by number) and the differing arguments.

``base.py`` is the baseline; every ``variant_*.py`` is a copy of it with one change, tagged
``CHANGED`` (checked by :func:`test_variants_change_only_tagged_lines`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import line_of, run_cli
from scenario_runs import (
    ACCUMULATE,
    BASE,
    GPT2_BASE,
    PAIRS,
    PENALTY,
    SCENARIOS,
    Recordings,
    session_recordings,
)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    return session_recordings(tmp_path_factory)


def diff(a: Path, b: Path, *options: str) -> tuple[int, dict[str, Any]]:
    """``opguard diff A B --json [OPTIONS]``: exit status and the parsed object."""
    result = run_cli("diff", str(a), str(b), "--json", *options)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def assert_site(ref: dict[str, Any] | None, script: Path, tag: str) -> None:
    """An op reference of the JSON points at the tagged line of ``script``."""
    assert ref is not None
    site = ref["call_site"]
    assert Path(site["file"]).resolve() == script.resolve(), site
    assert site["line"] == line_of(script, tag), (site, ref.get("source"))
    assert f"# <- {tag}" in ref["source"]


def diverged(code: int, result: dict[str, Any]) -> dict[str, Any]:
    assert code == 1
    assert result["schema"] == "opguard.diff/1"
    assert result["verdict"] == "diverged"
    first = result["first_divergence"]
    assert first is not None and first["rank"] == 0
    return first


def identical(code: int, result: dict[str, Any]) -> None:
    assert result["verdict"] == "identical", result["first_divergence"]
    assert result["first_divergence"] is None
    assert code == 0
    assert all(r["differing"] == 0 for r in result["ranks"])


def arguments(first: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {d["name"]: (d["a"], d["b"]) for d in first["arguments_differ"]}


# -- 1. a changed learning rate ----------------------------------------------------------------


def test_changed_learning_rate(runs: Recordings) -> None:
    a, b = runs("base", "lr")
    first = diverged(*diff(a, b))
    assert first["kind"] == "argument"
    assert first["step"] == 0  # the first optimizer step already differs
    assert first["a"]["op"] == first["b"]["op"]
    assert first["a"]["phase"] == first["b"]["phase"] == "optimizer"
    assert_site(first["a"], BASE, "opt.step")
    assert_site(first["b"], SCENARIOS / "variant_lr.py", "opt.step")
    # SGD applies the update as param.add_(grad, alpha=-lr)
    assert arguments(first) == {"alpha": (-0.1, -0.2)}
    assert first["inputs_differ"] == []


# -- 2. a changed seed before dropout ------------------------------------------------------------


def test_changed_seed_before_dropout(runs: Recordings) -> None:
    a, b = runs("base", "seed")
    first = diverged(*diff(a, b))
    assert first["kind"] == "argument"
    assert first["cause"] == "rng"
    assert first["rng_state_differs"] is True
    assert first["arguments_differ"] == [] and first["inputs_differ"] == []
    assert first["step"] == 0 and first["a"]["phase"] == "forward"
    assert first["a"]["op"].startswith("aten::bernoulli")  # dropout's random mask
    assert_site(first["a"], BASE, "dropout")
    assert_site(first["b"], SCENARIOS / "variant_seed.py", "dropout")
    assert "RNG" in first["summary"]


def test_changed_seed_of_initial_weights(runs: Recordings) -> None:
    """The first op to differ is the first initialiser that draws random numbers. Its input is
    the parameter's ``torch.empty`` memory (never written, so its bytes differ between any two
    runs): that must not count as a differing input."""
    a, b = runs("base", "init_seed")
    first = diverged(*diff(a, b))
    assert first["kind"] == "argument"
    assert first["cause"] == "rng"
    assert first["inputs_differ"] == []
    assert first["a"]["op"] == "aten::uniform_.default"  # nn.Linear's kaiming_uniform_
    assert_site(first["a"], BASE, "fc1")
    assert_site(first["b"], SCENARIOS / "variant_init_seed.py", "fc1")


# -- 3. a forgotten optimizer.zero_grad() ----------------------------------------------------------


def test_forgotten_zero_grad(runs: Recordings) -> None:
    """Step 0 is identical; in step 1 run B's backward adds the new gradient to the one kept
    from step 0. The op named is that accumulation, at the ``loss.backward()`` line of run B
    (where the missing ``zero_grad()`` belongs, just above), and the hint says so."""
    a, b = runs("base", "no_zero_grad")
    variant = SCENARIOS / "variant_no_zero_grad.py"
    first = diverged(*diff(a, b))
    assert first["step"] == 1
    assert first["kind"] == "structure"
    assert first["b"]["phase"] == "backward"
    assert first["b"]["op"].startswith("aten::add_")  # accumulated in place into .grad
    assert_site(first["b"], variant, "backward")
    if first["a"] is not None:  # what run A did instead: a fresh gradient, same line
        assert_site(first["a"], BASE, "backward")
    # where it was first seen: the optimizer reading the accumulated gradient
    assert_site(first["observed"]["b"], variant, "opt.step")
    assert "zero_grad" in first["hint"]
    assert "step 0" in first["hint"]


def test_brief_leaves_out_only_the_ops_given_twice(runs: Recordings) -> None:
    """``--json --brief`` (the diff tool's answer) drops ``observed`` and the origin rank's
    ``divergence`` only where they repeat the op named: without zero_grad, the optimizer that
    first read the accumulated gradient is not the op named, so ``observed`` stays."""
    a, b = runs("base", "no_zero_grad")
    _, whole = diff(a, b)
    _, brief = diff(a, b, "--brief")
    assert brief["first_divergence"]["observed"] == whole["first_divergence"]["observed"]
    assert whole["ranks"][0]["divergence"]["b"] == whole["first_divergence"]["b"]
    assert "divergence" not in brief["ranks"][0]  # the origin rank's: the op named again
    a, b = runs("base", "lr")
    _, whole = diff(a, b)
    _, brief = diff(a, b, "--brief")
    first = whole["first_divergence"]
    assert first["observed"] == {"a": first["a"], "b": first["b"]}  # the op named: a repeat
    assert "observed" not in brief["first_divergence"]
    assert "divergence" not in brief["ranks"][0]
    rest = {k: v for k, v in first.items() if k != "observed"}
    assert brief["first_divergence"] == rest
    changed = ("first_divergence", "ranks", "nonfinite", "next")  # next: the page's cursor
    assert {k: v for k, v in brief.items() if k not in changed} == {
        k: v for k, v in whole.items() if k not in changed
    }


# -- 4. model.eval() by mistake ----------------------------------------------------------------------


def test_eval_by_mistake_turns_dropout_off(runs: Recordings) -> None:
    a, b = runs("base", "eval")
    code, result = diff(a, b)
    first = diverged(code, result)
    assert first["step"] == 0
    assert first["kind"] == "structure"
    assert first["cause"] == "removed"  # dropout ran in A only
    assert first["b"] is None
    assert_site(first["a"], BASE, "dropout")
    assert result["unaligned_a"] > 0 and result["unaligned_b"] == 0
    assert "only in run A" in first["summary"]


# -- 5. a changed activation variant ----------------------------------------------------------------


def test_gelu_approximation(runs: Recordings) -> None:
    a, b = runs("base", "gelu_tanh")
    first = diverged(*diff(a, b))
    assert first["kind"] == "argument"
    assert first["a"]["op"] == first["b"]["op"] == "aten::gelu.default"
    assert_site(first["a"], BASE, "activation")
    assert_site(first["b"], SCENARIOS / "variant_gelu_tanh.py", "activation")
    (diff_,) = first["arguments_differ"]
    assert diff_["name"] == "approximate"
    assert diff_["b"] == "tanh" and diff_["b_passed"] is True
    # run A called F.gelu(x): the op's default applied, which the report says
    assert diff_["a"] in ("none", None)
    assert "approximate" in first["summary"] and "'tanh'" in first["summary"]


def test_gelu_default_argument_is_recorded(runs: Recordings) -> None:
    a, b = runs("base", "gelu_tanh")
    first = diverged(*diff(a, b))
    assert arguments(first) == {"approximate": ("none", "tanh")}


# -- 6. loss divided by a gradient-accumulation factor in run B only ---------------------------------


def test_loss_scaled_in_one_run(runs: Recordings) -> None:
    """The division exists only in run B: the forward loss is unchanged, and the first aligned
    op that differs is the loss's backward, fed by the gradient of the inserted division."""
    a, b = runs("base", "loss_scaled")
    variant = SCENARIOS / "variant_loss_scaled.py"
    code, result = diff(a, b)
    first = diverged(code, result)
    assert first["step"] == 0
    assert first["kind"] == "structure"
    assert first["cause"] == "inserted"
    assert first["a"] is None
    assert first["b"]["op"].startswith("aten::div")
    assert_site(first["b"], variant, "scale")
    assert_site(first["observed"]["b"], variant, "loss")
    assert "only in run B" in first["summary"]
    assert result["unaligned_b"] > 0


# -- 7. a changed norm epsilon inside a library model ------------------------------------------------


def test_gpt2_layer_norm_epsilon(runs: Recordings) -> None:
    a, b = runs("gpt2", "gpt2_eps")
    first = diverged(*diff(a, b))
    assert first["kind"] == "argument"
    assert first["step"] == 0
    assert first["a"]["op"] == first["b"]["op"] == "aten::native_layer_norm.default"
    assert arguments(first) == {"eps": (1e-5, 1e-6)}


def test_gpt2_layer_norm_epsilon_call_site_is_in_transformers(runs: Recordings) -> None:
    a, b = runs("gpt2", "gpt2_eps")
    first = diverged(*diff(a, b))
    for side in ("a", "b"):
        site = first[side]["call_site"]
        assert site["file"].endswith(os.path.join("models", "gpt2", "modeling_gpt2.py")), site
        text = Path(site["file"]).read_text().splitlines()[site["line"] - 1]
        assert re.search(r"self\.ln_\w+\(", text), text  # the block's layer norm call
        assert first[side]["source"] == text.strip()


# -- 8. pairs that compute the same thing ------------------------------------------------------------


def test_rerun_is_identical(runs: Recordings) -> None:
    a, b = runs("base", "rerun")
    code, result = diff(a, b)
    identical(code, result)
    assert result["unaligned_a"] == result["unaligned_b"] == 0
    assert result["aligned"] > 200


def test_logging_that_adds_ops_is_identical(runs: Recordings) -> None:
    a, b = runs("base", "logging")
    code, result = diff(a, b)
    identical(code, result)
    assert result["unaligned_a"] == 0
    assert result["unaligned_b"] > 0  # the norms, and their .item()


def test_refactor_that_keeps_numerics_is_identical(runs: Recordings) -> None:
    """Moved and edited lines, a helper function, ``torch.flatten`` for ``view``, ``F.relu``
    for ``torch.relu`` and an inserted ``* 1.0`` (new ops, equal outputs)."""
    a, b = runs("base", "refactor")
    code, result = diff(a, b)
    identical(code, result)
    _, rerun = diff(*runs("base", "rerun"))
    assert result["aligned"] == rerun["aligned"]  # every op of A found its partner
    assert result["unaligned_a"] == 0
    assert result["unaligned_b"] > 0  # the multiplications by 1.0 and their gradients


# -- 9. ties between equally long alignments, settled by data flow -------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("base", "item_log"),  # two .item() calls on one log line where A has one
        ("stats_once", "stats_twice"),  # a helper called twice at one call site, once in A
        ("stats_twice", "stats_once"),
        ("peaks_2", "peaks_3"),  # a loop with one more iteration, at its start
        ("peaks_3", "peaks_2"),
        ("reorder_1", "reorder_2"),  # two independent statistics in the other order
    ],
)
def test_ties_settled_by_data_flow_stay_identical(runs: Recordings, a: str, b: str) -> None:
    """Keys alone cannot say which of two equal-keyed ops of one run corresponds to the other
    run's single op: the pairing whose inputs agree does, and nothing else differs."""
    code, result = diff(*runs(a, b))
    identical(code, result)
    # Every op of the run with fewer ops found its partner: the extra ops are unaligned.
    fewer, more = sorted((result["unaligned_a"], result["unaligned_b"]))
    if (a, b) != ("reorder_1", "reorder_2"):
        assert fewer == 0 and more > 0


def test_loop_with_a_real_extra_iteration_names_it(runs: Recordings) -> None:
    """A loop that runs its body once more in B and changes the numbers: the extra iteration is
    named (the tie settling never moves a real difference)."""
    a, b = runs("base", "deeper")
    variant = SCENARIOS / "variant_deeper.py"
    first = diverged(*diff(a, b))
    assert first["step"] == 0
    assert (first["kind"], first["cause"]) == ("structure", "inserted")
    assert first["a"] is None and first["b"]["op"] == "aten::relu.default"
    assert_site(first["b"], variant, "relu")
    assert_site(first["observed"]["a"], BASE, "head")


# -- 10. a difference every reader absorbs is not the first divergence --------------------------


def test_unwritten_workspace_read_and_ignored_is_identical(runs: Recordings) -> None:
    """A custom op returns a workspace it never writes; run B's allocation history leaves other
    bits there; the op that reads it ignores them. Noted as absorbed, not a divergence."""
    a, b = runs("workspace", "workspace_ballast")
    code, result = diff(a, b)
    identical(code, result)
    rank = result["ranks"][0]
    assert rank["absorbed_count"] == 4  # the workspace of every step's log line
    absorbed = rank["absorbed"][0]
    assert absorbed["op"] == "scenario::normalized.default" and absorbed["slots"] == ["1"]
    assert len(absorbed["readers"]) == 1  # scenario::peak, whose output agrees
    assert any(n.startswith("absorbed: scenario::normalized") for n in result["notes"])
    assert [a["step"] for a in rank["absorbed"]] == [0, 1, 2, 3]
    assert [s["absorbed"] for s in rank["steps"][:4]] == [1, 1, 1, 1]


def test_absorbed_rows_are_marked_and_not_stepped_to(runs: Recordings) -> None:
    """The op list (TUI, ``opguard ops``) marks the absorbed pair and passes it by."""
    from opguard.analysis import diff_runs
    from opguard.analysis.browse.rows import RankRows, Side, Status
    from opguard.store import Run

    a, b = runs("workspace", "workspace_ballast")
    with Run(a) as ra, Run(b) as rb:
        rows = RankRows(ra.rank(0), rb.rank(0))
        index = diff_runs(ra, rb).ranks[0].absorbed[0].a.index
        assert rows.row_of(Side.A, index).status is Status.DIFFERING  # before the diff
        rows.set_diff(diff_runs(ra, rb).ranks[0])
        row = rows.row_of(Side.A, index)
        assert row is not None and row.status is Status.ABSORBED
        statuses = {r.status for step in rows.steps for r in rows.rows(step)}
        assert Status.DIFFERING not in statuses and not Status.ABSORBED.differs


def test_real_difference_after_an_absorbed_one_is_named(runs: Recordings) -> None:
    a, b = runs("workspace", "workspace_ballast_lr")
    first = diverged(*diff(a, b))
    assert (first["kind"], first["step"]) == ("argument", 0)
    assert arguments(first) == {"alpha": (-0.1, -0.2)}
    assert_site(first["a"], SCENARIOS / "variant_workspace.py", "opt.step")
    report = run_cli("diff", str(a), str(b)).stdout
    assert "absorbed: scenario::normalized" in report


# -- 11. runs that differ only in how they round ------------------------------------------------


@pytest.mark.parametrize("micro", ["accum", "one_batch"])
def test_thread_count_names_the_first_reduction_that_rounds_otherwise(
    runs: Recordings, micro: str
) -> None:
    """One and two intra-op threads: the final LayerNorm's backward sums its weight and bias
    gradients in another split. Its gradients reach ``.grad`` through ``detach`` views and
    meet the next micro-batch's (or every other layer's, in the clipping norm) at one reader:
    two differences that reach only that reader reach it together, so neither is absorbed and
    the earlier is named, where its inputs were still equal."""
    a, b = runs(f"{micro}_threads_1", f"{micro}_threads_2")
    first = diverged(*diff(a, b))
    assert (first["kind"], first["cause"], first["step"]) == ("origin", "origin", 0)
    assert first["a"]["op"] == "aten::native_layer_norm_backward.default"
    assert first["a"] == first["observed"]["a"]
    assert_site(first["a"], ACCUMULATE, "final_norm")
    assert {d["slot"] for d in first["outputs_differ"]} == {"1", "2"}
    assert first["inputs_differ"] == []
    assert first["likely_causes"][0]["kind"] == "environment"


def test_a_sum_in_another_order_is_not_a_divergence(runs: Recordings) -> None:
    """The L2 penalty summed over the parameters reversed: the aligned ``pow`` of one run reads
    the parameter the other run squares last, and its backward expands the gradient to the
    parameters' shapes in the other order. The total, and so the training, is bit for bit
    equal: nothing differs but partial results, so the runs are identical, with a note naming
    the penalty's line (not the parameters' initialisation named a divergence); under
    ``--tolerant``, within rounding."""
    a, b = runs("penalty", "penalty_reversed")
    code, result = diff(a, b)
    identical(code, result)
    (rank,) = result["ranks"]
    assert sum(s["reordered"] for s in rank["steps"]) > 0
    (note,) = [n for n in rank["notes"] if n.startswith("reordered:")]
    assert f"{PENALTY.name}:{line_of(PENALTY, 'penalty')} (<genexpr>)" in note
    code, result = diff(a, b, "--tolerant")
    assert (code, result["verdict"]) == (0, "within-rounding"), result["first_divergence"]


@pytest.mark.parametrize(("a", "b"), [pair for pair in PAIRS if pair != ("base", "rerun")])
def test_tolerant_names_every_real_change_that_bitwise_names(
    runs: Recordings, a: str, b: str
) -> None:
    """Every scenario pair compared bit for bit and with ``--tolerant``: where the bitwise
    diff names a change (none of these pairs differs by rounding), the tolerant diff names the
    same ops for the same kind of reason; where it finds none, neither does the tolerant one."""
    run_a, run_b = runs(a, b)
    _, bitwise = diff(run_a, run_b)
    _, tolerant = diff(run_a, run_b, "--tolerant")
    first = bitwise["first_divergence"]
    if first is None:
        assert tolerant["verdict"] in ("identical", "within-rounding"), tolerant
        return
    named = tolerant["first_divergence"]
    assert tolerant["verdict"] == "diverged" and named is not None, tolerant["ranks"]
    assert (named["kind"], named["step"]) == (first["kind"], first["step"]), named["summary"]
    for side in ("a", "b"):
        assert (named[side] or {}).get("index") == (first[side] or {}).get("index"), side


# -- narrowing, exit codes, the human report, runs of different lengths ------------------------------


def test_step_narrowing(runs: Recordings) -> None:
    a, b = runs("base", "no_zero_grad")
    code, result = diff(a, b, "--step", "0")
    identical(code, result)
    assert [s["step"] for s in result["ranks"][0]["steps"]] == [0]
    code, result = diff(a, b, "--step", "1")
    first = diverged(code, result)
    assert first["step"] == 1 and first["kind"] == "structure"
    assert [s["step"] for s in result["ranks"][0]["steps"]] == [1]


def test_step_narrowing_after_the_first_divergence(runs: Recordings) -> None:
    """Compared alone, step 1 of the learning-rate pair starts from different weights: the
    report says they were made before the compared step, not that an op was replaced."""
    a, b = runs("base", "lr")
    first = diverged(*diff(a, b, "--step", "1"))
    assert first["step"] == 1
    assert first["kind"] == "propagated"
    assert first["cause"] == "earlier-step"
    assert "--step" in first["summary"]


def test_rank_narrowing(runs: Recordings) -> None:
    a, b = runs("base", "lr")
    code, whole = diff(a, b)
    code_0, rank_0 = diff(a, b, "--rank", "0")
    assert (code_0, rank_0["first_divergence"]) == (code, whole["first_divergence"])
    assert [r["rank"] for r in rank_0["ranks"]] == [0]
    missing = run_cli("diff", str(a), str(b), "--rank", "1", "--json")
    assert missing.returncode == 2
    assert "rank 1" in missing.stderr and not missing.stdout


def test_exit_codes(runs: Recordings, tmp_path: Path) -> None:
    a, b = runs("base", "lr")
    rerun = runs("rerun")[0]
    assert run_cli("diff", str(a), str(rerun)).returncode == 0
    assert run_cli("diff", str(a), str(b)).returncode == 1
    gone = run_cli("diff", str(a), str(tmp_path / "no-such-run"))
    assert gone.returncode == 2
    assert "no such run directory" in gone.stderr and "Traceback" not in gone.stderr
    beyond = run_cli("diff", str(a), str(b), "--step", "99")  # nothing to compare is no verdict
    assert beyond.returncode == 2 and "step 99" in beyond.stderr
    short = runs("base_2_steps")[0]
    only_a = run_cli("diff", str(a), str(short), "--step", "3")
    assert only_a.returncode == 2 and "only in run A" in only_a.stderr
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    assert run_cli("diff", str(not_a_run), str(a), "--json").returncode == 2


def test_human_report_names_op_and_source_line(runs: Recordings) -> None:
    a, b = runs("base", "lr")
    result = run_cli("diff", str(a), str(b))
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "DIVERGED" in out
    assert "aten::add_.Tensor" in out
    assert f"{line_of(BASE, 'opt.step')} │ opt.step()" in out
    assert "alpha" in out and "-0.1" in out and "-0.2" in out

    a, b = runs("base", "eval")
    out = run_cli("diff", str(a), str(b)).stdout
    assert "aten::mul.Tensor" in out
    assert f"{line_of(BASE, 'dropout')} │ h = self.drop(h)" in out

    a, b = runs("base", "no_zero_grad")
    out = run_cli("diff", str(a), str(b)).stdout
    assert "hint:" in out and "zero_grad" in out
    assert "loss.backward()" in out


def test_runs_of_different_lengths(runs: Recordings) -> None:
    full, short = runs("base", "base_2_steps")
    for a, b, longer in ((full, short, "A"), (short, full, "B")):
        code, result = diff(a, b)
        identical(code, result)
        rank = result["ranks"][0]
        assert [s["step"] for s in rank["steps"]] == [0, 1]  # aligned up to the shorter run
        assert any(
            f"run {longer} has" in n and "compared the first 2" in n for n in result["notes"]
        ), result["notes"]
    lr = runs("lr")[0]
    first = diverged(*diff(short, lr))  # a divergence inside the common part is still found
    assert first["step"] == 0 and first["kind"] == "argument"


def test_human_report_notes_different_lengths(runs: Recordings) -> None:
    full, short = runs("base", "base_2_steps")
    out = run_cli("diff", str(full), str(short)).stdout
    assert "IDENTICAL" in out and "compared the first 2" in out


# -- the scenario scripts themselves -----------------------------------------------------------------


def _body(path: Path) -> list[str]:
    """The script without its module docstring."""
    text = path.read_text()
    end = text.index('"""', 3) + 3
    return text[end:].splitlines()


@pytest.mark.parametrize("variant", sorted(p.name for p in SCENARIOS.glob("variant_*.py")))
def test_variants_change_only_tagged_lines(variant: str) -> None:
    base = GPT2_BASE if "gpt2" in variant else BASE
    added = [
        line[1:]
        for line in difflib.unified_diff(_body(base), _body(SCENARIOS / variant), lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert added, f"{variant} does not differ from {base.name}"
    untagged = [line for line in added if line.strip() and "CHANGED" not in line]
    assert not untagged, untagged
