"""One standalone HTML page of a conformance run: the summary, then every failure in full.

Each failure shows its case description, the comparator's mismatch report, the input
and output layouts drawn with `refsim.visualize.to_svg`, a per-device mismatch grid
(`refsim.visualize.render_device_grid`) and its reproducer inline with a copy button.
What a failure shows comes from `CaseResult.details`, the case's typed record
(`conformance.report.failure.Failure`, built by the engine where it compares the case); the page
only formats it, and every piece of text is HTML-escaped. The page is rewritten
atomically every `every` cases and at the end, so a crash leaves a readable page.
"""
from __future__ import annotations

import datetime
import html

import numpy as np

from conformance.report._rewrite import RewritingReporter
from conformance.report.failure import Failure, case_failure, device_errors, layout_entry, mesh_entry
from conformance.report.results import STATUSES, CaseResult, missing_text, summarize
from conformance.report.results import verdict as summary_verdict
from refsim.layouts.mesh import Mesh
from refsim.visualize import render_device_grid, to_svg

__all__ = ["HtmlReporter", "case_details", "device_errors", "layout_entry", "mesh_entry", "render_page"]

_NOT_SHOWN = ("case_ids",)  # plan entries too long for the "Run" table (results.jsonl has them)
_REPRO_LIMIT = 256 * 1024  # characters of a reproducer shown inline; the full file stays at repro_path


# -- details: what a failure carries (conformance.report.failure) -------------------------
def case_details(case, comparison=None, *, expected=None) -> Failure:
    """The failure record of a `conformance.cases.Program` (kept name of `case_failure`)."""
    return case_failure(case, comparison, expected=expected)


# -- drawing ---------------------------------------------------------------------------
class _Blocks:
    """A sharding rebuilt from a `layout_entry`: enough of the interface for `to_svg`."""

    def __init__(self, entry: dict):
        self.text = str(entry.get("sharding", ""))
        self._map = {int(d): tuple(slice(int(a), int(b)) for a, b in r) for d, r in entry["blocks"].items()}

    def devices_indices_map(self, shape):
        return self._map

    def __repr__(self):
        return self.text


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _layout_svg(entry: dict) -> str:
    try:
        shape = tuple(int(d) for d in entry["shape"])
        svg = to_svg(_Blocks(entry), shape, width=280, title=f"{entry.get('label', '')}: shape {shape}")
    except (KeyError, TypeError, ValueError) as exc:
        return f'<p class="warn">layout {_e(entry.get("label", ""))} could not be drawn: {_e(exc)}</p>'
    return (f'<figure class="layout">{svg}<figcaption>{_e(entry.get("label", ""))}: '
            f'<code>{_e(entry.get("sharding", ""))}</code></figcaption></figure>')


def _device_grid(d: Failure) -> str:
    errors, m = d.device_errors, d.mesh
    if not errors or not m:
        return ""
    try:
        mesh = Mesh(tuple(m["axis_sizes"]), tuple(m["axis_names"]), device_ids=np.asarray(m["device_ids"]))
        counts = {int(d): float(v) for d, v in errors.items()}
        values = {d: counts.get(d, 0.0) for d in mesh.device_set}
        svg = render_device_grid(mesh, values, "mismatching elements per device", format="svg")
    except (KeyError, TypeError, ValueError) as exc:
        return f'<p class="warn">device grid could not be drawn: {_e(exc)}</p>'
    outside = sorted(set(counts) - set(mesh.device_set))
    note = f'<p class="warn">devices outside the mesh with mismatches: {_e(outside)}</p>' if outside else ""
    return f'<figure class="grid">{svg}</figure>{note}'


def _read_repro(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(_REPRO_LIMIT + 1)
    except OSError as exc:
        return f"# reproducer could not be read from {path}: {exc}"
    if len(text) > _REPRO_LIMIT:
        text = text[:_REPRO_LIMIT] + f"\n# ... truncated at {_REPRO_LIMIT} characters; the full file is {path}\n"
    return text


def _failure_section(r: CaseResult, n: int, repro: str | None) -> str:
    d = r.details
    parts = [f'<section class="case {_e(r.status)}" id="case-{n}">',
             f'<h3><span class="badge {_e(r.status)}">{_e(r.status)}</span> {_e(r.case_id)}</h3>',
             f'<p class="meta">suite {_e(r.suite)} · family {_e(r.family)} · dtype {_e(r.dtype)} · '
             f'{r.examples} example(s) · {r.seconds:.2f} s</p>']
    if r.message:
        parts.append(f"<pre class=\"message\">{_e(r.message)}</pre>")
    if d.stage:
        parts.append(f'<p class="stage">{_e(d.stage_line())}</p>')
    if d.description and d.description.strip() not in (d.report or ""):
        parts.append(f"<h4>Case</h4><pre>{_e(d.description)}</pre>")
    if d.report and d.report != r.message:
        parts.append(f"<h4>Mismatch report</h4><pre>{_e(d.report)}</pre>")
    if d.traceback:
        parts.append(f"<h4>Traceback</h4><pre>{_e(d.traceback)}</pre>")
    layouts = [_layout_svg(e) for e in d.layouts or () if isinstance(e, dict)]
    if layouts:
        parts.append('<h4>Layouts</h4><div class="figures">' + "".join(layouts) + "</div>")
    grid = _device_grid(d)
    if grid:
        parts.append("<h4>Mismatches per device</h4>" + grid)
    if repro is not None:
        parts.append(f'<h4>Reproducer <code>{_e(r.repro_path)}</code> '
                     f'<button class="copy" data-target="repro-{n}" type="button">copy</button></h4>'
                     f'<pre class="repro" id="repro-{n}">{_e(repro)}</pre>')
    parts.append("</section>")
    return "\n".join(parts)


# -- the page ------------------------------------------------------------------------------
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}
td.l,th.l{text-align:left;font-family:monospace}
pre{background:#f6f6f6;border:1px solid #ddd;padding:.5em;overflow:auto;max-height:40em}
.badge{padding:1px 6px;border-radius:3px;color:#fff;font-size:80%}
.pass{background:#1a9850}.fail{background:#d73027}.error{background:#7b3294}.xfail{background:#878787}
.xpass{background:#e08214}.unsupported{background:#4575b4}
section.case{border-top:2px solid #ccc;margin-top:1.5em}section.case.fail,section.case.error{background:none}
.figures{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}figcaption{font-size:80%;max-width:280px}
.warn{color:#b35806}td.bad{color:#d73027;font-weight:bold}
"""

_SCRIPT = """
document.addEventListener('click', function (ev) {
  var b = ev.target.closest('button.copy'); if (!b) return;
  var text = document.getElementById(b.dataset.target).textContent;
  function done() { b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1500); }
  if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done); return; }
  var t = document.createElement('textarea'); t.value = text; document.body.appendChild(t);
  t.select(); document.execCommand('copy'); document.body.removeChild(t); done();
});
"""


def _message(text: str) -> str:
    """A result message: multi-line ones (mismatch reports, tracebacks) as preformatted text."""
    text = str(text or "")
    return f'<pre class="message">{_e(text)}</pre>' if "\n" in text.strip() else _e(text)


def _kv_table(items) -> str:
    rows = "".join(f'<tr><th class="l">{_e(k)}</th><td class="l">{_e(v)}</td></tr>' for k, v in items)
    return f"<table>{rows}</table>"


def _summary_table(summary: dict) -> str:
    cols = ["suite", "family", "dtype", *STATUSES, "examples"]
    head = "".join(f'<th class="{"l" if c in ("suite", "family", "dtype") else ""}">{_e(c)}</th>' for c in cols)
    rows = []
    for row in summary.get("table", ()):
        cells = []
        for c in cols:
            v = row.get(c, 0)
            cls = "l" if c in ("suite", "family", "dtype") else ("bad" if c in ("fail", "error", "timeout") and v else "")
            cells.append(f'<td class="{cls}">{_e(v)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render_page(results: list[CaseResult], plan: dict, summary: dict | None = None, *,
                sections: dict[str, str] | None = None, finished: bool = True) -> str:
    """The whole page. `summary` defaults to `summarize(results)`; `sections` caches failure markup by case id."""
    if summary is None:
        summary = summarize(results, wall_seconds=0.0, compile_seconds=sum(r.compile_seconds for r in results))
    sections = {} if sections is None else sections
    by = summary.get("by_status", {})
    verdict = summary_verdict(summary) if finished else "IN PROGRESS"
    out = [f"<h1>refsim vs XLA conformance: {_e(verdict)}</h1>"]
    if not finished:
        out.append('<p class="warn">The run has not finished (or crashed): this page shows the cases done so far.</p>')
    elif verdict == "INCOMPLETE":
        out.append(f'<p class="warn">This report does not cover its whole plan, so it is not a pass: '
                   f'{_e(missing_text(summary))}.</p>')
    plan_items = [(k, v if not isinstance(v, (list, tuple)) else ", ".join(map(str, v)))
                  for k, v in plan.items() if k not in _NOT_SHOWN
                  and (isinstance(v, (str, int, float, bool, list, tuple)) or v is None)]
    out.append("<h2>Run</h2>" + _kv_table(plan_items))
    stats = [("cases", summary.get("cases", len(results))), ("examples", summary.get("examples", 0))]
    if not summary.get("complete", True):
        stats[1:1] = [("planned cases", summary.get("planned_cases", "?")),
                      ("missing cases", summary.get("missing_cases", "?"))]
    stats += [(s, by.get(s, 0)) for s in STATUSES]
    if finished:
        stats += [("wall time", f"{summary.get('wall_seconds', 0.0):.1f} s"),
                  ("examples/s", f"{summary.get('examples_per_second', 0.0):.1f}"),
                  ("time compiling", f"{100 * summary.get('compile_share', 0.0):.0f}%")]
    out.append("<h2>Summary</h2>" + _kv_table(stats) + _summary_table(summary))
    stale = [r for r in results if r.status == "xpass"]
    if stale:
        out.append("<h2 class=\"warn\">Stale xfail entries</h2><p>These cases pass although the platform's xfails "
                   "file expects them to fail; remove their entries.</p><ul>"
                   + "".join(f"<li><code>{_e(r.case_id)}</code> {_message(r.message)}</li>" for r in stale) + "</ul>")
    for status, title in (("unsupported", "Unsupported on this platform"), ("xfail", "Expected failures")):
        rs = [r for r in results if r.status == status]
        if rs:
            out.append(f"<h2>{_e(title)} ({len(rs)})</h2><table>"
                       + "".join(f'<tr><td class="l">{_e(r.case_id)}</td><td class="l">{_message(r.message)}</td></tr>'
                                 for r in rs) + "</table>")
    failures = [r for r in results if r.status in ("fail", "error", "timeout")]
    out.append(f"<h2>Failures ({len(failures)})</h2>")
    if failures:
        out.append("<ol>" + "".join(f'<li><a href="#case-{n}">{_e(r.case_id)}</a> ({_e(r.status)})</li>'
                                    for n, r in enumerate(failures)) + "</ol>")
        for n, r in enumerate(failures):
            key = f"{n}\0{r.case_id}"
            if key not in sections:
                sections[key] = _failure_section(r, n, _read_repro(r.repro_path))
            out.append(sections[key])
    else:
        out.append("<p>None.</p>")
    title = f"conformance {plan.get('platform', '')}: {verdict}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + _e(title)
            + f"</title><style>{_STYLE}</style></head><body>\n" + "\n".join(out)
            + f"\n<script>{_SCRIPT}</script>\n</body></html>\n")


class HtmlReporter(RewritingReporter):
    """Writes the page at `start` (empty), every `every` cases, and at `finish` (with the run's summary).

    A failure's section (and its reproducer, read from `repro_path`) is rendered once,
    when first written, so rewrites stay cheap.
    """

    def __init__(self, path, *, every: int = 50):
        super().__init__(path, every=every)
        self._sections: dict[str, str] = {}

    def _prepare(self, plan: dict) -> None:
        plan.setdefault("started", datetime.datetime.now().replace(microsecond=0).isoformat())

    def _record(self, result: CaseResult) -> None:
        old = self.results.get(result.case_id)
        if old is not None and old.status in ("fail", "error"):
            self._sections.clear()  # numbering of failures may change; re-render lazily
        self.results[result.case_id] = result

    def _render(self, summary, finished: bool) -> bytes:
        return render_page(list(self.results.values()), self._plan, summary, sections=self._sections,
                           finished=finished).encode("utf-8")
