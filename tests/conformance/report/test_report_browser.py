"""report.html in a real browser: Chromium (headless) lays the page out at 1280 x 900 and a script
measures it: the first failure's heading is on the first screen, every in-page link names an
element that exists (and clicking it targets that element), each failure's mismatch report is
said once, and the layout pictures are small.

Needs Debian's ``chromium`` (``apt-get install chromium``) at /usr/bin/chromium; the tests skip,
saying so, where it is absent (CI does not install it). The page is measured in a copy with
one inline script added at the end of its body, which writes what it measured into the DOM
that ``chromium --dump-dom`` prints.

Run as a script, this file regenerates the screenshot of docs/reports.md:

    .venv/bin/python tests/conformance/report/test_report_browser.py docs/img/report-one-failure.png
"""
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

CHROMIUM = "/usr/bin/chromium"
WINDOW = (1280, 900)
FAULT = "groups_strided_as_contiguous"   # with --suite collectives --examples 2 --seed 0: one failure

needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                    reason=f"{CHROMIUM} is absent: install Debian's chromium "
                                           "(apt-get install chromium) to lay report.html out in a browser")

_MEASURE = r"""
<script id="measure">(function () {
  function top(el) { return el.getBoundingClientRect().top + window.scrollY; }
  function count(text, s) {
    var n = 0, i = 0; while (s && (i = text.indexOf(s, i)) >= 0) { n++; i += s.length; } return n;
  }
  var out = {links: [], sections: [], layouts: []};
  var first = document.querySelector('section.case h3');
  out.first_heading = first ? {top: top(first), bottom: top(first) + first.getBoundingClientRect().height} : null;
  var run = document.getElementById('run'); out.run_top = run ? top(run) : null;
  document.querySelectorAll('a[href^="#"]').forEach(function (a) {
    var id = a.getAttribute('href').slice(1), el = document.getElementById(id);
    a.click();
    out.links.push({id: id, exists: !!el, targeted: !!el && document.querySelector(':target') === el});
  });
  window.scrollTo(0, 0);
  document.querySelectorAll('section.case').forEach(function (s) {
    var copy = s.cloneNode(true);
    copy.querySelectorAll('pre.repro').forEach(function (p) { p.remove(); });
    var text = copy.textContent, rep = s.querySelector('pre.report'), lines = [];
    if (rep) rep.textContent.split('\n').forEach(function (l) {
      l = l.trim(); if (l) lines.push([l, count(text, l), count(rep.textContent, l)]);
    });
    out.sections.push({id: s.id, top: top(s), lines: lines, background: getComputedStyle(s).backgroundColor});
  });
  document.querySelectorAll('figure.layout svg').forEach(function (g) {
    var r = g.getBoundingClientRect(), fills = [];
    g.querySelectorAll('g.block rect').forEach(function (x) { fills.push(getComputedStyle(x).fill); });
    out.layouts.push({width: r.width, height: r.height, fills: fills});
  });
  var pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();</script>
"""


def _chromium(*args, timeout=120):
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--hide-scrollbars", f"--user-data-dir={profile}",
                               f"--window-size={WINDOW[0]},{WINDOW[1]}", *args],
                              capture_output=True, text=True, timeout=timeout, check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def measure(page: str, folder) -> dict:
    """What the script above measures of `page`, laid out by Chromium at 1280 x 900."""
    path = os.path.join(str(folder), "measured.html")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page.replace("</body>", _MEASURE + "</body>", 1))
    dom = _chromium("--dump-dom", "file://" + path).stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script wrote nothing; chromium printed:\n{dom[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def _check(m: dict, failures: int) -> None:
    assert m["first_heading"] is not None and m["first_heading"]["bottom"] <= WINDOW[1], m["first_heading"]
    assert m["run_top"] > m["sections"][-1]["top"], (m["run_top"], m["sections"])
    assert len(m["sections"]) == failures
    bad = [x for x in m["links"] if not (x["exists"] and x["targeted"])]
    assert not bad and {f"case-{n}" for n in range(failures)} <= {x["id"] for x in m["links"]}, bad
    for s in m["sections"]:
        assert s["background"] == "rgba(0, 0, 0, 0)", s["background"]   # a status colours its badge only
        copies = [(line, shown, said) for line, shown, said in s["lines"] if shown != said]
        assert not copies, f"{s['id']}: mismatch text shown more than once: {copies[:3]}"
    for lay in m["layouts"]:
        assert lay["width"] <= 361 and lay["height"] <= 181, lay
        assert len(set(lay["fills"])) == len(lay["fills"]), lay


def one_failure_run(folder):
    """The collectives suite (2 examples per family, seed 0) with one planted lowering fault."""
    from xla_backend import platform

    platform.configure("cpu", 8)   # before conformance imports JAX
    from conformance import faults
    from conformance.engine import runner

    with faults.inject(FAULT):
        return runner.run(suite="collectives", examples=2, seed=0, report_dir=str(folder), progress=False,
                          shrink_seconds=0, compile_cache="off")


@needs_chromium
def test_a_busy_page_shows_its_failures_on_the_first_screen(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_report_html import _busy_run, _shrunk_like_the_engine   # the same pages as the HTML tests

    from conformance.report.html import render_page
    from conformance.report.results import CaseResult, summarize

    _, first, _ = _shrunk_like_the_engine(tmp_path)
    second = CaseResult("scan[a]", "programs", "scan", "int32", "error", message="ValueError: boom",
                        details={"traceback": "Traceback (most recent call last):\nValueError: boom"})
    rs = _busy_run([first, second])
    m = measure(render_page(rs, {"platform": "cpu", "devices": 8}, summarize(rs, wall_seconds=1.0,
                                                                               compile_seconds=0.0)), tmp_path)
    _check(m, failures=2)
    assert len(m["layouts"]) == 2 and m["sections"][0]["lines"], m


@needs_chromium
@pytest.mark.slow
def test_a_real_run_with_one_planted_fault(tmp_path):
    res = one_failure_run(tmp_path / "report")
    failed = [r for r in res.results if r.status in ("fail", "error", "timeout")]
    assert failed, "the planted fault no longer makes a case fail; pick another FAULT"
    m = measure((tmp_path / "report" / "report.html").read_text(encoding="utf-8"), tmp_path)
    _check(m, failures=len(failed))


def main(out_png: str) -> None:
    """Run the one-failure run and write a 1280 x 900 screenshot of its report.html to `out_png`."""
    folder = tempfile.mkdtemp(prefix="report-one-failure-")
    res = one_failure_run(folder)
    print("cases by status:", res.summary["by_status"])
    _chromium(f"--screenshot={os.path.abspath(out_png)}", "file://" + os.path.join(folder, "report.html"))
    print(f"{out_png}: {os.path.getsize(out_png)} bytes; report in {folder}")
    print(_chromium("--version").stdout.strip())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.png")
    main(sys.argv[1])
