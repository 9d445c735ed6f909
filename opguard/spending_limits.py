"""The agent's default limits (``opguard explain``, the TUI's agent panel), apart from
:mod:`opguard.agent` so that ``opguard explain --help`` shows them without loading the agent
(building the command line must stay cheap for every command)."""

from __future__ import annotations

DEFAULT_BUDGET_USD = 0.05  # USD for the whole session
DEFAULT_MAX_TOKENS = 40_000  # prompt + output tokens for the whole session
DEFAULT_MAX_OUTPUT = 2_048  # output tokens one call may produce
DEFAULT_ROUNDS = 3  # follow-up tool rounds per question
