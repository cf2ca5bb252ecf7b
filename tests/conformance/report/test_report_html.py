"""The HTML page: summary, failures with layouts, per-device grid and escaped reproducer."""
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
