"""What a tool is: a name, a one-line purpose, typed parameters and a handler, from which every
front is derived (the ``opguard tools`` listing, the CLI subcommand's arguments, the MCP input
schema), so the three cannot drift apart.

Answers are JSON objects bounded in size: a paged answer (:class:`Pages`) keeps fewer items when
it would pass :data:`MAX_CHARS` and says where to go on (``next``); anything else past the cap
is cut with a marker. An agent therefore never receives more than a known number of characters
from one call, whatever the trace.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .children import Refused
from .store.errors import TraceError

MAX_CHARS = 12_000  # per answer: about 3,000 tokens at ~4 characters a token
Kind = Literal["string", "integer", "number", "boolean", "array"]
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
}
_COMMAND_LINE_TYPES: dict[str, type] = {"integer": int, "number": float, "string": str}


class ToolError(Exception):
    """A call a tool cannot answer (bad arguments, a run that cannot be read): one line, exit
    status 2 on the CLI, an error result over MCP."""


@dataclass(frozen=True, slots=True)
class Param:
    """One argument of a tool, as JSON (``name``) and on the command line (``flag``, or
    positional when it has none; ``rest``: after ``--``, like a script and its arguments).

    ``help`` says what the argument is, never its default: the JSON schema gives ``default``
    apart, and :meth:`add_to` adds it to a command's ``--help``. ``bare`` is the value
    of the flag given alone (``--tolerant`` is ``--tolerant=auto``): the value is then
    optional, and given, written after ``=``; ``metavar`` names the value (default: NAME)."""

    name: str
    kind: Kind
    help: str
    flag: str | None = None
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    rest: bool = False
    bare: str | None = None
    metavar: str | None = None

    @property
    def word(self) -> str:
        """The value's name in usage lines and help."""
        return self.metavar or self.name.upper()

    def add_to(self, parser: argparse.ArgumentParser, dest: str) -> argparse.Action:
        """The parameter as an argument of a command's parser (``dest`` its attribute): the
        one rendering of a parameter as a command-line option, so ``--help`` says what the
        usage line and the JSON schema say. Neither ``rest`` nor arrays: commands that take
        them (record, hunt) declare their own parsers."""
        if self.flag is None:
            return parser.add_argument(dest, metavar=self.word, type=_COMMAND_LINE_TYPES[self.kind])
        if self.kind == "boolean":
            return parser.add_argument(self.flag, dest=dest, action="store_true", help=self.help)
        return parser.add_argument(
            self.flag,
            dest=dest,
            nargs=None if self.bare is None else "?",
            const=self.bare,
            metavar=self.word,
            type=_COMMAND_LINE_TYPES[self.kind],
            choices=self.choices or None,
            help=self.help if self.default is None else f"{self.help} (default: {self.default})",
        )

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "description": self.help}
        if self.kind == "array":
            out["items"] = {"type": "string"}
        if self.choices:
            out["enum"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.default is not None:
            out["default"] = self.default
        return out

    def check(self, given: Any) -> Any:
        """The value if it fits the parameter, else a :class:`ToolError` saying why."""
        value: Any = given  # not narrowed by the isinstance below: its type depends on the kind
        allowed = _PYTHON_TYPES[self.kind]
        if not isinstance(given, allowed) or (isinstance(given, bool) and bool not in allowed):
            raise ToolError(f"{self.name} must be {_article(self.kind)}, not {given!r}")
        if self.kind == "array" and not all(isinstance(v, str) for v in value):
            raise ToolError(f"{self.name} must be a list of strings")
        if self.choices and value not in self.choices:
            raise ToolError(f"{self.name} must be {_either(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            raise ToolError(f"{self.name} must be at least {self.minimum:g}, not {value}")
        if self.maximum is not None and value > self.maximum:
            raise ToolError(f"{self.name} must be at most {self.maximum:g}, not {value}")
        return value

    def usage(self) -> str:
        word = self.word
        if self.rest:
            return f"[{word}…]" if self.kind == "array" else word
        if self.flag is None:
            return word
        if self.kind == "boolean":
            text = self.flag
        elif self.bare is not None:
            text = f"{self.flag}[={word}]"
        else:
            text = f"{self.flag} {word}"
        return text if self.required else f"[{text}]"


def _article(kind: str) -> str:
    return {"array": "a list", "integer": "an integer"}.get(kind, f"a {kind}")


def _either(choices: tuple[str, ...]) -> str:
    """``'a' or 'b'``; ``'x', 'y' or 'z'``."""
    quoted = [repr(c) for c in choices]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


OFFSET = Param(
    "offset", "integer", "first item of the page: a previous answer's next", "--offset", minimum=0
)


def limit_param(default: int | None) -> Param:
    as_many = " (default: as many as fit)" if default is None else ""
    return Param(
        "limit",
        "integer",
        f"items in the page{as_many}",
        "--limit",
        default=default,
        minimum=1,
    )


@dataclass(frozen=True, slots=True)
class Pages:
    """A paged answer: ``total`` items, of which ``render(offset, limit)`` builds the answer
    holding ``[offset, offset + limit)``. Built from data already computed, so the registry may
    render a smaller page when a page does not fit the cap."""

    total: int
    render: Callable[[int, int], dict[str, Any]]
    start: int = 0  # the offset when the caller gives none


# The checked arguments, then whatever the caller holds for the tool (the in-app agent: its
# open runs); a JSON object, a paged one, or text (the in-app agent's answers).
Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool. ``handler`` is ``"module:function"``, imported only when the tool is called, so
    listing tools (or starting the CLI) imports nothing heavy. ``command`` is the CLI
    subcommand (default: the name); ``fixed`` are flags its CLI form always passes."""

    name: str
    purpose: str
    params: tuple[Param, ...]
    handler: str
    command: str | None = None
    fixed: tuple[str, ...] = ()
    page: int | None = 0  # default page size; 0: not paged; None: paged, as many as fit

    @property
    def paged(self) -> bool:
        return self.page != 0

    @property
    def all_params(self) -> tuple[Param, ...]:
        return (*self.params, OFFSET, limit_param(self.page)) if self.paged else self.params

    def usage(self) -> str:
        words = ["opguard", self.command or self.name]
        rest = [p for p in self.all_params if p.rest]
        words += [p.usage() for p in self.all_params if p.flag is None and not p.rest]
        words += [p.usage() for p in self.all_params if p.flag is not None]
        words += [*self.fixed, "--json"]
        if rest:
            words += ["--", *(p.usage() for p in rest)]
        return " ".join(words)

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.all_params},
            "required": [p.name for p in self.all_params if p.required],
            "additionalProperties": False,
        }

    def arguments(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` checked against the parameters, with defaults filled in."""
        known = {p.name: p for p in self.all_params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ToolError(
                f"{self.name} has no argument {unknown[0]!r}; arguments: {', '.join(known)}"
            )
        out: dict[str, Any] = {}
        for name, param in known.items():
            value = given.get(name)
            if value is None:
                if param.required:
                    raise ToolError(f"{self.name} needs {name}: {param.help}")
                out[name] = param.default
            else:
                out[name] = param.check(value)
        return out

    def argv(self, given: Mapping[str, Any], *, json: bool = True) -> list[str]:
        """The command line that asks the CLI the same question (``opguard`` excluded);
        without ``json``, the plain command. Values are not checked: the CLI checks them."""
        words = [self.command or self.name]
        rest: list[str] = []
        for p in self.all_params:
            value = given.get(p.name)
            if value is None and p.kind == "boolean":
                value = p.default  # a flag on by default is on in the command line too
            if value is None or value is False:
                continue
            values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
            if p.rest:
                rest += values
            elif p.flag is None:
                words += values
            elif value is True or value == p.bare:
                words.append(p.flag)
            elif p.bare is not None:  # an optional value is written with the flag
                words.append(f"{p.flag}={value}")
            else:
                words += [p.flag, *values]
        tail = [*self.fixed, "--json"] if json else []
        return [*words, *tail, *(["--", *rest] if rest else [])]

    def function_schema(self) -> dict[str, Any]:
        """The tool as a model's function-calling API takes it (LiteLLM, OpenAI): the same
        parameters as the MCP input schema."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.purpose,
                "parameters": self.input_schema(),
            },
        }

    def answer(self, given: Mapping[str, Any], *context: Any) -> Any:
        """The handler's answer, unbounded: the arguments checked, then passed with ``context``
        (what the caller holds for the tool). Raises :class:`ToolError` (one line) for anything
        the caller can correct."""
        from .analysis.browse.lookup import QueryError

        arguments = self.arguments(given)
        module, _, function = self.handler.partition(":")
        handler: Handler = getattr(importlib.import_module(module), function)
        try:
            return handler(arguments, *context)
        except (TraceError, QueryError, Refused) as exc:
            raise ToolError(str(exc)) from None

    def call(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON answer, bounded (a paged one a page at a time). Raises :class:`ToolError`
        (one line) for anything the caller can correct."""
        arguments = self.arguments(given)
        answer = self.answer(arguments)
        if isinstance(answer, Pages):
            offset = arguments["offset"]
            return page_of(answer, answer.start if offset is None else offset, arguments["limit"])
        return bounded(answer)


def dumps(answer: Mapping[str, Any]) -> str:
    """The one serialisation every front prints: compact, one line."""
    return json.dumps(answer, separators=(",", ":"), default=str)


def page_of(pages: Pages, offset: int, limit: int | None) -> dict[str, Any]:
    """The page at ``offset``: ``limit`` items, or fewer when they would not fit the cap
    (``cut`` says so); ``next`` is where the following page starts (null at the end)."""
    if offset and offset >= pages.total:
        raise ToolError(f"offset {offset} is past the end ({pages.total} items)")
    size = max(min(limit or pages.total, pages.total - offset), 0)
    answer = _render(pages, offset, size)
    text = dumps(answer)
    cut = False
    while len(text) > MAX_CHARS and size > 1:
        size = max(1, min(size - 1, int(size * MAX_CHARS / len(text) * 0.95)))
        answer, cut = _render(pages, offset, size), True
        text = dumps(answer)
    if cut:
        answer["cut"] = f"page shortened to {size} items to stay under {MAX_CHARS} characters"
    return bounded(answer)


def _render(pages: Pages, offset: int, size: int) -> dict[str, Any]:
    answer = pages.render(offset, size)
    answer["next"] = offset + size if offset + size < pages.total else None
    return answer


def bounded(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer``, or when its JSON passes the cap, its leading characters with a marker."""
    text = dumps(answer)
    if len(text) <= MAX_CHARS:
        return answer
    keep = MAX_CHARS
    while True:  # escaping inside a string makes the JSON longer than the characters kept
        cut = {
            "truncated": f"answer of {len(text)} characters cut to fit {MAX_CHARS}; narrow the "
            "question (a rank, a step, a smaller page)",
            "partial": text[:keep],
        }
        if len(dumps(cut)) <= MAX_CHARS:
            return cut
        keep = int(keep * 0.9)
