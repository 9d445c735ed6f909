"""API keys that cannot leak by accident: a wrapper that never prints its value, and a filter
for text that came back from elsewhere (provider errors can quote the key they were sent)."""

from __future__ import annotations

from collections.abc import Iterable

MASK = "[redacted]"


class Secret:
    """A string that shows as ``[redacted]`` in ``str``, ``repr`` and f-strings; only
    :meth:`reveal` gives the value, at the one place that sends it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK})"

    def __str__(self) -> str:
        return MASK

    def __bool__(self) -> bool:
        return bool(self._value)


def redact(text: str, secrets: Iterable[Secret | None]) -> str:
    """``text`` with every secret's value replaced by ``[redacted]``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret.reveal(), MASK)
    return text
