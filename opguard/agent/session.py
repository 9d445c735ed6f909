"""One explain session over a diff, as the CLI and the TUI both open it: the evidence bundle
and its rule-based reading always; an agent, with its own budget, when a model is configured
and there is something to explain. Only the agent needs LiteLLM: without one, it is never
imported (the offline reading takes a fraction of a second instead of seconds)."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis import RunDiff
from ..store import Run
from .budget import Budget
from .config import AgentSettings
from .conversation import Agent
from .evidence import Evidence, build_evidence
from .llm import Completion, LiteLLMCompletion, listed_prices, litellm, missing_keys
from .tools import TraceTools

HOW_TO_ENABLE = (
    "To ask a model, name one: --model groq/openai/gpt-oss-20b (key in GROQ_API_KEY), or any "
    'LiteLLM model string; or set OPGUARD_MODEL, or model = "…" under [agent] in '
    "~/.config/opguard/config.toml (chmod 600). A local OpenAI-compatible server: --model "
    "openai/NAME --api-base URL --input-price 0 --output-price 0."
)


@dataclass
class Session:
    result: RunDiff
    evidence: Evidence
    settings: AgentSettings
    agent: Agent | None  # None: no model configured, or the runs are identical

    @property
    def reading(self) -> list[str]:
        return list(self.evidence.data["reading"])


def open_session(
    result: RunDiff,
    run_a: Run,
    run_b: Run,
    settings: AgentSettings,
    complete: Completion | None = None,
) -> Session:
    """Builds the evidence and, when there is a model and a divergence, an agent. Raises
    ConfigError, before any call, when LiteLLM cannot be imported, when the model's price is
    unknown and not given (no call could be bounded), or when the provider's key is missing
    (checked for LiteLLM's own completion; an injected ``complete`` brings its provider)."""
    first = result.first or (result.state_first if result.diverged else None)
    if settings.model is None or first is None:
        return Session(result, build_evidence(result, run_a, run_b), settings, None)
    litellm()  # counting the prompt's tokens needs it, whoever completes
    budget = Budget(settings.budget, settings.max_tokens, settings.pricing(listed_prices))
    if complete is None:
        settings = settings.for_provider(missing_keys)
        complete = LiteLLMCompletion()
    evidence = build_evidence(result, run_a, run_b, model=settings.model)
    paired = {r.rank: r.trace_ranks for r in result.ranks}
    tools = TraceTools(run_a, run_b, first.rank, paired)
    agent = Agent(evidence, settings, budget, tools, complete)
    return Session(result, evidence, settings, agent)
