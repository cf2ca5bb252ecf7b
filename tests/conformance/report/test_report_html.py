"""The HTML page: summary, failures with layouts, per-device grid and escaped reproducer."""
import html
import html.parser

import numpy as np
import pytest

import refsim
from conformance.cases import Program
from conformance.verdict.compare import ComparisonResult, Mismatch, compare
from conformance.report.html import HtmlReporter, case_details, device_errors, layout_entry, render_page
from conformance.report.results import CaseResult, summarize
from refsim import Mesh, NamedSharding
from refsim import PartitionSpec as P

MESH = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]))
PLAN = {"platform": "cpu", "devices": 8, "seed": 1, "suites": ["collectives"]}


class _Page(html.parser.HTMLParser):
    """Collects start tags, and the text of every element with an id (entities decoded)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text_by_id, self._open = [], {}, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        self._open.append(attrs.get("id"))

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for i in self._open:
            if i:
                self.text_by_id[i] = self.text_by_id.get(i, "") + data


def _parse(text):
    p = _Page()
    p.feed(text)
    p.close()
    return p


def _psum_case():
    return Program(family="psum", source="def f(a):\n    return jax.lax.psum(a, 'x')\n", entry="shard_map",
                   mesh=MESH, args=(np.arange(32, dtype=np.float32).reshape(8, 4),), in_specs=(P("x", "y"),),
                   out_specs=P(None, "y"), labels=(("axes", "x"),))


def _broken_failure(tmp_path):
    """A psum case whose 'XLA' result is refsim's with device 6's shard off by one."""
    case = _psum_case()
    exp = case.run(refsim)
    shards = [refsim.Shard(s.device_id, s.index, s.data + np.float32(s.device_id == 6)) for s in exp.shards]
    act = refsim.Array(exp.shape, exp.dtype, exp.sharding, shards)
    cmp = compare(exp, act, case=case)
    repro = tmp_path / "repro_psum.py"
    repro.write_text(case.repro(exp) + "# a < b && c > d </pre><script>alert('x')</script>\n")
    result = CaseResult(case.case_id, "collectives", "psum", "float32", "fail", examples=4, seconds=0.5,
                        message="values differ on device 6 <b>", repro_path=str(repro),
                        details=case_details(case, cmp, expected=exp))
    return case, result, repro


def test_layout_entry_records_each_devices_block():
    e = layout_entry("input 0", NamedSharding(MESH, P("x", "y")), (8, 4))
    assert e["shape"] == [8, 4] and e["label"] == "input 0"
    # device at mesh position (i, j) holds rows 4i:4i+4 and column j
    assert e["blocks"]["3"] == [[0, 4], [0, 1]]
    assert e["blocks"]["6"] == [[4, 8], [1, 2]]
    assert e["blocks"]["4"] == [[4, 8], [3, 4]]
    assert len(e["blocks"]) == 8


def test_layout_entry_integer_index_is_a_unit_block():
    class Unstacked:  # pmap's layout: dimension 0 removed, device d holds row d
        def devices_indices_map(self, shape):
            return {d: (d, slice(None)) for d in range(shape[0])}

    assert layout_entry("out", Unstacked(), (2, 3))["blocks"] == {"0": [[0, 1], [0, 3]], "1": [[1, 2], [0, 3]]}


def test_device_errors_counts_elements_per_device():
    cmp = ComparisonResult(mismatches=(
        Mismatch(0, "values", "m", device_id=2, count=3, size=4),
        Mismatch(1, "values", "m", device_id=2, count=1, size=4),
        Mismatch(0, "index", "m", device_id=5),
        Mismatch(-1, "outputs", "m"),
    ), outputs=2, devices=8, elements=64)
    assert device_errors(cmp) == {"2": 4, "5": 1}


def test_case_details_of_a_failing_case(tmp_path):
    case, result, _ = _broken_failure(tmp_path)
    d = result.details
    assert d["device_errors"] == {"6": 4}  # the whole (4, 1) shard of device 6 is off by one
    assert d["mesh"] == {"axis_sizes": [2, 4], "axis_names": ["x", "y"], "device_ids": [[3, 1, 0, 2], [7, 6, 5, 4]]}
    assert [e["label"] for e in d["layouts"]] == ["input 0", "output 0"]
    assert d["layouts"][1]["shape"] == [4, 4]
    assert d["layouts"][1]["blocks"]["6"] == [[0, 4], [1, 2]]  # P(None, 'y'): column 1 on y=1
    assert "device 6" in d["report"] and "refsim 18.0, xla 19.0" in d["report"]


def test_page_shows_the_failure_layouts_grid_and_escaped_reproducer(tmp_path):
    case, result, repro = _broken_failure(tmp_path)
    ok = CaseResult("ppermute[x]", "collectives", "ppermute", "int32", "pass", examples=10)
    page = render_page([ok, result], PLAN, summarize([ok, result], wall_seconds=2.0, compile_seconds=0.5))
    parsed = _parse(page)
    assert "DISAGREE" in page and case.case_id in page
    assert "values differ on device 6 &lt;b&gt;" in page
    # only the page's own copy script: the reproducer's </pre><script> stays text
    assert [t for t, _ in parsed.tags].count("script") == 1
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert parsed.text_by_id["repro-0"] == repro.read_text()
    buttons = [a for t, a in parsed.tags if t == "button"]
    assert buttons == [{"class": "copy", "data-target": "repro-0", "type": "button"}]
    assert [t for t, _ in parsed.tags].count("svg") == 3  # input layout, output layout, device grid
    blocks = [(a["data-devices"], a["data-rows"], a["data-cols"]) for t, a in parsed.tags
              if t == "g" and a.get("class") == "block"]
    # input P('x', 'y') over ids [[3,1,0,2],[7,6,5,4]]: one (4, 1) block per device
    assert blocks[:8] == [("3", "0:4", "0:1"), ("1", "0:4", "1:2"), ("0", "0:4", "2:3"), ("2", "0:4", "3:4"),
                          ("7", "4:8", "0:1"), ("6", "4:8", "1:2"), ("5", "4:8", "2:3"), ("4", "4:8", "3:4")]
    # output P(None, 'y') of shape (4, 4): column j held by both devices of y=j
    assert blocks[8:] == [("3,7", "0:4", "0:1"), ("1,6", "0:4", "1:2"), ("0,5", "0:4", "2:3"), ("2,4", "0:4", "3:4")]
    grid = {a["data-device"]: a["data-value"] for t, a in parsed.tags if t == "g" and a.get("class") == "device"}
    assert grid == {"6": "4", **{str(d): "0" for d in (0, 1, 2, 3, 4, 5, 7)}}
    assert "examples/s" in page and "25%" in page  # 0.5 s of 2.0 s compiling


def test_statuses_other_than_failures_are_listed(tmp_path):
    rs = [CaseResult("pbroadcast[s=0]", "collectives", "pbroadcast", "float32", "unsupported",
                     message="XLA:CPU has no pbroadcast lowering"),
          CaseResult("hlo[iota]", "layouts", "hlo", "float32", "xpass", message="listed in xfails/cpu.txt"),
          CaseResult("named[x]", "layouts", "named", "float32", "xfail", message="HLO text differs")]
    page = render_page(rs, PLAN, summarize(rs, wall_seconds=1.0, compile_seconds=0.0))
    assert "Unsupported on this platform (1)" in page and "XLA:CPU has no pbroadcast lowering" in page
    assert "Stale xfail entries" in page and "hlo[iota]" in page
    assert "Expected failures (1)" in page
    assert "Failures (0)" in page and "AGREE" in page


def test_reporter_writes_in_progress_pages_and_the_final_one(tmp_path):
    _, failure, _ = _broken_failure(tmp_path)
    path = tmp_path / "report" / "report.html"
    rep = HtmlReporter(path, every=2)
    rep.start(PLAN)
    assert "IN PROGRESS" in path.read_text() and "Failures (0)" in path.read_text()
    ok = CaseResult("ppermute[x]", "collectives", "ppermute", "int32", "pass")
    rep.case_finished(ok)
    rep.case_finished(failure)
    mid = path.read_text()
    assert "IN PROGRESS" in mid and "Failures (1)" in mid and "<svg" in mid
    rep.finish(summarize([ok, failure], wall_seconds=1.0, compile_seconds=0.0))
    assert "DISAGREE" in path.read_text() and "IN PROGRESS" not in path.read_text()


def test_missing_reproducer_and_bad_layout_are_reported_not_raised(tmp_path):
    r = CaseResult("c", "programs", "scan", "int32", "error", message="boom",
                   repro_path=str(tmp_path / "gone.py"),
                   details={"layouts": [{"label": "input 0", "shape": [4]}], "traceback": "Traceback: x < y"})
    page = render_page([r], PLAN)
    assert "reproducer could not be read from" in page
    assert "layout input 0 could not be drawn" in page
    assert "Traceback: x &lt; y" in page


def test_every_must_be_a_positive_int(tmp_path):
    with pytest.raises(ValueError, match=r"every=-1; pass how many cases"):
        HtmlReporter(tmp_path / "r.html", every=-1)


# -- a page a person reads: the failures first, each said once ------------------------------
def _shrunk_like_the_engine(tmp_path):
    """The record the runner writes after shrinking: the message is the report plus the shrink note."""
    case, result, repro = _broken_failure(tmp_path)
    note = "shrunk to psum[small] (arg 0: float32[2, 4])"
    result.details.shrunk = note
    result.message = f"{result.details.report}\n{note}"
    return case, result, repro


def _busy_run(failures):
    """Many passing families, unsupported cases and expected failures around `failures`."""
    rs = [CaseResult(f"psum[fam{i}]", "collectives", f"fam{i}", "float32", "pass", examples=10) for i in range(40)]
    rs += [CaseResult(f"pbroadcast[{i}]", "collectives", "pbroadcast", "float32", "unsupported",
                      message="XLA:CPU has no pbroadcast lowering\nsecond line") for i in range(3)]
    rs += [CaseResult(f"pmax[{i}]", "collectives", "pmax", "float32", "xfail", message="NaN ignored\nby XLA:CPU")
           for i in range(3)]
    return rs[:20] + list(failures) + rs[20:]


def _outside_repro(page: str) -> str:
    """The page's text with the reproducers taken out (a reproducer may quote the case)."""
    import re

    return re.sub(r'<pre class="repro"[^>]*>.*?</pre>', "", page, flags=re.S)


def test_failures_come_first_with_a_list_linking_to_each(tmp_path):
    _, first, _ = _shrunk_like_the_engine(tmp_path)
    second = CaseResult("scan[a]", "programs", "scan", "int32", "error", message="ValueError: boom",
                        details={"traceback": "Traceback (most recent call last):\nValueError: boom",
                                 "exception_type": "ValueError"})
    rs = _busy_run([first, second])
    page = render_page(rs, PLAN, summarize(rs, wall_seconds=1.0, compile_seconds=0.0))
    at = {k: page.index(k) for k in ('<h1 id="top">', 'id="failures"', '<ol class="failures">', 'id="case-0"',
                                     'id="case-1"', 'id="run"', 'id="summary"', 'id="unsupported"', 'id="xfail"')}
    assert list(at.values()) == sorted(at.values()), at
    assert "DISAGREE" in page[:at['id="failures"']] and "1 fail, 1 error, 40 pass" in page[:at['id="failures"']]
    parsed = _parse(page)
    ids = [a["id"] for _, a in parsed.tags if "id" in a]
    assert len(ids) == len(set(ids)), ids
    links = [a["href"][1:] for t, a in parsed.tags if t == "a" and a.get("href", "").startswith("#")]
    assert {"case-0", "case-1", "failures", "run", "summary", "unsupported", "xfail", "top"} <= set(links)
    assert set(links) <= set(ids), set(links) - set(ids)
    # the list says what went wrong, in one line each
    assert "4 mismatching element(s) on 1 device(s)" in page[at['<ol class="failures">']:at['id="case-0"']]
    assert "ValueError" in page[at['<ol class="failures">']:at['id="case-0"']]


def test_the_mismatch_text_is_shown_once_before_the_layouts(tmp_path):
    case, result, _ = _shrunk_like_the_engine(tmp_path)
    page = render_page([result], PLAN)
    shown = html.unescape(_outside_repro(page))
    report = result.details.report
    for line in {line.strip() for line in report.splitlines() if line.strip()}:
        assert shown.count(line) == report.count(line), line   # no second copy (message, "Case")
    assert shown.count("shrunk to psum[small]") == 1
    section = page[page.index('id="case-0"'):]
    assert section.index("Mismatches per device") < section.index('<pre class="report">') < section.index("Layouts")
    assert section.index('<pre class="report">') < section.index('class="layout"')


def test_a_description_the_report_lacks_is_kept(tmp_path):
    r = CaseResult("c", "collectives", "psum", "float32", "fail", message="values differ",
                   details={"report": "values differ", "description": "case: c\nmesh: 2x4"})
    section = render_page([r], PLAN).split('id="case-0"')[1]
    assert section.count("values differ") == 1 and "<h4>Case</h4><pre>case: c\nmesh: 2x4</pre>" in section


def test_distinct_layouts_get_distinct_colours(tmp_path):
    from refsim.layouts.mesh import Mesh as _Mesh

    mesh = _Mesh((2, 4), ("x", "y"))
    specs = {"rows": P("x", None), "cols": P(None, "y"), "both": P("x", "y"), "replicated": P(None, None)}
    layouts = [layout_entry(k, NamedSharding(mesh, s), (8, 4)) for k, s in specs.items()]
    r = CaseResult("c", "layouts", "named", "float32", "fail", message="m",
                   details={"layouts": layouts, "report": "m"})
    page = render_page([r], PLAN)
    parsed = _parse(page)
    fills, current = {}, None
    for t, a in parsed.tags:
        if t == "svg" and a.get("class") == "layout":
            current = len(fills)
            fills[current] = []
        elif t == "rect" and current is not None and a.get("fill"):
            fills[current].append(a["fill"])
    rows, cols, both, repl = (fills[i] for i in range(4))
    for f in (rows, cols, both):
        assert len(set(f)) == len(f) > 1, f          # the blocks of one layout differ
    assert len(repl) == 1
    assert len({tuple(sorted(f)) for f in (rows, cols, both, repl)}) == 4   # and the layouts differ
    assert render_page([r], PLAN) == page              # deterministic


def test_layout_tiles_are_sized_to_the_array(tmp_path):
    entries = [layout_entry("small", NamedSharding(MESH, P("x")), (2,)),
               layout_entry("big", NamedSharding(MESH, P("x", "y")), (4096, 1024))]
    r = CaseResult("c", "layouts", "named", "float32", "fail", message="m", details={"layouts": entries})
    sizes = [(float(a["width"]), float(a["height"])) for t, a in _parse(render_page([r], PLAN)).tags
             if t == "svg" and a.get("class") == "layout"]
    (sw, sh), (bw, bh) = sizes
    assert sw <= 100 and sh <= 30, sizes
    assert bw <= 361 and bh <= 181, sizes


def test_an_incomplete_run_shows_its_failures_first_too(tmp_path):
    from conformance.report.results import cover

    _, failure, _ = _shrunk_like_the_engine(tmp_path)
    ok = CaseResult("ppermute[x]", "collectives", "ppermute", "int32", "pass")
    summary = cover(summarize([ok, failure], wall_seconds=1.0, compile_seconds=0.0),
                    [ok.case_id, failure.case_id, "psum[missing]"], [ok, failure], why="interrupted by SIGINT")
    page = render_page([ok, failure], PLAN, summary)
    assert "INCOMPLETE" in page[:page.index('id="failures"')]
    assert "psum[missing]" in page[:page.index('id="failures"')]
    assert page.index('href="#case-0"') < page.index('id="case-0"') < page.index('id="run"')
