"""Explaining a divergence: the evidence bundle, its rule-based reading, and a conversation with
any LiteLLM model under a per-session budget.

Importing this package never imports LiteLLM (seconds, and network unless told otherwise), nor
does the offline reading (its token count is an estimate): only asking a model does. Neither does it import Textual: the TUI's panel lives
in :mod:`opguard.agent.panel`, imported by the TUI alone.
"""

from .budget import Bound, Budget, BudgetRefused, Charge, Pricing
from .config import AgentSettings, ConfigError, resolve_settings
from .conversation import Agent, CallPlanned, CallSettled, Event, TextPiece, ToolAnswered
from .evidence import COUNT_MODEL, Evidence, build_evidence
from .llm import Completion, LiteLLMCompletion, ProviderError, Reply, Request, ToolCall, Usage
from .reading import read_divergence
from .secrets import Secret
from .session import HOW_TO_ENABLE, Session, open_session
from .tools import TOOLS, OpFocus, TraceTools

__all__ = [
    "COUNT_MODEL",
    "HOW_TO_ENABLE",
    "TOOLS",
    "Agent",
    "AgentSettings",
    "Bound",
    "Budget",
    "BudgetRefused",
    "CallPlanned",
    "CallSettled",
    "Charge",
    "Completion",
    "ConfigError",
    "Event",
    "Evidence",
    "LiteLLMCompletion",
    "OpFocus",
    "Pricing",
    "ProviderError",
    "Reply",
    "Request",
    "Secret",
    "Session",
    "TextPiece",
    "ToolAnswered",
    "ToolCall",
    "TraceTools",
    "Usage",
    "build_evidence",
    "open_session",
    "read_divergence",
    "resolve_settings",
]
