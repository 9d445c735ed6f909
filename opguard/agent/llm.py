"""The boundary to the model provider: LiteLLM, imported lazily, behind plain types.

Everything else in the agent speaks :class:`Request`, text pieces and :class:`Reply`, so a test
(or another client) can inject any :data:`Completion` callable, the way httpx takes a transport.
LiteLLM costs seconds to import and, by default, fetches its cost map from the internet: it is
imported only when a model is asked (never for the offline reading), with the local cost map,
and its banner off. Without it, asking a model is a :class:`ConfigError` saying to install it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .config import ConfigError
from .secrets import Secret, redact


class ProviderError(Exception):
    """The provider (or LiteLLM on its way there) failed; the message is free of secrets."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Reply:
    """A finished model turn: its text, the tools it asked for, and the provider's usage (None
    when the provider did not report it)."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Request:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    max_output: int
    api_base: str | None = None
    api_key: Secret | None = None


# Yields text pieces as they arrive, then exactly one Reply.
Completion = Callable[[Request], Iterator[str | Reply]]


@functools.cache
def litellm() -> ModuleType:
    """LiteLLM, imported once, offline: the cost map bundled with it, no banner. Raises
    ConfigError when it cannot be imported (only asking a model needs it)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm as module
    except Exception as exc:  # not installed, or an install that fails to import
        raise ConfigError(
            f"asking a model needs LiteLLM, which cannot be imported ({type(exc).__name__}: "
            f"{exc}): install it with pip install litellm, or leave out the model for the "
            "offline reading"
        ) from None
    module.suppress_debug_info = True
    return module


def count_tokens(
    model: str,
    *,
    text: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> int:
    """Tokens of a text or a prompt as LiteLLM counts them for ``model`` (its tokenizer when
    known, a default one otherwise)."""
    return int(litellm().token_counter(model=model, text=text, messages=messages, tools=tools))


def listed_prices(model: str) -> tuple[float, float] | None:
    """USD per input and per output token from LiteLLM's local cost map; None when the model
    is not listed or has no price there."""
    try:
        info = litellm().get_model_info(model)
    except Exception:  # LiteLLM raises plain Exceptions for unmapped models
        return None
    prices = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if prices[0] is None or prices[1] is None:
        return None
    return float(prices[0]), float(prices[1])


def missing_keys(model: str, api_key: Secret | None) -> list[str]:
    """The environment variables ``model``'s provider needs that are not set, as LiteLLM knows
    them (``GROQ_API_KEY``; ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``); none when
    ``api_key`` stands in for them or LiteLLM does not know the provider."""
    found = litellm().validate_environment(
        model=model, api_key=api_key.reveal() if api_key else None
    )
    return [str(name) for name in found.get("missing_keys") or ()]


class LiteLLMCompletion:
    """The default :data:`Completion`: one streamed ``litellm.completion`` call.

    ``options`` go to LiteLLM unchanged (tests pass ``mock_response``). Usage is asked for in
    the stream, so the spend is the provider's figure whenever it reports one.
    """

    def __init__(self, **options: Any) -> None:
        self.options = options

    def __call__(self, request: Request) -> Iterator[str | Reply]:
        secrets = [request.api_key] if request.api_key else []
        module = litellm()
        try:
            stream = module.completion(
                model=request.model,
                messages=request.messages,
                tools=request.tools or None,
                max_tokens=request.max_output,
                api_base=request.api_base,
                api_key=request.api_key.reveal() if request.api_key else None,
                stream=True,
                stream_options={"include_usage": True},
                **self.options,
            )
            chunks = []
            for chunk in stream:
                chunks.append(chunk)
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is not None and delta.content:
                    yield delta.content
            built = module.stream_chunk_builder(chunks, messages=request.messages)
        except Exception as exc:  # any failure on the way to the provider and back
            raise ProviderError(redact(f"{type(exc).__name__}: {exc}", secrets)) from None
        yield _reply(built)


def _reply(response: Any) -> Reply:
    """LiteLLM's assembled response as a :class:`Reply`."""
    if response is None or not response.choices:
        return Reply("")
    message = response.choices[0].message
    calls = tuple(
        ToolCall(call.id or f"call_{n}", call.function.name or "", call.function.arguments or "")
        for n, call in enumerate(message.tool_calls or ())
    )
    usage = getattr(response, "usage", None)
    return Reply(
        message.content or "",
        calls,
        Usage(int(usage.prompt_tokens), int(usage.completion_tokens)) if usage else None,
    )


def assistant_message(reply: Reply) -> dict[str, Any]:
    """The model's turn as it goes back into the conversation (OpenAI message format)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


def tool_arguments(call: ToolCall) -> Mapping[str, Any]:
    """The arguments of a tool call; malformed JSON reads as no arguments (the tool then says
    what it is missing, and the model can try again)."""
    try:
        parsed = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
