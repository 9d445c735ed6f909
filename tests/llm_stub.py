"""A real OpenAI-compatible provider on 127.0.0.1 for the agent's tests: ``POST
/v1/chat/completions`` served by the standard library, answering from a script of replies
(streamed as server-sent events, with tool calls and usage) and remembering every request, so a
test can tell what was sent and, as important, what was not.

LiteLLM talks to it as to any provider: ``model="openai/NAME", api_base=stub.url``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    """One scripted reply: text pieces, or tool calls (name, arguments), or an HTTP error."""

    text: tuple[str, ...] = ()
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    usage: tuple[int, int] | None = (100, 20)  # prompt, completion tokens; None: not reported
    error: tuple[int, str] | None = None  # status, message


@dataclass
class StubProvider:
    answers: list[Answer]
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def next_answer(self) -> Answer:
        # The last answer repeats: a model that keeps asking for tools.
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _handler(stub: StubProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stub.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            answer = stub.next_answer()
            if answer.error is not None:
                status, message = answer.error
                data = json.dumps({"error": {"message": message, "type": "api_error"}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in _chunks(answer, streamed_usage=bool(body.get("stream_options"))):
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


def _chunks(answer: Answer, *, streamed_usage: bool) -> Iterator[dict[str, Any]]:
    base = {"id": "stub-1", "object": "chat.completion.chunk", "created": 0, "model": "stub"}

    def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    for n, (name, arguments) in enumerate(answer.tool_calls):
        call = {"index": n, "id": f"call_{n}", "type": "function"}
        call["function"] = {"name": name, "arguments": json.dumps(arguments)}
        yield choice({"role": "assistant", "tool_calls": [call]})
    for piece in answer.text:
        yield choice({"content": piece})
    yield choice({}, "tool_calls" if answer.tool_calls else "stop")
    if answer.usage is not None and streamed_usage:
        prompt, completion = answer.usage
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        yield {**base, "choices": [], "usage": {**usage, "total_tokens": prompt + completion}}


@contextmanager
def stub_provider(*answers: Answer) -> Iterator[StubProvider]:
    stub = StubProvider(list(answers))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
