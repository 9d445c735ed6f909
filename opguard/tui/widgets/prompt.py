"""A one-line question at the bottom (go to, search); Enter answers, Escape cancels."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import Input


class Prompt(Input):
    class Answered(Message):
        def __init__(self, kind: str, value: str) -> None:
            super().__init__()
            self.kind = kind
            self.value = value

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, disabled=True)  # out of the focus chain until asked
        self.kind = ""

    def ask(self, kind: str, placeholder: str) -> None:
        self.kind = kind
        self.placeholder = placeholder
        self.value = ""
        self.disabled = False
        self.add_class("-open")
        self.focus()

    def close(self) -> None:
        self.remove_class("-open")
        self.disabled = True
        self.screen.set_focus(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close()
        if event.value.strip():
            self.post_message(self.Answered(self.kind, event.value.strip()))

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape":
            event.stop()
            self.close()
