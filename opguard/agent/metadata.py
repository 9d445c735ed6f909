"""What differs between the two runs' ``meta.json``: versions, devices, environment, argv.

A divergence with equal inputs often has its reason here (another torch, another GPU, another
``OMP_NUM_THREADS``), so these go into the evidence. Fields that differ between any two runs
(start and end times) or restate others (the full ``opguard record`` command, which adds only the
run directory to ``argv``) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.words.text import value_text
from ..store.environment import KEY as ENVIRONMENT
from ..store.environment import PACKAGES

IGNORED = frozenset({"started", "ended", "command"})
# Fields that change numerics by themselves (as opposed to argv, ops, exit status, ...).
ENVIRONMENTAL = ("python", "torch", "cuda", "opguard", "devices", "platform", "world_size", "host")
# Prefixes of the flattened recorded environment (and of environment variables), all of which
# are environmental.
ENVIRONMENTAL_PREFIXES = ("env.", f"{ENVIRONMENT}.", f"{PACKAGES}.")


@dataclass(frozen=True, slots=True)
class MetaDiff:
    key: str  # a meta.json field, or env.NAME for a recorded environment variable
    a: Any  # None: absent in that run
    b: Any

    @property
    def environmental(self) -> bool:
        return self.key in ENVIRONMENTAL or self.key.startswith(ENVIRONMENTAL_PREFIXES)

    def text(self) -> str:
        return f"{self.key}: {_shown(self.a)} (A) vs {_shown(self.b)} (B)"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "a": self.a, "b": self.b}


def _shown(value: Any) -> str:
    return "(unset)" if value is None else value_text(value)


def _flat(meta: dict[str, Any]) -> dict[str, Any]:
    """One level: environment variables as ``env.NAME``, the recorded environment as
    ``environment.FIELD`` (less what the top level states already) and ``packages.NAME`` (the
    version)."""
    flat = {k: v for k, v in meta.items() if k not in IGNORED and k not in ("env", ENVIRONMENT)}
    flat.update({f"env.{k}": v for k, v in (meta.get("env") or {}).items()})
    recorded = meta.get(ENVIRONMENT) or {}
    for key, value in recorded.items():
        if key == PACKAGES and isinstance(value, dict):
            flat.update(
                {
                    f"{PACKAGES}.{name}": p.get("version")
                    for name, p in value.items()
                    if isinstance(p, dict)
                }
            )
        elif key != "env" and key not in meta:  # variables: as env.NAME above
            flat[f"{ENVIRONMENT}.{key}"] = value
    return flat


def differing_metadata(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> list[MetaDiff]:
    """Fields whose values differ, in key order."""
    a, b = _flat(meta_a), _flat(meta_b)
    return [
        MetaDiff(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    ]
