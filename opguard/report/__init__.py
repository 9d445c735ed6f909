"""``opguard diff --html`` and ``opguard hunt --html``: the report as one self-contained HTML
file, to attach to an issue or a pull request. :mod:`.content` gathers what it shows (the
diff's result, and the rows, source lines and losses read around it), :mod:`.plots` draws the
curves as inline SVG, :mod:`.document` lays it all out."""

from __future__ import annotations

from pathlib import Path

from ..analysis import RunDiff
from ..hunt import Hunt
from .content import gather
from .document import render


def write_report(path: str, result: RunDiff, command: str, hunt: Hunt | None = None) -> None:
    """Writes the report of ``result`` (for a hunt, the diff its report prints) to ``path``;
    ``command``: the command line that made it, said under "how to reproduce".
    :class:`OSError` when it cannot be written."""
    Path(path).write_text(render(gather(result, command, hunt)), encoding="utf-8")
