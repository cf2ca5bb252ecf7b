"""The conformance runner: xfails files, status rules, reports, resume, compile reuse, processes."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

import refsim
import xla_backend
from conformance.engine import runner
from conformance.verdict import xfails
from conformance.cases import CollectiveCall
from conformance.suites import base, selected
from refsim import Mesh, PartitionSpec as P


# -- xfails files ------------------------------------------------------------------------------
def test_xfails_patterns_match_literally_except_star():
    (e,) = xfails.parse("psum[axes='x',*,mesh=2:default] mismatch(value): XLA differs here")
    assert e.matches("psum[axes='x',groups=none,dtype=int32,mesh=2:default]")
    assert not e.matches("psum[axes='y',groups=none,dtype=int32,mesh=2:default]")
    # brackets are literal, not a character class as in fnmatch
    assert not xfails.parse("p[ab] crash: r")[0].matches("pa")
    assert xfails.parse("p[ab] crash: r")[0].matches("p[ab]")


def test_xfails_signatures_regex_and_versions():
    text = """
    # comment
    pbroadcast[* unsupported: no CPU lowering
    re:^ppermute\\[axes=\\('y','x' jax<0.11 sometimes mismatch(value, nan-dropped): mesh order
    pmean[* jax>=0.11 raises(JaxRuntimeError, /replica groups/): verifier
    pmax[* model(xla-cpu-max-min): NaN ignored
    """
    es = xfails.parse(text)
    assert [(e.kind, e.sometimes, e.version) for e in es] == [
        ("unsupported", False, None), ("mismatch", True, ("<", (0, 11))), ("raises", False, (">=", (0, 11))),
        ("model", False, None)]
    assert es[1].classes == ("value", "nan-dropped") and es[2].exception == "JaxRuntimeError"
    assert es[2].signature == "raises(JaxRuntimeError, /replica groups/)" and es[3].model == "xla-cpu-max-min"
    assert es[1].matches("ppermute[axes=('y','x'),perm=cycles]")
    old = xfails.XfailList(es, jax_version="0.10.2")
    new = xfails.XfailList(es, jax_version="0.12.0")
    assert [e.line for e in old.entries] == [3, 4, 6]
    assert [e.line for e in new.entries] == [3, 5, 6]
    assert old.lookup("pmean[x]") is None and new.lookup("pmean[x]").reason == "verifier"
    assert [e.line for e in new.unused()] == [3, 6]


def test_xfails_errors_name_the_line_and_fix():
    with pytest.raises(ValueError, match=r"f.txt:2: entry 'psum\[\*' has no signature and reason"):
        xfails.parse("# c\npsum[*\n", source="f.txt")
    with pytest.raises(ValueError, match=r"f.txt:1: entry 'psum\[\*' has no signature.*SIGNATURE one of mismatch"):
        xfails.parse("psum[* XLA differs", source="f.txt")             # a reason without a signature
    with pytest.raises(ValueError, match=r"f.txt:1: pattern 're:\(' is not a valid regular expression"):
        xfails.parse("re:( crash: reason", source="f.txt")
    with pytest.raises(ValueError, match=r"unknown classes \['nan'\]; choose from nan-dropped"):
        xfails.parse("x mismatch(nan): r", source="f.txt")
    with pytest.raises(ValueError, match=r"model\(nope\) is not a platform model; choose from xla-cpu-arith"):
        xfails.parse("x model(nope): r", source="f.txt")
    with pytest.raises(ValueError, match="xfails file 'nope.txt' does not exist"):
        xfails.load("nope.txt")


def test_cpu_xfails_file_parses_and_lists_unsupported_ops():
    xl = xfails.load(None, platform="cpu")
    assert xl.lookup("pbroadcast[axes='x',source=0,dtype=int32,mesh=2:default]").unsupported
    assert xl.lookup("corpus:ragged_all_to_all_moe_dispatch[mesh=4]").unsupported
    assert xl.lookup("pmax[axes='x',groups=none,dtype=float32,mesh=2:default]").model == "xla-cpu-max-min"
    assert xl.lookup("all_gather[axes='x',groups=none,axis=0,tiled=False,dtype=float32,mesh=2:default]") is None
    assert not any(e.too_broad() for e in xl.entries)


# -- status rules --------------------------------------------------------------------------------
_VALUES = {"kind": "mismatch", "side": "xla", "classes": ["nan-dropped"], "layout": [], "models": {}}
_RAISES = {"kind": "raises", "side": "xla", "exception": "JaxRuntimeError",
           "exception_mro": ["JaxRuntimeError", "RuntimeError", "Exception"], "message": "replica groups should x"}
_REFSIM_RAISES = dict(_RAISES, side="refsim", exception="ValueError", exception_mro=["ValueError"])


@pytest.mark.parametrize("status,failure,sig,want", [
    ("pass", None, None, "pass"), ("fail", _VALUES, None, "fail"), ("error", _RAISES, None, "error"),
    ("unsupported", None, None, "error"),                  # not listed: the platform must say so in its file
    ("unsupported", None, "unsupported", "unsupported"),
    ("pass", None, "unsupported", "xpass"),                # it ran: the entry is stale
    ("fail", _VALUES, "mismatch(nan-dropped)", "xfail"), ("pass", None, "mismatch(nan-dropped)", "xpass"),
    ("fail", _VALUES, "mismatch(1-ulp)", "error"),         # another class of difference
    ("fail", dict(_VALUES, layout=["index"]), "mismatch(nan-dropped)", "error"),
    ("fail", dict(_VALUES, side="refsim"), "mismatch(any)", "error"),   # refsim outside the bound
    ("error", _RAISES, "raises(RuntimeError, /replica groups/)", "xfail"),   # a subclass, message matches
    ("error", _RAISES, "raises(JaxRuntimeError, /flattened/)", "error"),
    ("error", _REFSIM_RAISES, "raises(ValueError)", "error"),            # refsim raising is never expected
    ("error", _REFSIM_RAISES, "sometimes mismatch(any)", "error"),
    ("fail", _VALUES, "unsupported", "error"),
    ("pass", None, "sometimes mismatch(value)", "pass"), ("fail", _VALUES, "sometimes mismatch(nan-dropped)", "xfail"),
])
def test_xfail_signature_decides_the_status(status, failure, sig, want):
    entry = None if sig is None else xfails.parse(f"x {sig}: why")[0]
    out = base.Outcome(status, "msg", details={} if failure is None else {"failure": failure})
    got, message = runner._apply_xfail(out, entry)
    assert got == want, message
    if want == "error" and status == "unsupported":
        assert "unsupported: REASON" in message
    if want == "error" and entry is not None:
        assert "but this failure is not that one" in message


def test_too_broad_entries_are_named():
    es = xfails.parse("a mismatch(any): r\nb raises(ValueError): r\nc mismatch(value): r")
    assert [bool(e.too_broad()) for e in es] == [True, True, False]


def test_crash_entries_are_not_run():
    entry = xfails.parse("psum[* crash: XLA aborts on this")[0]
    assert entry.crash
    double = Counting()
    res = runner.run_task(base.group_tasks("collectives", [_psum_call()], seed=0)[0], double, entry)
    assert (res.status, res.examples, double.calls) == ("xfail", 0, 0)
    assert res.message == "not run: crash: XLA aborts on this"


def test_unsupported_reason_reads_jax_lowering_errors():
    e = NotImplementedError("MLIR translation rule for primitive 'pbroadcast' not found for platform cpu")
    assert runner.unsupported_reason(e) == "MLIR translation rule for primitive 'pbroadcast' not found for platform cpu"
    assert runner.unsupported_reason(ValueError("bad perm")) is None


# -- one task ----------------------------------------------------------------------------------------
def _psum_call(mesh=Mesh((4,), ("x",)), x=None):
    x = np.arange(8, dtype=np.float32).reshape(4, 2) if x is None else x
    return CollectiveCall(family="psum", source="def f(a):\n    return jax.lax.psum(a, 'x')\n", entry="shard_map",
                          mesh=mesh, args=(x,), in_specs=(P("x"),), out_specs=P(), labels=(("axes", "'x'"),),
                          outputs=("sum",), name="psum", params={"axis_name": "x"})


def test_examples_differing_only_in_data_reuse_one_executable():
    call = _psum_call()
    task = base.group_tasks("collectives", [call], seed=3, variants=4)[0]
    assert len(task.variants) == 4
    assert len({v.fn for v in task.variants}) == 1                      # one function object
    assert not np.array_equal(task.variants[0].args[0], task.variants[1].args[0])
    xla_backend.clear_cache()
    before = xla_backend.stats()
    res = runner.run_task(task)
    after = xla_backend.stats()
    assert res.status == "pass" and res.examples == 4
    assert after["compiles"] - before["compiles"] == 1
    assert after["cache_hits"] - before["cache_hits"] == 3
    assert res.compile_seconds > 0


def test_exact_friendly_refill_keeps_sums_exact():
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float16, np.int8, np.uint32, np.bool_, np.complex64):
        v = base.exact_friendly(rng, np.zeros((64,), dt))
        assert v.dtype == dt and v.shape == (64,)
    f = base.exact_friendly(rng, np.zeros((1000,), np.float32))
    assert np.all(f * 4 == np.round(f * 4)) and np.abs(f).max() <= 16


def test_unsupported_case_without_entry_is_an_error_naming_the_fix():
    src = "def f(a):\n    return jax.lax.pbroadcast(a, 'x', source=1)\n"
    call = CollectiveCall(family="pbroadcast", source=src, entry="shard_map", mesh=Mesh((2,), ("x",)),
                          args=(np.arange(4.0, dtype=np.float32),), in_specs=(P("x"),), out_specs=P("x"),
                          labels=(("axes", "'x'"),), name="pbroadcast", params={"axis_name": "x", "source": 1})
    task = base.group_tasks("collectives", [call], seed=0, variants=1)[0]
    res = runner.run_task(task)
    assert res.status == "error"
    assert "not found for platform cpu" in res.message and "unsupported: REASON" in res.message
    entry = xfails.parse("pbroadcast[* unsupported: XLA:CPU has no pbroadcast lowering")[0]
    res = runner.run_task(task, None, entry)
    assert res.status == "unsupported" and res.message.startswith("unsupported: XLA:CPU has no pbroadcast lowering")


# -- whole runs -----------------------------------------------------------------------------------------
class Counting:
    """An xla= double that counts calls and otherwise is xla_backend."""

    def __init__(self):
        self.calls = 0

    def __getattr__(self, name):
        fn = getattr(xla_backend, name)

        def wrapped(*a, **k):
            self.calls += 1
            return fn(*a, **k)
        return wrapped


def test_run_writes_reports_and_resume_skips_finished_cases(tmp_path):
    rep = tmp_path / "rep"
    first = runner.run(suite="errors", examples=2, report_dir=rep, progress=False)
    assert first.ok and first.results
    assert {r.suite for r in first.results} == {"errors"}
    ids = [r.case_id for r in first.results]
    assert len(ids) == len(set(ids))
    assert {"results.jsonl", "junit.xml", "report.html"} <= set(os.listdir(rep))
    lines = [json.loads(l) for l in (rep / "results.jsonl").read_text().splitlines()]
    assert sum(l["type"] == "case" for l in lines) == len(ids)
    s = first.summary
    assert s["examples"] == sum(r.examples for r in first.results) and s["examples_per_second"] > 0
    assert 0 <= s["compile_share"] <= 1 and s["plan"]["suite"] == "errors"

    double = Counting()
    again = runner.run(suite="errors", examples=2, report_dir=rep, progress=False, resume=True, xla=double)
    assert double.calls == 0
    assert [r.case_id for r in again.results] == ids and again.ok


def test_run_argument_errors():
    with pytest.raises(ValueError, match="resume=True needs report_dir"):
        runner.run(suite="errors", resume=True, progress=False)
    with pytest.raises(ValueError, match="examples=0; pass a positive int"):
        runner.run(suite="errors", examples=0, progress=False)
    with pytest.raises(ValueError, match="or processes=None to run it in this process"):
        runner.run(suite="errors", processes=2, xla=xla_backend, progress=False)
    with pytest.raises(ValueError, match="suite='nope'; choose one of"):
        selected("nope")


def test_plan_is_deterministic_in_the_seed():
    a = [t.case_id for t in runner.plan_tasks("collectives", examples=2, seed=5)]
    b = [t.case_id for t in runner.plan_tasks("collectives", examples=2, seed=5)]
    assert a == b and len(a) >= 12


def test_layouts_and_mpmd_suites_pass():
    res = runner.run(suite="layouts,mpmd", examples=2, progress=False)
    assert res.ok, [r.message for r in res.results if r.status != "pass"]
    fams = {r.family for r in res.results}
    assert {"NamedSharding", "PmapSharding", "SingleDeviceSharding"} <= fams
    assert any(r.suite == "mpmd" for r in res.results)


@pytest.mark.slow
def test_processes_give_the_same_results(tmp_path):
    one = runner.run(suite="layouts", examples=1, progress=False)
    two = runner.run(suite="layouts", examples=1, progress=False, processes=2)
    assert sorted((r.case_id, r.status) for r in one.results) == sorted((r.case_id, r.status) for r in two.results)


# -- an xfails entry never masks a refsim-side failure ---------------------------------------------
def _listed_ppermute():
    src = "def f(a):\n    return jax.lax.ppermute(a, ('y', 'x'), perm=[(0, 1), (1, 2), (2, 3), (3, 0)])\n"
    return CollectiveCall(family="ppermute", source=src, entry="shard_map", mesh=Mesh((2, 2), ("x", "y")),
                          args=(np.arange(8.0, dtype=np.float32),), in_specs=(P(("x", "y")),),
                          out_specs=P(("x", "y")), labels=(("axes", "('y','x')"), ("perm", "cycles")),
                          name="ppermute", params={"axis_name": ("y", "x"),
                                                   "perm": [(0, 1), (1, 2), (2, 3), (3, 0)]})


def test_a_refsim_exception_in_a_listed_case_fails_the_run_as_an_error(monkeypatch):
    from refsim.interpreter import registry

    call = _listed_ppermute()
    task = base.group_tasks("collectives", [call], seed=0)[0]
    entry = xfails.load(None, platform="cpu").lookup(task.case_id)
    assert entry is not None and not entry.crash          # the shipped file lists this case

    def planted(*a, **k):
        raise RuntimeError("planted refsim bug in ppermute")

    registry.load_rules()
    monkeypatch.setitem(registry.RULES, "ppermute", planted)
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: [[task]])
    res = runner.run(suite="collectives", progress=False, shrink_seconds=0)
    (r,) = res.results
    assert r.status == "error" and not res.ok, r.message
    assert "refsim raised RuntimeError on a valid case: planted refsim bug in ppermute" in r.message
    assert "the failure is on the refsim side" in r.message


def test_xla_cpu_pmax_ignoring_nan_is_found_without_an_entry_and_expected_with_its_signature():
    # jax.lax.pmax documents NaN propagation (StableHLO maximum); XLA:CPU's all-reduce skips NaN
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    x[0, 0] = np.nan
    call = CollectiveCall(family="pmax", source="def f(a):\n    return jax.lax.pmax(a, 'x')\n", entry="shard_map",
                          mesh=Mesh((8,), ("x",)), args=(x,), in_specs=(P("x"),), out_specs=P(),
                          labels=(("axes", "'x'"),), outputs=("exact",), name="pmax",
                          params={"axis_name": "x"})
    task = base.group_tasks("collectives", [call], seed=0, variants=1)[0]
    found = runner.run_task(task, None, None, shrink_seconds=0)
    assert found.status == "fail" and found.details["failure"]["classes"] == ["nan-dropped"], found.message
    assert "refsim nan, xla 7.0" in found.message
    entry = xfails.load(None, platform="cpu").lookup(task.case_id)
    assert entry.signature == "model(xla-cpu-max-min)"
    listed = runner.run_task(task, None, entry, shrink_seconds=0)
    assert listed.status == "xfail" and listed.message.startswith("expected failure model(xla-cpu-max-min)")


def test_xla_cpu_pargmax_with_nan_is_found_without_an_entry_and_explained_by_the_max_min_model():
    # JAX's pargmax is pmax, ==, select and pmin of the index: with pmax NaN no index matches, so
    # the documented composition gives 2**31-1; XLA:CPU's pmax ignores NaN and finds index 7 (of 7.0).
    from conformance.verdict import platform_models
    from conformance.cases import Program

    x = np.arange(8, dtype=np.float32)
    x[0] = np.nan
    prog = Program(family="pargmax_pargmin", source="def f(a):\n    return jax._src.lax.parallel.pargmax(a, 'x')\n",
                   entry="shard_map", mesh=Mesh((8,), ("x",)), args=(x,), in_specs=(P("x"),), out_specs=P("x"),
                   labels=(("op", "pargmax"), ("axis", "x")))
    task = base.group_tasks("programs", [prog], seed=0, variants=1)[0]
    found = runner.run_task(task, None, None, shrink_seconds=0)
    assert found.status == "fail" and found.details["failure"]["classes"] == ["value"], found.message
    assert "refsim 2147483647, xla 7" in found.message
    entry = xfails.load(None, platform="cpu").lookup(task.case_id)
    assert entry.signature == "model(xla-cpu-max-min)"
    listed = runner.run_task(task, None, entry, shrink_seconds=0)
    assert listed.status == "xfail" and listed.message.startswith("expected failure model(xla-cpu-max-min)")
    # the model predicts index 7 exactly: another wrong index (what a NaN-dropping pmin would give) is not it
    assert platform_models.check("xla-cpu-max-min", prog, prog.run(xla_backend)) is True
    lowest = dataclasses.replace(prog, source=prog.source.replace("pargmax", "pargmin"))
    assert platform_models.check("xla-cpu-max-min", prog, lowest.run(xla_backend)) is False  # index 1


def test_strict_xfails_fails_the_run_on_stale_and_too_broad_entries(tmp_path, monkeypatch):
    task = base.group_tasks("collectives", [_psum_call()], seed=0, variants=1)[0]
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: [[task]])
    xf = tmp_path / "xf.txt"
    xf.write_text("psum[* mismatch(any): listed although it agrees\n")
    lax_run = runner.run(suite="collectives", progress=False, xfails=str(xf))
    assert lax_run.ok and [r.status for r in lax_run.results] == ["xpass"]
    assert lax_run.summary["too_broad_xfails"][0].startswith("psum[* (")
    strict = runner.run(suite="collectives", progress=False, xfails=str(xf), strict_xfails=True)
    assert not strict.ok
    assert strict.summary["strict_xfail_problems"] == [task.case_id] + strict.summary["too_broad_xfails"]
    (row,) = strict.summary["xfail_entries"]
    assert (row["signature"], row["cases"], row["xpass"]) == ("mismatch(any)", 1, 1)


@pytest.mark.parametrize("name, data, xla_zero", [("pmax", [-0.0, 0.0], "-0.0"), ("pmin", [0.0, -0.0], "0.0")])
def test_xla_cpu_max_min_keeping_the_first_zero_is_found_and_expected_with_its_signature(name, data, xla_zero):
    # StableHLO maximum / minimum are IEEE 754-2019's: +0 > -0 in either order, so pmax over [-0, +0] is +0
    # and pmin over [+0, -0] is -0 (refsim); XLA:CPU's all-reduce keeps the first of equal values
    from conformance.verdict import platform_models

    x = np.array(data, np.float32).reshape(2, 1)
    call = CollectiveCall(family=name, source=f"def f(a):\n    return jax.lax.{name}(a, 'x')\n", entry="shard_map",
                          mesh=Mesh((2,), ("x",)), args=(x,), in_specs=(P("x"),), out_specs=P(),
                          labels=(("axes", "'x'"),), outputs=("exact",), name=name, params={"axis_name": "x"})
    task = base.group_tasks("collectives", [call], seed=0, variants=1)[0]
    found = runner.run_task(task, None, None, shrink_seconds=0)
    assert found.status == "fail" and found.details["failure"]["classes"] == ["signed-zero"], found.message
    ieee = "0.0" if name == "pmax" else "-0.0"
    assert f"refsim {ieee}, xla {xla_zero}" in found.message
    entry = xfails.load(None, platform="cpu").lookup(task.case_id)
    assert entry.signature == "model(xla-cpu-max-min)"
    listed = runner.run_task(task, None, entry, shrink_seconds=0)
    assert listed.status == "xfail" and listed.message.startswith("expected failure model(xla-cpu-max-min)")
    # the model predicts the first zero exactly, sign included: refsim's IEEE zero is not it
    assert platform_models.check("xla-cpu-max-min", call, call.run(xla_backend)) is True
    assert platform_models.check("xla-cpu-max-min", call, call.run(refsim)) is False


def test_xla_cpu_folding_a_plus_zero_keeps_subnormals_and_the_arith_model_expects_it():
    # a + axis_index over a size-1 axis is a + 0, which XLA:CPU folds to a: nothing is flushed, so a
    # float32 subnormal comes back as it went in (IEEE and refsim: 1e-40 + 0 == 1e-40 too) while the
    # flushed-arithmetic half of the model predicts 0; -0.0 comes back -0.0 (IEEE: +0.0).
    from conformance.verdict import platform_models

    x = np.array([1e-40, -0.0, -1e-40], np.float32)
    call = CollectiveCall(family="axis_index", entry="shard_map",
                          source="def f(a):\n    return a + jax.lax.axis_index(('y',)).astype(a.dtype)\n",
                          mesh=Mesh((3, 1), ("x", "y")), args=(x,), in_specs=(P(("x", "y")),), out_specs=P(("x", "y")),
                          labels=(("axes", "('y',)"),), outputs=("exact",), name="axis_index",
                          params={"axis_name": ("y",)})
    xla = call.run(xla_backend)
    got = np.concatenate([np.asarray(s.data) for s in sorted(xla.shards, key=lambda s: s.index[0].start)])
    assert got.view(np.uint32).tolist() == x.view(np.uint32).tolist()  # folded: the input's bits
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    wrong = dataclasses.replace(call, source=call.source.replace("a + ", "2 * a + 1 + "))
    assert platform_models.check("xla-cpu-arith", call, wrong.run(xla_backend)) is False


def test_xla_cpu_psum_of_negative_zeros_is_found_by_its_sign_and_expected_by_the_arith_model():
    # StableHLO all_reduce: the operands are the schedule's only leaves, so psum over [-0.0, -0.0]
    # is -0.0 (IEEE 754: -0 + -0 = -0; refsim); XLA:CPU in one process starts from +0 and gives +0.0
    x = np.array([-0.0, -0.0], np.float32).reshape(2, 1)
    call = CollectiveCall(family="psum", source="def f(a):\n    return jax.lax.psum(a, 'x')\n", entry="shard_map",
                          mesh=Mesh((2,), ("x",)), args=(x,), in_specs=(P("x"),), out_specs=P(),
                          labels=(("axes", "'x'"),), outputs=("sum",), name="psum", params={"axis_name": "x"})
    assert np.signbit(np.asarray(call.run(refsim))).all()          # refsim: -0.0
    task = base.group_tasks("collectives", [call], seed=0, variants=1)[0]
    found = runner.run_task(task, None, None, shrink_seconds=0)
    assert found.status == "fail" and found.details["failure"]["classes"] == ["signed-zero"], found.message
    entry = xfails.load(None, platform="cpu").lookup(task.case_id)
    assert entry.signature == "model(xla-cpu-arith)"
    listed = runner.run_task(task, None, entry, shrink_seconds=0)
    assert listed.status == "xfail", listed.message


def test_a_failure_the_second_of_two_matching_entries_expects_is_an_xfail_named_by_it():
    listed = xfails.XfailList(xfails.parse("psum[* model(xla-cpu-arith): arithmetic\n"
                                           "psum[* mismatch(nan-dropped): drops NaN"), jax_version="0.12.0")
    entry = listed.lookup("psum[axes='x']")
    got, message = runner._apply_xfail(base.Outcome("fail", "msg", details={"failure": _VALUES}), entry)
    assert got == "xfail"
    assert "mismatch(nan-dropped)" in message and "drops NaN" in message and "arithmetic" not in message
    other = dict(_VALUES, classes=["value"])
    got, message = runner._apply_xfail(base.Outcome("fail", "msg", details={"failure": other}), entry)
    assert got == "error"
    assert "model(xla-cpu-arith): model 'xla-cpu-arith' does not apply to this case" in message
    assert "mismatch(nan-dropped): values differ by class value, not only nan-dropped" in message


class _OtherError:
    """xla_backend, except that every shard_map raises its own AssertionError."""

    def shard_map(self, f, **kw):
        raise AssertionError("the XLA side's own")


def _traced_assert_task():
    from conformance.cases import Program

    prog = Program(family="planted", source="def f(a):\n    assert a.ndim == 0, 'planted: JAX traced it'\n    return a\n",
                   entry="shard_map", mesh=Mesh((2,), ("x",)), args=(np.arange(4, dtype=np.float32),),
                   in_specs=(P("x"),), out_specs=P("x"), labels=(("op", "planted"),))
    return base.group_tasks("programs", [prog], seed=0, variants=1)[0]


def test_an_error_jax_raises_on_both_sides_is_the_xla_sides_and_can_be_listed():
    task = _traced_assert_task()
    got = runner.run_task(task, None, None, shrink_seconds=0)
    assert got.status == "error" and got.message.startswith(
        "JAX raised AssertionError on both sides (refsim traces the program with JAX too) on a valid case: planted")
    assert got.details["failure"]["side"] == "xla" and got.details["failure"]["kind"] == "raises"
    (entry,) = xfails.parse("planted[* raises(AssertionError, /planted: JAX traced it/): a JAX bug")
    listed = runner.run_task(task, None, entry, shrink_seconds=0)
    assert listed.status == "xfail", listed.message
    # the XLA side raising something else: refsim's failure is its own, and never expected
    own = runner.run_task(task, _OtherError(), entry, shrink_seconds=0)
    assert own.status == "error" and own.message.startswith("refsim raised AssertionError on a valid case: planted")
