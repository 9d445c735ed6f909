"""The spending limit of one agent session, in US dollars and in tokens.

Before a call: its worst case (every counted prompt token, plus the most output tokens the call
may produce, at the model's prices) must fit in what is left, or the call is refused and never
sent. After it: the provider's reported usage is charged. The object belongs to one session;
LiteLLM's process-wide budget is never used, so two sessions (a CLI run, a TUI panel) cannot
draw on each other's allowance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PER_MILLION = 1_000_000


class BudgetRefused(Exception):
    """A call whose worst case does not fit in what is left; it was not sent."""


@dataclass(frozen=True, slots=True)
class Pricing:
    """USD per token; ``source`` says where the prices came from, for the report."""

    input_per_token: float
    output_per_token: float
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "input_usd_per_million": self.input_per_token * PER_MILLION,
            "output_usd_per_million": self.output_per_token * PER_MILLION,
            "source": self.source,
        }

    def describe(self) -> str:
        return (
            f"${self.input_per_token * PER_MILLION:.4g}/M input, "
            f"${self.output_per_token * PER_MILLION:.4g}/M output ({self.source})"
        )


@dataclass(frozen=True, slots=True)
class Bound:
    """The most one call can cost: ``prompt_tokens`` as counted, ``max_output`` as allowed."""

    prompt_tokens: int
    max_output: int
    usd: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_output


@dataclass(frozen=True, slots=True)
class Charge:
    """What one call cost; ``estimated`` when the provider reported no usage and OpGuard
    counted the tokens itself."""

    prompt_tokens: int
    completion_tokens: int
    usd: float
    estimated: bool = False

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Budget:
    usd: float
    tokens: int
    pricing: Pricing
    charges: list[Charge] = field(default_factory=list)

    @property
    def spent_usd(self) -> float:
        return sum(c.usd for c in self.charges)

    @property
    def spent_tokens(self) -> int:
        return sum(c.tokens for c in self.charges)

    @property
    def left_usd(self) -> float:
        return self.usd - self.spent_usd

    @property
    def left_tokens(self) -> int:
        return self.tokens - self.spent_tokens

    def bound(self, prompt_tokens: int, max_output: int) -> Bound:
        p = self.pricing
        usd = prompt_tokens * p.input_per_token + max_output * p.output_per_token
        return Bound(prompt_tokens, max_output, usd)

    def admit(self, bound: Bound) -> None:
        """Raises :class:`BudgetRefused` unless the call's worst case fits what is left."""
        if bound.usd > self.left_usd:
            raise BudgetRefused(
                f"call refused, not sent: it could cost up to ${bound.usd:.6f} "
                f"({bound.prompt_tokens:,} prompt + {bound.max_output:,} output tokens) but "
                f"${max(self.left_usd, 0):.6f} of the ${self.usd:g} budget is left; "
                "raise --budget or lower --max-output"
            )
        if bound.tokens > self.left_tokens:
            raise BudgetRefused(
                f"call refused, not sent: it could use up to {bound.tokens:,} tokens "
                f"({bound.prompt_tokens:,} prompt + {bound.max_output:,} output) but "
                f"{max(self.left_tokens, 0):,} of the {self.tokens:,}-token limit are left; "
                "raise --max-tokens or lower --max-output"
            )

    def charge(self, prompt_tokens: int, completion_tokens: int, *, estimated: bool) -> Charge:
        p = self.pricing
        usd = prompt_tokens * p.input_per_token + completion_tokens * p.output_per_token
        charge = Charge(prompt_tokens, completion_tokens, usd, estimated)
        self.charges.append(charge)
        return charge

    def describe(self) -> str:
        """``spent $X of $Y; T of N tokens`` for reports and the TUI meter."""
        return (
            f"spent ${self.spent_usd:.6f} of ${self.usd:g}; "
            f"{self.spent_tokens:,} of {self.tokens:,} tokens in {len(self.charges)} call(s)"
        )
