"""The terminal side of a run: a live progress bar while cases finish, and the final table.

`ProgressReporter` is a `Reporter`: a rich progress bar with cases done/total, the
pass / fail / other counts and examples per second; each failure, error and stale
xfail is printed above the bar as it happens. `print_table` prints the summary the
runner computes (`conformance.report.results.summarize`): one row per suite × family × dtype.
"""
from __future__ import annotations

import os
import time

import rich.box
import rich.console
import rich.table
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from conformance.report.results import STATUSES, CaseResult, missing_text
from conformance.report.timing import line

__all__ = ["ProgressReporter", "print_table", "summary_line", "versions_line"]

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold magenta", "timeout": "bold magenta", "xfail": "dim",
          "xpass": "yellow", "unsupported": "blue"}


def _console(console):
    if console is not None:
        return console
    c = rich.console.Console()
    if not c.is_terminal and "COLUMNS" not in os.environ:
        # Logs and CI capture get rich's 80-column default, which folds family names.
        c = rich.console.Console(width=120)
    return c


class ProgressReporter:
    """A live progress bar over `total` cases (None: unknown, the bar then pulses)."""

    def __init__(self, total: int | None, console=None):
        if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 0):
            raise ValueError(f"total={total!r}; pass the number of planned cases (an int >= 0) or None.")
        self.total = total
        self.console = _console(console)
        self.counts = {s: 0 for s in STATUSES}
        self.examples = 0
        self._progress = None
        self._task = None
        self._t0 = None

    def start(self, plan: dict) -> None:
        self._t0 = time.perf_counter()
        what = ", ".join(f"{k} {plan[k]}" for k in ("platform", "devices", "suite") if plan.get(k) is not None)
        # The elapsed time is a field this reporter sets (not rich's own clock), so the bar's
        # last value is the summary's wall time, in the summary line's format.
        self._progress = Progress(TextColumn("[bold]conformance[/]"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[counts]}"), TextColumn("{task.fields[rate]}"),
                                  TextColumn("{task.fields[elapsed]}"), console=self.console, transient=False)
        self._progress.start()
        self._task = self._progress.add_task("cases", total=self.total, counts=self._counts_text(), rate="",
                                             elapsed="0.0 s")
        if what:
            self._progress.console.print(f"conformance run: {what}")

    def _counts_text(self) -> str:
        c = self.counts
        text = f"[green]{c['pass']} pass[/] [red]{c['fail']} fail[/]"
        if c["error"]:
            text += f" [magenta]{c['error']} error[/]"
        if c["timeout"]:
            text += f" [magenta]{c['timeout']} timeout[/]"
        other = [f"{c[s]} {s}" for s in ("xfail", "xpass", "unsupported") if c[s]]
        return text + (" [dim]" + " ".join(other) + "[/]" if other else "")

    def case_finished(self, result: CaseResult) -> None:
        if self._progress is None:
            raise RuntimeError("ProgressReporter.case_finished before start(plan); call start first.")
        self.counts[result.status] += 1
        self.examples += result.examples
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        self._progress.update(self._task, advance=1, counts=self._counts_text(),
                              rate=f"{self.examples / elapsed:.1f} ex/s", elapsed=f"{elapsed:.1f} s")
        if result.status in ("fail", "error", "timeout", "xpass"):
            label = {"fail": "FAIL", "error": "ERROR", "timeout": "TIMEOUT", "xpass": "STALE XFAIL"}[result.status]
            first = result.message.strip().splitlines()[0] if result.message.strip() else ""
            repro = f" (reproducer: {escape(result.repro_path)})" if result.repro_path else ""
            where = result.details.diverged_in
            repro += f" [diverged in {where}]" if where else ""
            self._progress.console.print(f"[{_STYLE[result.status]}]{label}[/] {escape(result.case_id)}: "
                                         f"{escape(first)}{repro}")

    def finish(self, summary: dict) -> None:
        if self._progress is not None:
            if "wall_seconds" in summary:  # end on the numbers the summary line prints
                self._progress.update(self._task, counts=self._counts_text(),
                                      rate=f"{summary.get('examples_per_second', 0.0):.1f} ex/s",
                                      elapsed=f"{summary['wall_seconds']:.1f} s")
            self._progress.stop()
            self._progress = None


def summary_line(summary: dict) -> str:
    """``N cases, M examples in W s: R examples/s, P% of the time compiling``."""
    return (f"{summary.get('cases', 0)} cases, {summary.get('examples', 0)} examples in "
            f"{summary.get('wall_seconds', 0.0):.1f} s: {summary.get('examples_per_second', 0.0):.1f} examples/s, "
            f"{100 * summary.get('compile_share', 0.0):.0f}% of the time compiling")


def versions_line(plan: dict) -> str:
    """``platform cpu (8 devices); jax 0.10.2, jaxlib 0.10.2, numpy 2.4.6, python 3.11.9`` from a run's plan."""
    where = f"platform {plan['platform']}" if plan.get("platform") else ""
    if where and plan.get("devices"):
        where += f" ({plan['devices']} devices)"
    names = [f"{k} {plan[k]}" for k in ("jax", "jaxlib", "numpy", "python") if plan.get(k)]
    return "; ".join(p for p in (where, ", ".join(names)) if p)


def print_table(summary: dict, console=None, *, results=None):
    """Print the final table (family × dtype, grouped by suite, against pass / fail / error / xfail / xpass /
    unsupported / examples, with a total row), the speed line, a warning per stale xfail, and the verdict: AGREE,
    DISAGREE, or INCOMPLETE naming the missing cases when the summary does not cover its plan.

    Stale entries are named from `results` (status "xpass") or ``summary["stale_xfails"]``;
    without either, their count is warned about. Returns the rich Table.
    """
    console = _console(console)
    by = summary.get("by_status", {})
    ok = summary.get("ok", not (by.get("fail") or by.get("error") or by.get("timeout")))
    # Rows grouped by suite under a heading row, so a terminal of 80 columns fits every count
    # with its full header; long family names fold onto a second line.
    table = rich.table.Table(title="refsim vs XLA conformance", show_footer=True, box=rich.box.SIMPLE_HEAD,
                             collapse_padding=True, pad_edge=False)
    total = {s: by.get(s, 0) for s in STATUSES}
    table.add_column("family", footer="total", overflow="fold", min_width=12)
    table.add_column("dtype", overflow="fold", min_width=8)
    # "timeout" gets a column only when a case timed out: the table stays within 80 columns
    shown = [s for s in STATUSES if s != "timeout" or total[s]]
    for s in shown:
        table.add_column(s, justify="right", footer=str(total[s]), min_width=len(s), no_wrap=True)
    table.add_column("examples", justify="right", footer=str(summary.get("examples", 0)), min_width=8, no_wrap=True)
    suite = None
    for row in summary.get("table", ()):
        if row.get("suite") != suite:
            suite = row.get("suite")
            table.add_row(f"[bold]{escape(str(suite))}[/]", end_section=False)
        cells = []
        for s in shown:
            v = row.get(s, 0)
            cells.append(f"[{_STYLE[s]}]{v}[/]" if v and s in ("fail", "error", "timeout", "xpass") else (str(v) if v else "·"))
        table.add_row("  " + escape(str(row.get("family", ""))), escape(str(row.get("dtype", ""))), *cells,
                      str(row.get("examples", 0)))
    console.print(table)
    console.print(summary_line(summary))
    if summary.get("phases"):
        console.print(line(summary["phases"], summary.get("wall_seconds", 0.0)), soft_wrap=True)
    versions = versions_line(summary.get("plan") or {})
    if versions:
        console.print(versions)
    if by.get("unsupported"):
        console.print(f"[blue]{by['unsupported']} case(s) unsupported on this platform[/] (not counted as passes)")
    skipped = (summary.get("plan") or {}).get("not_drawn") or ()
    if skipped:
        devices = (summary.get("plan") or {}).get("devices")
        console.print(f"[blue]not drawn on {devices} device(s)[/] (not in the plan, not counted as passes): "
                      + "; ".join(escape(str(x)) for x in skipped))
    stale = [r.case_id for r in results or () if r.status == "xpass"] or list(summary.get("stale_xfails") or ())
    for cid in stale:
        console.print(f"[yellow]warning:[/] stale xfail entry {escape(str(cid))}: it passes now; "
                      "remove it from the platform's xfails file")
    if not stale and by.get("xpass"):
        console.print(f"[yellow]warning:[/] {by['xpass']} stale xfail entr{'y' if by['xpass'] == 1 else 'ies'} "
                      "(status xpass): remove them from the platform's xfails file")
    bad = (f"{by.get('fail', 0)} failure(s), {by.get('error', 0)} error(s)"
           + (f", {by['timeout']} timeout(s)" if by.get("timeout") else ""))
    if not summary.get("complete", True):
        # never AGREE: the cases that did not run may disagree
        console.print(f"[bold yellow]INCOMPLETE[/]: {escape(missing_text(summary))}"
                      + (f"; among the cases that ran: {bad}" if by.get("fail") or by.get("error") or by.get("timeout")
                         else ""), soft_wrap=True)
    else:
        console.print("[bold green]AGREE[/]" if ok else f"[bold red]DISAGREE[/]: {bad}")
    return table
