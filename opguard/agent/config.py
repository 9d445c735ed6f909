"""Which model the agent asks, with what key, and how much it may spend.

Each setting comes from the first place that has it: a command-line flag, the environment
(``OPGUARD_MODEL``, ``OPGUARD_API_BASE``; provider keys such as ``GROQ_API_KEY`` are read by
LiteLLM itself), the ``[agent]`` table of ``~/.config/opguard/config.toml``, then the defaults
below. The config file may hold an API key, so it is refused unless only its owner can read it.
Before the first call the provider's key is checked (:meth:`AgentSettings.for_provider`), so a
missing one is a line naming the variable to set rather than the provider's error.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..spending_limits import (
    DEFAULT_BUDGET_USD,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_ROUNDS,
)
from .budget import PER_MILLION, Pricing

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib
from .secrets import Secret, redact

ENVIRONMENT = {"model": "OPGUARD_MODEL", "api_base": "OPGUARD_API_BASE"}
# The key sent to a server given by its API base when none is configured: LiteLLM's OpenAI
# client sends no request without one, and a local server ignores it (LiteLLM's own
# placeholder for its keyless providers).
KEYLESS_SERVER_KEY = "fake-api-key"


class ConfigError(Exception):
    """Settings that cannot be used (one line for the user, never quoting a key)."""


def _non_negative(kind: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("not a number")
        number = kind(value)
        if number < 0:
            raise ValueError("must not be negative")
        return number

    return convert


def _positive_int(value: Any) -> int:
    number: int = _non_negative(int)(value)
    if number == 0:
        raise ValueError("must be at least 1")
    return number


# setting -> conversion; these are also the keys the config file's [agent] table accepts
SETTINGS: dict[str, Callable[[Any], Any]] = {
    "model": str,
    "api_key": str,
    "api_base": str,
    "budget": _non_negative(float),
    "max_tokens": _positive_int,
    "max_output": _positive_int,
    "rounds": _non_negative(int),
    "input_price": _non_negative(float),
    "output_price": _non_negative(float),
}


@dataclass(frozen=True)
class AgentSettings:
    """What the agent may use; the key is a :class:`Secret`, so printing settings shows none."""

    model: str | None = None
    api_key: Secret | None = None
    api_base: str | None = None
    budget: float = DEFAULT_BUDGET_USD  # USD for the whole session
    max_tokens: int = DEFAULT_MAX_TOKENS  # prompt + output tokens for the whole session
    max_output: int = DEFAULT_MAX_OUTPUT  # output tokens one call may produce
    rounds: int = DEFAULT_ROUNDS  # follow-up tool rounds per question
    input_price: float | None = None  # USD per million tokens, overriding LiteLLM's map
    output_price: float | None = None

    def pricing(self, listed: Callable[[str], tuple[float, float] | None]) -> Pricing:
        """Prices given as settings, else the ones ``listed`` knows for the model."""
        if (self.input_price is None) != (self.output_price is None):
            raise ConfigError("give both --input-price and --output-price, or neither")
        if self.input_price is not None and self.output_price is not None:
            return Pricing(
                self.input_price / PER_MILLION, self.output_price / PER_MILLION, "as configured"
            )
        assert self.model is not None
        prices = listed(self.model)
        if prices is None:
            raise ConfigError(
                f"no price is known for model {self.model!r}, so no call can be bounded: "
                "pass --input-price and --output-price (USD per million tokens; 0 for a free "
                "local server)"
            )
        return Pricing(*prices, "LiteLLM's cost map")

    def for_provider(self, missing: Callable[[str, Secret | None], list[str]]) -> AgentSettings:
        """The settings a call goes out with, once ``missing`` (the environment variables the
        model's provider needs and lacks) has nothing to say. A server given by its API base
        needs no key (it is sent a placeholder when none is configured); otherwise a missing
        variable is a ConfigError naming it."""
        assert self.model is not None
        unset = missing(self.model, self.api_key)
        if not unset:
            return self
        if self.api_base is not None:
            return self if self.api_key else replace(self, api_key=Secret(KEYLESS_SERVER_KEY))
        is_, them = ("is", "it") if len(unset) == 1 else ("are", "them")
        raise ConfigError(
            f"model {self.model!r} needs {', '.join(unset)}, which {is_} not set: set {them} "
            "in the environment, or give the key with --api-key or api_key in the config file"
        )


def config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "opguard" / "config.toml"


def read_config(path: Path) -> dict[str, Any]:
    """The ``[agent]`` table of the config file ({} when there is no file)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{path} is accessible to other users (mode {mode:o}) and may hold an API key: "
            f"refusing to read it; run: chmod 600 {path}"
        )
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"{path} belongs to another user: refusing to read it")
    try:
        table = tomllib.loads(path.read_text()).get("agent", {})
    except (OSError, ValueError) as exc:  # the parser's message may quote a line: a key
        raise ConfigError(f"{path}: unreadable ({type(exc).__name__})") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [agent] must be a table")
    unknown = sorted(set(table) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)} in [agent]")
    return table


def resolve_settings(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> AgentSettings:
    """Settings from ``flags`` (None: not given), then ``env``, then the config file."""
    env = os.environ if env is None else env
    path = config_path(env) if path is None else path
    from_file = read_config(path)
    values: dict[str, Any] = {}
    for name, convert in SETTINGS.items():
        given = [
            (o, v) for o, v in _sources(name, flags, env, from_file, path) if v not in (None, "")
        ]
        if not given:
            continue
        origin, raw = given[0]
        try:
            values[name] = convert(raw)
        except (TypeError, ValueError) as exc:
            shown = "(hidden)" if name == "api_key" else repr(raw)
            keys = [Secret(str(k)) for k in (flags.get("api_key"), from_file.get("api_key")) if k]
            raise ConfigError(  # a key pasted into another setting is not shown either
                redact(f"{name} from {origin}: {shown} is not valid ({exc})", keys)
            ) from None
    key = values.pop("api_key", None)
    return AgentSettings(api_key=Secret(key) if key else None, **values)


def _sources(
    name: str,
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    from_file: Mapping[str, Any],
    path: Path,
) -> Iterator[tuple[str, Any]]:
    """Where setting ``name`` may come from, first choice first: (origin, value or None)."""
    yield f"--{name.replace('_', '-')}", flags.get(name)
    if name in ENVIRONMENT:
        yield ENVIRONMENT[name], env.get(ENVIRONMENT[name])
    yield str(path), from_file.get(name)
