"""The HTML document of a report: one self-contained file (inline CSS and SVG, no script, no
link to anything) to attach to an issue or a pull request, read by someone without OpGuard.

It is a front end like the terminal report: every fact comes from the gathered
:class:`~.content.Content` (the diff's result, the rows and records read around it), said with
the analysis' own sentences (a divergence's ``summary``, a cause's evidence, a rank's
step-level ``describe``) and formatters (:mod:`opguard.analysis.words.text`); this module only
lays them out. Every text from a trace or a path is escaped. The sections a browser test finds
have stable ids: ``verdict``, ``first-divergence``, ``neighbourhood``, ``loss-plot``,
``drift-plot`` (and ``likely-causes``, ``ranks``, ``alignment``, ``reproduce``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from html import escape

from .. import __version__
from ..analysis import Divergence, RunDiff, TensorDiff
from ..analysis.align.steps import describe_runs
from ..analysis.browse.lookup import SourceView
from ..analysis.browse.rows import OpLine, Status
from ..analysis.divergence.compilation import mode_note
from ..analysis.state_diff import StepDivergence
from ..analysis.tolerant.judgement import Judgement, not_judged_text
from ..analysis.words.text import (
    kernel_line,
    leading_bits,
    leading_values,
    number,
    stats_text,
    value_text,
)
from ..analysis.words.verdict import label
from ..store import CallSite, KernelEntry, TensorRecord
from .content import Content, Neighbour, Neighbourhood, OpView, StateRow
from .plots import Series, line_plot

RUN_COLOURS = ("#1f77b4", "#d62728")  # run A, run B: the legend and the side-by-side headers
DRIFT_COLOUR = "#8e6c00"

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:0;
background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:28px;margin:0 0 4px}h2{font-size:20px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:16px;margin:16px 0 6px}
section,header{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:4px 16px 12px;
margin:12px 0}
header.diverged{border-left:8px solid #c0392b}header.incomplete{border-left:8px solid #d68910}
header.identical,header.within-rounding{border-left:8px solid #1e8449}
.word{letter-spacing:.04em}.diverged .word{color:#c0392b}.incomplete .word{color:#d68910}
.identical .word,.within-rounding .word{color:#1e8449}
code,pre,.mono{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f4f4f4;padding:6px 8px;margin:4px 0;white-space:pre-wrap;
overflow-wrap:anywhere}
mark{background:#fff1a8}
table{border-collapse:collapse;margin:6px 0;width:100%}
th,td{border:1px solid #e2e2e2;padding:3px 6px;text-align:left;vertical-align:top}
td code,.mono td{overflow-wrap:anywhere}.mono td:first-child,td.num,th{white-space:nowrap}
table.pair{table-layout:fixed}table.pair th:first-child{width:110px}
table.rows{font-size:12px}
th{background:#f4f4f4;font-weight:600}
td.num{text-align:right}
.run-a{color:#1f77b4}.run-b{color:#d62728}
.summary,.scope,.found-by{font-size:17px;font-weight:600}
.evidence,.note{color:#555}
tr.differs td{background:#fdecea}tr.first td{background:#f9c9c3;font-weight:600}
tr.cause td{outline:2px solid #c0392b}tr.only td{background:#fff4e0}
tr.quiet td{color:#777}
.mark{white-space:nowrap;color:#c0392b;font-weight:600}
figure{margin:8px 0}figcaption{color:#555;font-size:13px}
svg.plot{max-width:100%;height:auto;background:#fff}
svg text{font-family:system-ui,sans-serif;fill:#333}
details{margin:4px 0}
"""


def _e(text: object) -> str:
    return escape(str(text))


def render(content: Content) -> str:
    """The whole document."""
    result = content.result
    verdict = content.hunt.verdict if content.hunt is not None else result.verdict
    body = [
        _verdict(content, verdict),
        _first(content),
        *([_ranks(result)] if len(result.ranks) > 1 else []),
        _neighbourhood(content.neighbourhood),
        _plots(content),
        _alignment(result),
        _reproduce(content),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>OpGuard: {_e(verdict.upper())}, {_e(result.path_a)} vs "
        f"{_e(result.path_b)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(body)
        + f'\n<footer class="note">Written by OpGuard {_e(__version__)}.</footer>\n'
        "</main>\n</body>\n</html>\n"
    )


# -- the verdict ------------------------------------------------------------------------------


def _verdict(content: Content, verdict: str) -> str:
    result = content.result
    parts = [
        f'<header id="verdict" class="{_e(verdict)}">',
        f'<h1><span class="word">{_e(verdict.upper())}</span></h1>',
        f'<p>A: <code class="run-a">{_e(result.path_a)}</code> &nbsp; '
        f'B: <code class="run-b">{_e(result.path_b)}</code></p>',
    ]
    hunt, note = content.hunt, mode_note(result.meta_a, result.meta_b)
    said = [  # (class, what the terminal report says under its verdict line), where said
        ("found-by", hunt.found_by if hunt is not None else ""),
        ("next", f"Next: {hunt.next_time}" if hunt is not None and hunt.next_time else ""),
        ("scope", result.scope()),
        ("note", f"note: {note}" if note else ""),
    ]
    parts += [f'<p class="{name}">{_e(text)}</p>' for name, text in said if text]
    if result.tolerance is not None:
        parts.append(_tolerance(result))
    if content.unread:
        items = "".join(f"<li>{_e(why)}</li>" for why in content.unread)
        parts.append(
            f'<p class="note">Not shown, the traces could not be read:</p><ul>{items}</ul>'
        )
    parts.append("</header>")
    return "\n".join(parts)


def _tolerance(result: RunDiff) -> str:
    """How differences were judged, and how many of them rounding explained."""
    tolerance = result.tolerance
    assert tolerance is not None
    found = [r.tolerance for r in result.ranks if r.tolerance is not None]
    rows = [
        ("judged", f"--tolerant ({tolerance.mode}): {tolerance.text()}"),
        ("differing aligned ops rounding explains", str(sum(t.explained for t in found))),
        ("of them integer or bool flips", str(sum(t.flips for t in found))),
        *(
            [("of them by the control run's floor", str(sum(t.measured for t in found)))]
            if tolerance.noise is not None
            else []
        ),
        *(("parallel layouts", layout.text()) for r in result.ranks if (layout := r.layout)),
        *([("not judged", unjudged)] if (unjudged := not_judged_text(found)) else []),
    ]
    return _definitions(rows, "tolerance")


def _definitions(rows: Iterable[tuple[str, str]], id_: str = "") -> str:
    ident = f' id="{id_}"' if id_ else ""
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table{ident} class="facts">{cells}</table>'


# -- the first divergence ---------------------------------------------------------------------


def _first(content: Content) -> str:
    result = content.result
    first, state = result.first, content.state_first
    if first is not None:
        inner = _op_divergence(content, first, result)
    elif state is not None:
        inner = _state_divergence(state)
    else:
        inner = "<h2>First divergence</h2><p>None: no op or step was found to diverge.</p>"
    return f'<section id="first-divergence">\n{inner}\n</section>'


def _where(rank: int, step: int, kind_label: str) -> str:
    return f'<p class="where">rank {rank}, step {step}, kind: <strong>{_e(kind_label)}</strong></p>'


def _op_divergence(content: Content, div: Divergence, result: RunDiff) -> str:
    parts = [
        "<h2>First observed difference</h2>",
        _where(div.rank, div.step, label(div.kind, div.cause)),
        f'<p class="summary">{_e(div.summary)}</p>',
    ]
    if result.known_difference:
        parts.append(f"<p><strong>known difference:</strong> {_e(result.known_difference)}</p>")
    if div.hint:
        parts.append(f"<p><strong>hint:</strong> {_e(div.hint)}</p>")
    if div.likely_causes:
        items = "".join(
            f'<li><p>{_e(c.cause)}</p><p class="evidence">evidence: {_e(c.evidence)}</p></li>'
            for c in div.likely_causes
        )
        parts.append(
            f'<h3>Likely causes, most likely first</h3><ol id="likely-causes">{items}</ol>'
        )
    parts.append("<h3>The op in each run</h3>")
    parts.append(_op_pair(content.named, "named-ops"))
    if content.observed != content.named:
        parts.append("<h3>First seen at</h3>")
        parts.append(_op_pair(content.observed, "observed-ops"))
    if div.arguments:
        rows = [
            [
                arg.name,
                value_text(arg.a) if arg.a_passed else "default (not passed)",
                value_text(arg.b) if arg.b_passed else "default (not passed)",
            ]
            for arg in div.arguments
        ]
        parts.append("<h3>Arguments that differ</h3>")
        parts.append(_table(["argument", "run A", "run B"], rows, "arguments"))
    if div.rng_differs:
        parts.append("<p>The RNG state consumed by the op differs.</p>")
    parts.extend(_tensor_diffs("input", div.inputs))
    parts.extend(_tensor_diffs("output", div.outputs))
    if len(div.chain) > 1:
        rows = [
            [f"#{link.a.index}", f"#{link.b.index}", link.a.op, link.slot] for link in div.chain
        ]
        parts.append("<h3>Producer chain, from the op back to the cause</h3>")
        parts.append(_table(["run A", "run B", "op", "input followed"], rows, "chain"))
    parts.extend(_kernels(div))
    if div.race:
        parts.append(f"<p><strong>stream race:</strong> {_e(div.race)}</p>")
    for window in div.windows:
        parts.append(f"<p><strong>unrecorded write:</strong> {_e(window.text())}</p>")
    judged = result.first_judgement
    if judged is not None:
        parts.append(_judgement(judged))
    return "\n".join(parts)


def _op_pair(views: tuple[OpView | None, OpView | None], id_: str) -> str:
    """One op in each run, side by side: what it is, where it was called, the source there."""
    a, b = views
    heads = '<tr><th></th><th class="run-a">run A</th><th class="run-b">run B</th></tr>'

    def row(name: str, cell: Callable[[OpView], str]) -> str:
        cells = "".join(f"<td>{cell(v) if v is not None else _absent()}</td>" for v in (a, b))
        return f"<tr><th>{_e(name)}</th>{cells}</tr>"

    rows = [
        row("op", lambda v: f"<code>#{v.op.index} {_e(v.op.op)}</code>"),
        row("phase, step", lambda v: _e(f"{v.op.phase}, step {v.op.step}")),
        row("call site", lambda v: _site(v.op.call_site)),
        row("source", lambda v: _source(v.op.call_site, v.source)),
    ]
    if (a is not None and a.origins) or (b is not None and b.origins):
        rows.append(row("computes the lines", _origins))
    return f'<table id="{id_}" class="pair">{heads}{"".join(rows)}</table>'


def _absent() -> str:
    return '<span class="note">(no such op in this run)</span>'


def _site(site: CallSite) -> str:
    return f"<code>{_e(site.file)}:{site.line}</code> in <code>{_e(site.function)}</code>"


def _source(site: CallSite, view: SourceView) -> str:
    """Numbered source lines, the call line marked (``<mark>``: highlighted without CSS)."""
    if not view.rows:
        return '<span class="note">(source not recorded)</span>'
    lines = []
    for n, text in view.rows:
        line = f"{n:>5} │ {_e(text)}"
        lines.append(f"<mark>{line}</mark>" if n == site.line else line)
    kept = "" if view.from_file else '<p class="note">(the lines the trace kept)</p>'
    return f"<pre>{chr(10).join(lines)}</pre>{kept}"


def _origins(view: OpView) -> str:
    return "".join(f"<p>{_site(site)}</p>{_source(site, source)}" for site, source in view.origins)


def _tensor_cells(t: TensorRecord | None) -> list[str]:
    """dtype and shape, fingerprint, leading values, their bits, stats: as text."""
    if t is None:
        return ["(absent)", "", "", "", ""]
    return [
        t.describe_shape(),
        t.fingerprint_text(),
        ", ".join(leading_values(t)),
        " ".join(leading_bits(t)),
        stats_text(t) or "",
    ]


TENSOR_HEADS = ["run", "dtype[shape]", "fingerprint", "values", "bits", "stats"]


def _tensor_diffs(title: str, diffs: Sequence[TensorDiff]) -> list[str]:
    parts = []
    for d in diffs:
        rows = [["A", *_tensor_cells(d.a)], ["B", *_tensor_cells(d.b)]]
        parts.append(f"<h3>{_e(title)} {_e(d.slot)} differs</h3>")
        parts.append(_table(TENSOR_HEADS, rows, mono=True))
    return parts


def _kernels(div: Divergence) -> list[str]:
    a, b = div.observed_a.kernels, div.observed_b.kernels
    if not a and not b:
        return []
    same = "different kernels" if div.kernels_differ else "same kernels"

    def listed(kernels: Sequence[KernelEntry]) -> str:
        return "<br>".join(_e(kernel_line(k)) for k in kernels) or "(none)"

    return [
        f"<h3>GPU work of the op ({same})</h3>",
        _table(["run A", "run B"], [[listed(a), listed(b)]], mono=True, raw=True),
    ]


def _judgement(judged: Judgement) -> str:
    """Why rounding does not explain the op: the distances the tolerant walk measured."""
    rows = [("why", judged.what)]
    if judged.output is not None:
        rows += [
            ("outputs' relative distance", judged.output.text()),
            ("inputs' relative distance", judged.input.text() if judged.input else "unknown"),
            ("amplification", judged.amplification_text()),
        ]
        if judged.output.norm_a is not None and judged.output.norm_b is not None:
            rows.append(
                ("norms", f"{judged.output.norm_a:.4g} (A), {judged.output.norm_b:.4g} (B)")
            )
    elif judged.tensor is not None:
        rows.append((f"input {judged.slot}'s relative distance", judged.tensor.text()))
    rows.append(("rounding explains up to", "?" if judged.limit is None else f"{judged.limit:.1e}"))
    family = f" {judged.family}" if judged.family else ""
    rows.append(("judged by", f"the {judged.judged_by}{family} bound"))
    if judged.unit:
        rows.append(("unit roundoff u", f"{judged.unit:.1e}"))
    return "<h3>Distance (--tolerant)</h3>" + _definitions(rows, "distance")


def _state_divergence(div: StepDivergence) -> str:
    compared = div.comparison
    first = div.first
    rows = [[first.label, "A", *_tensor_cells(first.a.tensor)]]
    rows.append([first.label, "B", *_tensor_cells(first.b.tensor)])
    parts = [
        "<h2>First differing step</h2>",
        _where(div.rank, div.step, label(div.kind, div.cause)),
        f'<p class="summary">{_e(div.summary)}</p>',
        f"<p><strong>hint:</strong> {_e(div.hint)}</p>",
        f"<h3>{_e(first.label)} differs</h3>",
        _table(["entry", *TENSOR_HEADS], rows, mono=True),
        f"<p>differing in step {div.step}: {_e(compared.kinds_text())}</p>",
    ]
    if compared.only_a or compared.only_b:
        parts.append(f"<p>recorded in one run only (not compared): {_e(compared.only_text())}</p>")
    return "\n".join(parts)


# -- ranks ------------------------------------------------------------------------------------


def _ranks(result: RunDiff) -> str:
    """Each rank's first divergence and whether it started there (origin) or came through a
    collective (receiver: the collective, and the ranks it received from)."""
    rows = []
    for r in result.ranks:
        role, div, state = r.role, r.first, r.state_first
        if role is None or div is None:
            rows.append([str(r.rank), r.verdict, state.summary if state is not None else ""])
        elif role.collective is None:
            rows.append([str(r.rank), role.role, div.summary])
        else:
            op, senders = role.collective, ", ".join(map(str, role.senders(r.rank)))
            received = f", received from rank(s) {senders}" if senders else ""
            where = f"step {div.step}: {op.op} at {op.call_site.short()}{received}"
            rows.append([str(r.rank), role.role, where])
    origins = ", ".join(map(str, result.origin_ranks)) or "none compared"
    return (
        f'<section id="ranks">\n<h2>Ranks</h2>\n<p>origin rank(s): {_e(origins)}</p>\n'
        + _table(["rank", "role", "first divergence"], rows)
        + "\n</section>"
    )


# -- the neighbourhood ------------------------------------------------------------------------


def _neighbourhood(found: Neighbourhood | None) -> str:
    head = "<h2>Around the first divergence</h2>"
    if found is None:
        return f'<section id="neighbourhood">{head}<p>Nothing to show: no divergence.</p></section>'
    shown = len(found.rows)
    where = (
        f"<p>rank {found.rank}, step {found.step}: rows {found.before + 1}–"
        f"{found.before + shown} of {found.before + shown + found.after}, run A beside run B; "
        "differing rows are marked.</p>"
    )
    if found.rows and isinstance(found.rows[0], StateRow):
        table = _state_table([r for r in found.rows if isinstance(r, StateRow)])
    else:
        table = _op_table([r for r in found.rows if isinstance(r, Neighbour)])
    return f'<section id="neighbourhood">\n{head}\n{where}\n{table}\n</section>'


def _op_table(rows: Sequence[Neighbour]) -> str:
    def side(op: OpLine | None) -> str:
        if op is None:
            return "<td></td><td></td><td></td>"
        return (
            f'<td class="num">{op.index}</td><td><code>{_e(op.name)}</code></td>'
            f"<td><code>{_e(op.site.short())}</code></td>"
        )

    lines = []
    for n in rows:
        status = n.row.status
        marks = [m for m, on in (("first difference", n.first), ("named", n.cause)) if on]
        classes = [
            c
            for c, on in (
                ("differs", status.differs),
                ("only", n.row.a is None or n.row.b is None),
                ("first", n.first),
                ("cause", n.cause),
            )
            if on
        ]
        lines.append(
            f'<tr class="{" ".join(classes)}" data-status="{_e(status.value)}">'
            f'<td class="mark">{_e(", ".join(marks))}</td>'
            f"{side(n.row.a)}{side(n.row.b)}<td>{_e(status.value)}</td></tr>"
        )
    heads = (
        '<tr><th></th><th class="run-a">#</th><th class="run-a">op (run A)</th>'
        '<th class="run-a">call site</th><th class="run-b">#</th><th class="run-b">op (run B)</th>'
        '<th class="run-b">call site</th><th>status</th></tr>'
    )
    return f'<table class="rows mono">{heads}{"".join(lines)}</table>'


def _state_table(rows: Sequence[StateRow]) -> str:
    def cell(t: TensorRecord | None) -> str:
        if t is None:
            return "<td></td>"
        values = ", ".join(leading_values(t))
        return f"<td>{_e(t.describe_shape())} fp {_e(t.fingerprint_text())}<br>{_e(values)}</td>"

    lines = []
    for row in rows:
        if row.a is None or row.b is None:
            status, classes = Status.ONLY_A if row.b is None else Status.ONLY_B, "only"
        else:
            status = Status.DIFFERING if row.differs else Status.EQUAL
            classes = "differs" if row.differs else ""
        lines.append(
            f'<tr class="{classes}" data-status="{_e(status.value)}"><td><code>{_e(row.label)}'
            f"</code></td>{cell(row.a)}{cell(row.b)}<td>{_e(status.value)}</td></tr>"
        )
    heads = (
        '<tr><th>state entry</th><th class="run-a">run A</th><th class="run-b">run B</th>'
        "<th>status</th></tr>"
    )
    return f'<table class="rows mono">{heads}{"".join(lines)}</table>'


# -- plots ------------------------------------------------------------------------------------


def _plots(content: Content) -> str:
    marked = _marked(content)
    return (
        '<section id="plots">\n<h2>Along the run</h2>\n'
        + _loss_figure(content, marked)
        + "\n"
        + _drift_figure(content.result, marked)
        + "\n</section>"
    )


def _marked(content: Content) -> int | None:
    """The step the verdict names: the first divergence's, or the first differing step's (of
    the hunt's step-level pass, where its second pass did not find it again)."""
    first = content.result.first or content.state_first
    if first is None and content.hunt is not None:
        first = content.hunt.found
    return first.step if first is not None else None


def _figure(
    id_: str,
    series: Sequence[Series],
    caption: str,
    marked: int | None,
    *,
    title: str,
    y_label: str,
    log: bool = False,
    bounds: tuple[float, float] | None = None,
) -> str:
    """A plot with its caption and, folded away, its numbers."""
    svg = line_plot(
        series,
        title=title,
        y_label=y_label,
        log=log,
        bounds=bounds,
        marked=marked,
        marked_label=f"first divergence, step {marked}" if marked is not None else "",
    )
    return (
        f'<figure id="{id_}">{svg}<figcaption>{_e(caption)}</figcaption>'
        f"{_values_table(series)}</figure>"
    )


def _unplotted(id_: str, why: str) -> str:
    return f'<figure id="{id_}"><figcaption>{_e(why)}</figcaption></figure>'


def _loss_figure(content: Content, marked: int | None) -> str:
    if content.losses is None or not any(loss.by_step for loss in content.losses):
        return _unplotted("loss-plot", "Loss: none recorded (no step-level records, no .item()).")
    series = [
        Series(name, sorted(loss.by_step.items()), colour, dashed=name == "run B")
        for name, loss, colour in zip(("run A", "run B"), content.losses, RUN_COLOURS, strict=True)
    ]
    sources = "; ".join(dict.fromkeys(loss.source for loss in content.losses))
    caption = (
        f"Loss per step of rank {content.loss_rank}: {sources}. Run B is dashed, so equal "
        "curves both show."
    )
    return _figure(
        "loss-plot", series, caption, marked, title="loss per step, run A and run B", y_label="loss"
    )


def _drift_figure(result: RunDiff, marked: int | None) -> str:
    """With --tolerant, the largest relative distance of each step's aligned ops (log scale);
    bit for bit, the share of each step's ops that differ."""
    tolerant = result.tolerance is not None
    points = result.drift() if tolerant else result.changed_share()
    if not points:
        return _unplotted("drift-plot", "Drift: no op was compared.")
    if tolerant:
        caption = (
            "Drift: the largest relative distance of an aligned op's outputs in each step, over "
            "the ranks (log scale; 0 on the bottom edge), for the steps around the first "
            "divergence."
        )
        drift = Series("largest relative distance", points, DRIFT_COLOUR)
        return _figure(
            "drift-plot",
            [drift],
            caption,
            marked,
            title="drift per step",
            y_label="distance",
            log=True,
        )
    caption = (
        "Where the runs differ: the share of each step's ops that differ or exist in one run "
        "only, over the ranks."
    )
    drift = Series("share of ops that differ", points, DRIFT_COLOUR)
    title = "share of ops that differ per step"
    return _figure(
        "drift-plot", [drift], caption, marked, title=title, y_label="share", bounds=(0.0, 1.0)
    )


def _values_table(series: Sequence[Series]) -> str:
    """The plotted numbers, folded away: exact values without hovering."""
    steps = sorted({step for s in series for step, _ in s.points})
    by_step = [dict(s.points) for s in series]
    rows = [
        [str(step), *(_value(values.get(step, None), step in values) for values in by_step)]
        for step in steps
    ]
    table = _table(["step", *(s.name for s in series)], rows, mono=True)
    return f"<details><summary>values</summary>{table}</details>"


def _value(value: float | None, present: bool) -> str:
    if not present:
        return ""
    return "unknown" if value is None else number(value)


# -- alignment and reproduction ---------------------------------------------------------------


def _alignment(result: RunDiff) -> str:
    rows = [
        [
            str(r.rank),
            *(
                (str(r.aligned), str(r.only_a), str(r.only_b), str(r.differing))
                if r.ops_compared
                else ("", "", "", "")
            ),
            describe_runs(r.count_a, r.count_b),
        ]
        for r in result.ranks
    ]
    heads = ["rank", "aligned", "only in A", "only in B", "aligned ops differ", "steps"]
    notes = []
    for r in result.ranks:
        if r.layout is not None:
            notes.append(f"rank {r.rank}, layouts: {r.layout.text()}")
        if r.states is not None:
            notes.append(f"rank {r.rank}, step-level records: {r.states.describe()}")
        notes.extend(f"rank {r.rank}: {note}" for note in r.notes)
    notes.extend(result.uncompared)
    listed = "".join(f"<li>{_e(note)}</li>" for note in notes)
    return (
        '<section id="alignment">\n<h2>Alignment</h2>\n'
        + _table(heads, rows)
        + (f"<ul>{listed}</ul>" if listed else "")
        + "\n</section>"
    )


def _reproduce(content: Content) -> str:
    parts = ['<section id="reproduce">', "<h2>How to reproduce</h2>"]
    for rec in content.recordings:
        parts.append(f"<h3>{_e(rec.label)}: <code>{_e(rec.path)}</code></h3>")
        parts.append(f"<pre>{_e(chr(10).join(rec.lines()))}</pre>")
    parts.append("<h3>This report</h3>")
    parts.append(f"<pre>{_e(content.command)}</pre>")
    parts.append("</section>")
    return "\n".join(parts)


def _table(
    heads: Sequence[str],
    rows: Iterable[Sequence[str]],
    id_: str = "",
    *,
    mono: bool = False,
    raw: bool = False,
) -> str:
    """A table of text cells, escaped (``raw``: cells that are HTML already)."""
    ident = f' id="{id_}"' if id_ else ""
    cls = ' class="mono"' if mono else ""
    head = "".join(f"<th>{_e(h)}</th>" for h in heads)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table{ident}{cls}><tr>{head}</tr>{body}</table>"
