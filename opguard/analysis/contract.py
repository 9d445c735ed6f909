"""The ``opguard diff --json`` object (schema ``opguard.diff/1``).

Its specification is docs/json-contract.md: every key written here is named there, and is a
promise to scripts (never removed or renamed; more keys may be added).
"""

from __future__ import annotations

from typing import Any

from ..store import CallSite, OpRecord
from .divergence.compilation import compile_modes
from .divergence.model import Divergence, TensorDiff
from .divergence.nonfinite import Nonfinite, nonfinite_tensors
from .result import RankDiff, RunDiff
from .state_diff import ENTRIES_SHOWN, StateComparison, StepDivergence
from .tolerant.distance import finite
from .tolerant.envelope import envelope_json
from .tolerant.judgement import Unjudged

SCHEMA = "opguard.diff/1"


def op_ref(op: OpRecord | None) -> dict[str, Any] | None:
    if op is None:
        return None
    return {
        "index": op.index,
        "op": op.op,
        "call_site": op.call_site.to_json(),
        "phase": op.phase,
        "step": op.step,
        **({"source": op.call_site.source_line()} if op.call_site.source_line() else {}),
        # a kernel Inductor generated: the user's lines it computes (call_site: the caller's)
        **({"origins": [_origin(site) for site in op.origins]} if op.origins else {}),
    }


def _origin(site: CallSite) -> dict[str, Any]:
    line = site.source_line()
    return {**site.to_json(), **({"source": line} if line else {})}


def _tensor_pair(d: TensorDiff) -> dict[str, Any]:
    return {
        "slot": d.slot,
        "a": d.a.to_json() if d.a else None,
        "b": d.b.to_json() if d.b else None,
    }


def divergence_json(div: Divergence) -> dict[str, Any]:
    return {
        "rank": div.rank,
        "step": div.step,
        "kind": div.kind,
        "a": op_ref(div.a),
        "b": op_ref(div.b),
        "cause": div.cause,
        "summary": div.summary,
        "hint": div.hint or None,
        "likely_causes": [c.to_json() for c in div.likely_causes],
        "observed": {"a": op_ref(div.observed_a), "b": op_ref(div.observed_b)},
        "outputs_differ": [_tensor_pair(d) for d in div.outputs],
        "inputs_differ": [_tensor_pair(d) for d in div.inputs],
        "arguments_differ": [
            {"name": d.name, "a": d.a, "b": d.b, "a_passed": d.a_passed, "b_passed": d.b_passed}
            for d in div.arguments
        ],
        "rng_state_differs": div.rng_differs,
        "kernels": {
            "a": [k.to_json() for k in div.observed_a.kernels],
            "b": [k.to_json() for k in div.observed_b.kernels],
        },
        "kernels_differ": div.kernels_differ,
        "stream_race": div.race or None,
        "unrecorded_writes": [w.to_json() for w in div.windows],
        "chain": [
            {"a": link.a.index, "b": link.b.index, "op": link.a.op, "slot": link.slot}
            for link in div.chain
        ],
    }


def state_divergence_json(div: StepDivergence) -> dict[str, Any]:
    """A step-level divergence under the keys of an op-level one (no op: ``a``, ``b`` and
    ``observed`` are null), with the state entry that differs first under ``state``, the
    step's other differing entries (``states_differ``) and those in one run only."""
    compared = div.comparison
    by_kind = compared.by_kind()
    return {
        "rank": div.rank,
        "step": div.step,
        "kind": div.kind,
        "a": None,
        "b": None,
        "cause": div.cause,
        "summary": div.summary,
        "hint": div.hint,
        "likely_causes": [],
        "observed": None,
        "outputs_differ": [],
        "inputs_differ": [],
        "arguments_differ": [],
        "rng_state_differs": "rng" in by_kind,
        "kernels": {"a": [], "b": []},
        "kernels_differ": False,
        "stream_race": None,
        "unrecorded_writes": [],
        "chain": [],
        "known_difference": None,
        "state": div.first.to_json(),
        "states_differ": {
            "count": len(compared.differing),
            "by_kind": {
                kind: {"count": len(pairs), "first": pairs[0].label}
                for kind, pairs in by_kind.items()
            },
            "first": [pair.to_json() for pair in compared.differing[:ENTRIES_SHOWN]],
        },
        "states_only_in": {
            "a": [entry.label for entry in compared.only_a[:ENTRIES_SHOWN]],
            "b": [entry.label for entry in compared.only_b[:ENTRIES_SHOWN]],
            "count_a": len(compared.only_a),
            "count_b": len(compared.only_b),
        },
        "beyond": _beyond_json(div),
    }


def _beyond_json(div: StepDivergence) -> dict[str, Any] | None:
    """Under --tolerant, the step's entries beyond the rounding envelope (None: bit for bit)."""
    if not div.beyond:
        return None
    by_kind: dict[str, list[str]] = {}
    for judged in div.beyond:
        by_kind.setdefault(judged.a.kind, []).append(judged.label)
    return {
        "count": len(div.beyond),
        "by_kind": {
            kind: {"count": len(labels), "first": labels[0]} for kind, labels in by_kind.items()
        },
        "first": [judged.to_json() for judged in div.beyond[:ENTRIES_SHOWN]],
    }


def first_divergence_json(result: RunDiff) -> dict[str, Any] | None:
    """The op-level first divergence; where there is none, the first step whose state
    differs (step-level records); else None."""
    first = result.first
    if first is not None:
        found = {**divergence_json(first), "known_difference": result.known_difference or None}
        judged = result.first_judgement
        if result.tolerance is not None:  # --tolerant: what rounding did not explain
            found["distance"] = judged.to_json() if judged is not None else None
        return found
    state = result.state_first
    return state_divergence_json(state) if state is not None and result.diverged else None


def _states_json(states: StateComparison | None) -> dict[str, Any] | None:
    """A rank's step-level records compared (None: a run holds none)."""
    if states is None:
        return None
    first = states.first
    return {
        "records_a": states.records_a,
        "records_b": states.records_b,
        "compared": states.compared,
        "first_differing_step": first.step if first else None,
        "cause": first.cause if first else None,
        "entry": first.first.label if first else None,
        "steps_only_in_a": states.only_in_a,
        "steps_only_in_b": states.only_in_b,
        "rounding": states.tolerance.to_json() if states.tolerance is not None else None,
    }


def step_level_json(result: RunDiff) -> dict[str, Any] | None:
    """The step-level records' verdict beside the op-level one: the first step whose state
    differs, and whether it did already when the op records began (a window)."""
    if all(r.states is None for r in result.ranks):
        return None
    first = result.state_first
    starts = [r.steps[0].step for r in result.ranks if r.steps]
    start = min(starts) if starts else None
    return {
        "first_differing_step": first.step if first else None,
        "rank": first.rank if first else None,
        "cause": first.cause if first else None,
        "entry": first.first.label if first else None,
        "window_start": start,
        "differed_before_window": None
        if start is None
        else first is not None and first.step < start,
        "envelope": envelope_json(result.tolerance)
        if result.tolerance is not None
        and any(r.states and r.states.tolerance for r in result.ranks)
        else None,
    }


def _role_json(r: RankDiff) -> dict[str, Any]:
    """The rank's part in the divergence and where its own first divergence is (the top-level
    ``first_divergence`` is an origin's: these say what every other rank saw)."""
    role, div = r.role, r.first
    if role is None or div is None:
        return {"role": None, "divergence": None}
    return {
        "role": role.role,
        "divergence": {
            "step": div.step,
            "kind": div.kind,
            "cause": div.cause,
            "summary": div.summary,
            "a": op_ref(div.a or div.observed_a),
            "b": op_ref(div.b or div.observed_b),
        },
        "collective": op_ref(role.collective),
        "group": role.group,
    }


def rank_json(r: RankDiff) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "aligned": r.aligned,
        "unaligned_a": r.only_a,
        "unaligned_b": r.only_b,
        "differing": r.differing,
        "steps_a": r.steps_a,
        "steps_b": r.steps_b,
        "ops_after_last_step_a": r.count_a.ops_after,
        "ops_after_last_step_b": r.count_b.ops_after,
        "unaligned_a_examples": r.unaligned_a,
        "unaligned_b_examples": r.unaligned_b,
        "steps": [
            {
                "step": s.step,
                "aligned": s.aligned,
                "unaligned_a": s.only_a,
                "unaligned_b": s.only_b,
                "differing": s.differing,
                "absorbed": s.absorbed,
                "reordered": len(s.reordered_pairs),
            }
            for s in r.steps
        ],
        "absorbed": [a.to_json() for a in r.absorbed],
        "absorbed_count": r.absorbed_count,
        "notes": r.notes,
        **_role_json(r),
        "level": "op" if r.ops_compared else "step",
        "step_level": _states_json(r.states),
        **(
            {
                "rounding": {
                    "explained": r.tolerance.explained,
                    "flips": r.tolerance.flips,
                    "measured": r.tolerance.measured,
                    "not_judged": r.tolerance.unjudged_count,
                    "judged_by_nothing": r.tolerance.judged_by_nothing,
                    "not_judged_examples": [unjudged_json(u) for u in r.tolerance.unjudged],
                }
            }
            if r.tolerance is not None
            else {}
        ),
        "layout": r.layout.to_json() if r.layout is not None else None,
    }


def unjudged_json(u: Unjudged) -> dict[str, Any]:
    """A differing tensor whose distance was unknown (--tolerant), and what judged it."""
    by = u.judged_by
    return {
        "step": u.step,
        "a": op_ref(u.ops[0]),
        "b": op_ref(u.ops[1]),
        "slot": u.slot,
        "role": u.role,
        "why": u.why,
        "allowed": finite(u.allowed),
        "judged_by": {"a": op_ref(by[0]), "b": op_ref(by[1])} if by is not None else None,
        "reached_nothing": u.reached_nothing,
        "text": u.text(),
    }


def _nonfinite_op(op: OpRecord | None) -> dict[str, Any] | None:
    if op is None:
        return None
    return {
        **(op_ref(op) or {}),
        "inputs": [{"slot": s, "nan": n, "inf": i} for s, n, i in nonfinite_tensors(op.inputs)],
        "outputs": [{"slot": s, "nan": n, "inf": i} for s, n, i in nonfinite_tensors(op.outputs)],
    }


def nonfinite_json(n: Nonfinite) -> dict[str, Any]:
    """Where NaN/Inf values first appeared in one rank (``opguard nan``, the diff's
    ``nonfinite``)."""
    return {
        "rank": n.rank,
        "origin": _nonfinite_op(n.origin),
        "nan_origin": _nonfinite_op(n.nan_origin),
        "first_seen": _nonfinite_op(n.first_seen),
        "from_outside": n.from_outside,
        "ops": n.ops,
        "intended": {"ops": n.intended, "first": _nonfinite_op(n.first_intended)}
        if n.intended
        else None,
    }


def to_json(result: RunDiff) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "verdict": result.verdict,
        "first_divergence": first_divergence_json(result),
        "aligned": sum(r.aligned for r in result.ranks),
        "unaligned_a": sum(r.only_a for r in result.ranks),
        "unaligned_b": sum(r.only_b for r in result.ranks),
        "runs": {"a": result.path_a, "b": result.path_b},
        "ranks": [rank_json(r) for r in result.ranks],
        "notes": result.notes,
        "origin_ranks": result.origin_ranks,
        "torch_compile": compile_modes(result.meta_a, result.meta_b),
        "ranks_only_in": {"a": result.only_in_a, "b": result.only_in_b},
        "nonfinite": {
            **{
                side: [
                    nonfinite_json(n) for r in result.ranks if (n := getattr(r, attr)) is not None
                ]
                for side, attr in (("a", "nonfinite_a"), ("b", "nonfinite_b"))
            },
            "same_in_both": all(r.nonfinite_same for r in result.ranks),
        }
        if all(r.nonfinite_scanned for r in result.ranks)
        else None,
        "step_level": step_level_json(result),
        "tolerance": result.tolerance.to_json() if result.tolerance is not None else None,
        "drift": [{"step": step, "max_rel_distance": finite(d)} for step, d in result.drift()]
        if result.tolerance is not None
        else None,
        "unread": [
            {"rank": r.rank, "run": name.lower(), "why": why}
            for r in result.ranks
            for name, why in r.unread
        ],
        "scope": result.scope() or None,
        "ranks_not_compared": [{"rank": k, "why": why} for k, why in result.not_compared],
    }


def brief_json(whole: dict[str, Any]) -> dict[str, Any]:
    """``opguard diff --json --brief`` (the diff tool's default answer): the object without the
    ops it gives twice. ``first_divergence.observed``, the origin rank's ``divergence`` and a
    non-finite ``first_seen`` are left out where they are the op beside them, so a missing key
    reads "the same as that op"; nothing else changes."""
    first = whole["first_divergence"]
    out = {**whole}
    if first is not None:
        out["first_divergence"] = _without_repeat(
            first, "observed", _same_ops(first["observed"], first)
        )
        out["ranks"] = [
            _without_repeat(
                r, "divergence", r["rank"] == first["rank"] and _same_ops(r["divergence"], first)
            )
            for r in whole["ranks"]
        ]
    if whole["nonfinite"] is not None:
        out["nonfinite"] = {
            side: [_without_repeat(n, "first_seen", _same_op(n, "origin")) for n in found]
            if side != "same_in_both"
            else found
            for side, found in whole["nonfinite"].items()
        }
    return out


def _without_repeat(obj: dict[str, Any], key: str, repeats: bool) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != key} if repeats else obj


def _same_ops(pair: dict[str, Any] | None, first: dict[str, Any]) -> bool:
    """``pair`` names the ops the first divergence's ``a`` and ``b`` do (the difference was
    seen at the op named, not after an inserted or removed op that fed it)."""
    return pair is not None and all(_index(pair[s]) == _index(first[s]) for s in ("a", "b"))


def _same_op(n: dict[str, Any], other: str) -> bool:
    return _index(n["first_seen"]) == _index(n[other])


def _index(op: dict[str, Any] | None) -> int | None:
    return None if op is None else op["index"]
