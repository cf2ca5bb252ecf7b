"""One standalone HTML page of a conformance run: the verdict, the failures first, then the run.

The page opens with the verdict and one line of counts. When cases failed (a DISAGREE, an
INCOMPLETE or an unfinished run with failures) a numbered list links to each failure's section
(``#case-N``), and the sections follow at once, so the first failure is on the first screen;
the run's plan, the counts, the family x dtype table, stale xfail entries, the unsupported cases
and the expected failures come after them.

Each failure's section shows, in this order: its status and case id, where the compiler stages
diverged and what shrinking found; the mesh's devices coloured by their mismatching elements
(`conformance.report.pictures.device_grid_svg`); the mismatch report, once (the result's message
less what the report already says); the case description only where the report does not
already hold it; a traceback; the layouts of the inputs and outputs as tiles sized to the array
and coloured by the devices holding each block (`conformance.report.pictures.layout_svg`); and
the reproducer inline with a copy button. What a failure shows comes from `CaseResult.details`,
the case's typed record (`conformance.report.failure.Failure`, built by the engine where it
compares the case); the page only formats it, and every piece of text is HTML-escaped. The page
has no external resources. It is rewritten atomically every `every` cases and at the end, so a
crash leaves a readable page.
"""
from __future__ import annotations

import datetime
import html

from conformance.report._rewrite import RewritingReporter
from conformance.report.failure import Failure, case_failure, device_errors, layout_entry, mesh_entry
from conformance.report.pictures import DeviceSetColours, device_grid_svg, id_ranges, layout_svg
from conformance.report.results import STATUSES, CaseResult, missing_text, summarize
from conformance.report.results import verdict as summary_verdict

__all__ = ["HtmlReporter", "case_details", "device_errors", "layout_entry", "mesh_entry", "render_page"]

_NOT_SHOWN = ("case_ids",)  # plan entries too long for the "Run" table (results.jsonl has them)
_REPRO_LIMIT = 256 * 1024  # characters of a reproducer shown inline; the full file stays at repro_path
_FAILED = ("fail", "error", "timeout")


# -- details: what a failure carries (conformance.report.failure) -------------------------
def case_details(case, comparison=None, *, expected=None) -> Failure:
    """The failure record of a `conformance.cases.Program` (kept name of `case_failure`)."""
    return case_failure(case, comparison, expected=expected)


def _e(text) -> str:
    return html.escape(str(text), quote=True)


# -- one failure -------------------------------------------------------------------------
def _layout_figure(entry: dict, colours: DeviceSetColours) -> str:
    label = entry.get("label", "")
    try:
        svg = layout_svg(entry, colours)
    except (KeyError, TypeError, ValueError) as exc:
        return f'<p class="warn">layout {_e(label)} could not be drawn: {_e(exc)}</p>'
    shape = tuple(entry.get("shape", ()))
    return (f'<figure class="layout">{svg}<figcaption><b>{_e(label)}</b> shape {_e(shape)}<br>'
            f'<code>{_e(entry.get("sharding", ""))}</code></figcaption></figure>')


def _device_grid(d: Failure) -> str:
    errors, m = d.device_errors, d.mesh
    if not errors or not m:
        return ""
    try:
        svg, outside = device_grid_svg(m, errors)
    except (KeyError, TypeError, ValueError) as exc:
        return f'<p class="warn">device grid could not be drawn: {_e(exc)}</p>'
    bad = sorted(int(k) for k, v in errors.items() if float(v) > 0)
    note = f'<p class="warn">devices outside the mesh with mismatches: {_e(outside)}</p>' if outside else ""
    return (f'<figure class="grid">{svg}<figcaption>{d.mismatches} mismatching element(s) on '
            f'{len(bad)} device(s): {_e(id_ranges(bad))}</figcaption></figure>{note}')


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


def _lines(text: str) -> str:
    """`text` with each line stripped and blank lines dropped: indentation does not make a copy new."""
    return "\n".join(line.strip() for line in str(text).splitlines() if line.strip())


def _texts(r: CaseResult) -> tuple[str, str]:
    """(the mismatch text, what the result's message adds to it): the report and the message
    each hold the other, or a shrink note, so the page shows the report once and the rest apart."""
    d, message = r.details, str(r.message or "")
    report = str(d.report or "")
    if not report:
        return message.strip(), ""
    if report in message:
        rest = message.replace(report, "", 1)
    else:
        rest = "" if _lines(message) in _lines(report) else message
    if d.shrunk:
        rest = rest.replace(d.shrunk, "", 1)
    return report.strip("\n"), rest.strip()


def _headline(r: CaseResult) -> str:
    """One line of what went wrong in a failed case, for the page's list of failures."""
    d = r.details
    parts = []
    if d.device_errors:
        bad = [k for k, v in d.device_errors.items() if float(v) > 0]
        parts.append(f"{d.mismatches} mismatching element(s) on {len(bad)} device(s)")
    elif d.exception_type:
        parts.append(str(d.exception_type))
    elif d.worker_exit:
        parts.append(str(d.worker_exit))
    if d.diverged_in and d.diverged_in != "undetermined":
        parts.append(f"diverged in {d.diverged_in}" + (f" at {d.stage['op']}" if d.stage.get("op") else ""))
    if not parts:
        first = next((line.strip() for line in str(r.message or "").splitlines() if line.strip()), "")
        parts.append(first if len(first) <= 140 else first[:139] + "…")
    return " · ".join(parts)


def _failure_section(r: CaseResult, n: int, repro: str | None) -> str:
    d = r.details
    parts = [f'<section class="case {_e(r.status)}" id="case-{n}">',
             f'<h3><span class="badge {_e(r.status)}">{_e(r.status)}</span> {_e(r.case_id)}</h3>',
             f'<p class="meta">suite {_e(r.suite)} · family {_e(r.family)} · dtype {_e(r.dtype)} · '
             f'{r.examples} example(s) · {r.seconds:.2f} s</p>']
    if d.stage:
        parts.append(f'<p class="stage">{_e(d.stage_line())}</p>')
    if d.shrunk:
        parts.append(f'<p class="stage">{_e(d.shrunk)}</p>')
    grid = _device_grid(d)
    if grid:
        parts.append("<h4>Mismatches per device</h4>" + grid)
    text, rest = _texts(r)
    if text:
        title, cls = ("Mismatch report", "report") if d.report else ("Message", "message")
        parts.append(f'<h4>{title}</h4><pre class="{cls}">{_e(text)}</pre>')
    if rest:
        parts.append(f'<pre class="message">{_e(rest)}</pre>')
    if d.description and _lines(d.description) not in _lines(text):
        parts.append(f"<h4>Case</h4><pre>{_e(d.description)}</pre>")
    if d.traceback:
        parts.append(f"<h4>Traceback</h4><pre>{_e(d.traceback)}</pre>")
    for key in ("fatal_line", "stderr_tail"):
        if getattr(d, key) and str(getattr(d, key)) not in text:
            parts.append(f"<h4>{_e(key.replace('_', ' '))}</h4><pre>{_e(getattr(d, key))}</pre>")
    colours = DeviceSetColours()   # one per failure: the same holders, the same colour in each picture
    layouts = [_layout_figure(e, colours) for e in d.layouts or () if isinstance(e, dict)]
    if layouts:
        parts.append('<h4>Layouts <small>(a colour per set of devices holding a block; '
                     'numbers are device ids)</small></h4><div class="figures">' + "".join(layouts) + "</div>")
    if repro is not None:
        parts.append(f'<h4>Reproducer <code>{_e(r.repro_path)}</code> '
                     f'<button class="copy" data-target="repro-{n}" type="button">copy</button></h4>'
                     f'<pre class="repro" id="repro-{n}">{_e(repro)}</pre>')
    parts.append('<p class="top"><a href="#top">back to the top</a></p></section>')
    return "\n".join(parts)


# -- the page ------------------------------------------------------------------------------
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1em 1.5em;color:#222;max-width:1200px}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin:1em 0 .3em}h3{font-size:1.05em;margin:.4em 0}
h4{font-size:.95em;margin:.8em 0 .3em}h4 small{font-weight:normal;color:#666}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}
td.l,th.l{text-align:left;font-family:monospace}
pre{background:#f6f6f6;border:1px solid #ddd;padding:.5em;overflow:auto;max-height:40em;margin:.3em 0}
pre.report,pre.message{max-height:24em}
.badge{padding:1px 6px;border-radius:3px;color:#fff;font-size:80%}
.badge.pass{background:#1a9850}.badge.fail{background:#d73027}.badge.error{background:#7b3294}
.badge.timeout{background:#b2182b}.badge.xfail{background:#878787}.badge.xpass{background:#e08214}
.badge.unsupported{background:#4575b4}
p.verdict{font-size:1.05em;margin:.2em 0 .6em}nav{font-size:90%;color:#555}
ol.failures li{margin:.2em 0}ol.failures .why{color:#555;font-size:90%}
section.case{border-top:2px solid #ccc;margin-top:1em}
p.meta,p.stage{margin:.2em 0}p.meta{color:#555;font-size:90%}p.top{font-size:85%}
.figures{display:flex;flex-wrap:wrap;gap:1em 1.5em;align-items:flex-start}figure{margin:0}
figcaption{font-size:80%;max-width:26em;overflow-wrap:anywhere}.grid figcaption{max-width:none}
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
            cls = "l" if c in ("suite", "family", "dtype") else ("bad" if c in _FAILED and v else "")
            cells.append(f'<td class="{cls}">{_e(v)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _counts_line(summary: dict, by: dict, plan: dict) -> str:
    """The verdict's one line: cases by status (failures first), and where they ran."""
    order = (*_FAILED, "pass", "xpass", "xfail", "unsupported")
    names = {"xfail": "expected failure", "xpass": "stale xfail"}
    counts = ", ".join(f"{by[s]} {names.get(s, s)}" for s in order if by.get(s))
    where = ", ".join(str(x) for x in (plan.get("platform"), plan.get("devices") and f"{plan['devices']} devices")
                      if x)
    return (f"{summary.get('cases', 0)} case(s)" + (f": {counts}" if counts else "")
            + (f" · {where}" if where else ""))


def _failure_list(failures: list[CaseResult]) -> str:
    items = "".join(f'<li><a href="#case-{n}">{_e(r.case_id)}</a> <span class="badge {_e(r.status)}">{_e(r.status)}'
                    f'</span> <span class="why">{_e(_headline(r))}</span></li>' for n, r in enumerate(failures))
    return f'<ol class="failures">{items}</ol>'


def render_page(results: list[CaseResult], plan: dict, summary: dict | None = None, *,
                sections: dict[str, str] | None = None, finished: bool = True) -> str:
    """The whole page (module docstring). `summary` defaults to `summarize(results)`; `sections`
    caches failure markup by case id."""
    if summary is None:
        summary = summarize(results, wall_seconds=0.0, compile_seconds=sum(r.compile_seconds for r in results))
    sections = {} if sections is None else sections
    by = summary.get("by_status", {})
    verdict = summary_verdict(summary) if finished else "IN PROGRESS"
    failures = [r for r in results if r.status in _FAILED]
    stale = [r for r in results if r.status == "xpass"]
    listed = {s: [r for r in results if r.status == s] for s in ("unsupported", "xfail")}
    titles = {"unsupported": "Unsupported on this platform", "xfail": "Expected failures"}

    out = [f'<h1 id="top">refsim vs XLA conformance: {_e(verdict)}</h1>',
           f'<p class="verdict">{_e(_counts_line(summary, by, plan))}</p>']
    if not finished:
        out.append('<p class="warn">The run has not finished (or crashed): this page shows the cases done so far.</p>')
    elif verdict == "INCOMPLETE":
        out.append(f'<p class="warn">This report does not cover its whole plan, so it is not a pass: '
                   f'{_e(missing_text(summary))}.</p>')
    nav = [("failures", f"Failures ({len(failures)})")] + ([("stale", "Stale xfail entries")] if stale else [])
    nav += [("run", "Run"), ("summary", "Summary")]
    nav += [(s, f"{titles[s]} ({len(rs)})") for s, rs in listed.items() if rs]
    out.append("<nav>On this page: " + " · ".join(f'<a href="#{k}">{_e(t)}</a>' for k, t in nav) + "</nav>")

    # the failures first: what a reader opens the page for
    out.append(f'<h2 id="failures">Failures ({len(failures)})</h2>')
    if failures:
        out.append(_failure_list(failures))
        for n, r in enumerate(failures):
            key = f"{n}\0{r.case_id}"
            if key not in sections:
                sections[key] = _failure_section(r, n, _read_repro(r.repro_path))
            out.append(sections[key])
    else:
        out.append("<p>None.</p>")
    if stale:
        out.append('<h2 class="warn" id="stale">Stale xfail entries</h2><p>These cases pass although the platform\'s '
                   "xfails file expects them to fail; remove their entries.</p><ul>"
                   + "".join(f"<li><code>{_e(r.case_id)}</code> {_message(r.message)}</li>" for r in stale) + "</ul>")

    # then the run
    plan_items = [(k, v if not isinstance(v, (list, tuple)) else ", ".join(map(str, v)))
                  for k, v in plan.items() if k not in _NOT_SHOWN
                  and (isinstance(v, (str, int, float, bool, list, tuple)) or v is None)]
    out.append('<h2 id="run">Run</h2>' + _kv_table(plan_items))
    stats = [("cases", summary.get("cases", len(results))), ("examples", summary.get("examples", 0))]
    if not summary.get("complete", True):
        stats[1:1] = [("planned cases", summary.get("planned_cases", "?")),
                      ("missing cases", summary.get("missing_cases", "?"))]
    stats += [(s, by.get(s, 0)) for s in STATUSES]
    if finished:
        stats += [("wall time", f"{summary.get('wall_seconds', 0.0):.1f} s"),
                  ("examples/s", f"{summary.get('examples_per_second', 0.0):.1f}"),
                  ("time compiling", f"{100 * summary.get('compile_share', 0.0):.0f}%")]
    out.append('<h2 id="summary">Summary</h2>' + _kv_table(stats) + _summary_table(summary))
    for status, rs in listed.items():
        if rs:
            out.append(f'<h2 id="{status}">{_e(titles[status])} ({len(rs)})</h2><table>'
                       + "".join(f'<tr><td class="l">{_e(r.case_id)}</td><td class="l">{_message(r.message)}</td></tr>'
                                 for r in rs) + "</table>")
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
