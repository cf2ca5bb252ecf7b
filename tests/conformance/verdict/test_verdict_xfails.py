"""conformance.verdict.xfails on hand-written entries: which case ids a pattern matches, which JAX
versions an entry applies to, what each signature accepts, and the audit of a run.

Every expected value is written out by hand from the file format in the module's docstring.
(The status each signature gives a case is tested with the runner, tests/conformance/engine/test_runner.py.)
"""
import pathlib

import pytest

from conformance.report.results import CaseResult
from conformance.verdict import xfails

FILE = """\
# a comment, then a blank line

psum[axes='x',*,dtype=float32,*] mismatch(signed-zero): glob with two stars
p[ab](c).d crash: every character but * is literal
re:^(pmax|pmin)\\[axes=\\('y' jax<0.11 sometimes model(xla-cpu-max-min): regex from the start
all_gather[* jax>=0.12 raises(JaxRuntimeError, /replica groups/): newer JAX only
pbroadcast[* unsupported: no lowering
psum[* mismatch(any): catch-all after the specific psum entry
"""


@pytest.fixture
def entries():
    return xfails.parse(FILE, source="hand.txt")


def test_parse_reads_each_signature(entries):
    got = [(e.line, e.pattern, e.kind, e.signature, e.sometimes, e.version, e.reason) for e in entries]
    assert got == [
        (3, "psum[axes='x',*,dtype=float32,*]", "mismatch", "mismatch(signed-zero)", False, None,
         "glob with two stars"),
        (4, "p[ab](c).d", "crash", "crash", False, None, "every character but * is literal"),
        (5, "re:^(pmax|pmin)\\[axes=\\('y'", "model", "model(xla-cpu-max-min)", True, ("<", (0, 11)),
         "regex from the start"),
        (6, "all_gather[*", "raises", "raises(JaxRuntimeError, /replica groups/)", False, (">=", (0, 12)),
         "newer JAX only"),
        (7, "pbroadcast[*", "unsupported", "unsupported", False, None, "no lowering"),
        (8, "psum[*", "mismatch", "mismatch(any)", False, None, "catch-all after the specific psum entry"),
    ]
    assert entries[2].model == "xla-cpu-max-min"
    assert (entries[3].exception, entries[3].message) == ("JaxRuntimeError", "replica groups")
    assert entries[1].crash and entries[4].unsupported and not entries[0].crash


@pytest.mark.parametrize("line,case_id,want", [
    (3, "psum[axes='x',groups=none,dtype=float32,mesh=2:default]", True),
    (3, "psum[axes='x',dtype=float32,mesh=2:default]", False),      # each star stands between two commas
    (3, "psum[axes='x',groups=none,dtype=int32,mesh=2:default]", False),
    (3, "xpsum[axes='x',groups=none,dtype=float32,mesh=2:default]", False),   # anchored at the start
    (4, "p[ab](c).d", True),
    (4, "pa(c).d", False),        # [ab] is not a character class
    (4, "p[ab](c)xd", False),     # . is not any character
    (4, "p[ab](c).d,more", False),   # anchored at the end
    (5, "pmax[axes=('y','x'),dtype=float32]", True),
    (5, "pmin[axes=('y',),dtype=int32]", True),   # a regex needs to match only a prefix
    (5, "pmean[axes=('y','x')]", False),
    (5, "xpmax[axes=('y','x')]", False),
])
def test_patterns(entries, line, case_id, want):
    (entry,) = [e for e in entries if e.line == line]
    assert entry.matches(case_id) is want


@pytest.mark.parametrize("token,version,want", [
    ("jax<0.11", "0.10.2", True), ("jax<0.11", "0.11.0", False), ("jax<=0.11", "0.11", True),
    ("jax>=0.12", "0.12.0.1", True), ("jax>=0.12", "0.11.9", False), ("jax>0.10", "0.10.2", True),
    ("jax==0.12", "0.12.3", True),    # == compares the parts written: 0.12 is every 0.12.x
    ("jax==0.12.1", "0.12.3", False),
])
def test_version_tokens(token, version, want):
    (entry,) = xfails.parse(f"psum[* {token} unsupported: r")
    assert entry.applies_to(version) is want


def test_lookup_takes_the_first_entry_of_the_installed_jax_and_remembers_it(entries):
    old = xfails.XfailList(entries, jax_version="0.10.2", source="hand.txt")
    new = xfails.XfailList(entries, jax_version="0.12.0", source="hand.txt")
    assert [e.line for e in old.entries] == [3, 4, 5, 7, 8]      # line 6 is jax>=0.12 only
    assert [e.line for e in new.entries] == [3, 4, 6, 7, 8]      # line 5 is jax<0.11 only
    specific = "psum[axes='x',groups=none,dtype=float32,mesh=2:default]"
    assert new.lookup(specific).line == 3                       # the file's order decides
    assert new.lookup("psum[axes='y',dtype=int32]").line == 8
    assert new.lookup("all_gather[axes='x']").line == 6 and old.lookup("all_gather[axes='x']") is None
    assert new.lookup("ppermute[axes='x']") is None
    assert [e.line for e in new.unused()] == [4, 7]
    assert new.where(new.entries[0]) == "hand.txt:3" and len(new) == 5


# -- what a signature accepts --------------------------------------------------------------------
VALUES = {"kind": "mismatch", "side": "xla", "classes": ["signed-zero"], "layout": [], "models": {}}
RAISED = xfails.exception_failure("xla", type("JaxRuntimeError", (RuntimeError,), {})("INTERNAL: replica groups x"))


@pytest.mark.parametrize("sig,failure,ok,why", [
    ("mismatch(signed-zero)", VALUES, True, ""),
    ("mismatch(signed-zero, 1-ulp)", VALUES, True, ""),
    ("mismatch(1-ulp)", VALUES, False, "values differ by class signed-zero, not only 1-ulp"),
    ("mismatch(signed-zero)", dict(VALUES, classes=["signed-zero", "value"]), False,
     "values differ by class value, not only signed-zero"),
    ("mismatch(any)", dict(VALUES, classes=["value", "inf"]), True, ""),
    ("mismatch(any)", dict(VALUES, layout=["index", "shape"]), False, "the layout differs (index, shape), not only values"),
    ("mismatch(any)", dict(VALUES, side="refsim"), False,
     "the failure is on the refsim side (only XLA-side failures can be expected)"),
    ("model(xla-cpu-arith)", dict(VALUES, models={"xla-cpu-arith": True}), True, ""),
    ("model(xla-cpu-arith)", dict(VALUES, models={"xla-cpu-arith": False}), False,
     "XLA's values differ from model 'xla-cpu-arith' too"),
    ("model(xla-cpu-arith)", VALUES, False, "model 'xla-cpu-arith' does not apply to this case"),
    ("raises(JaxRuntimeError, /replica groups/)", RAISED, True, ""),
    ("raises(RuntimeError, /replica/)", RAISED, True, ""),              # a base class of the raised one
    ("raises(ValueError)", RAISED, False, "XLA raised JaxRuntimeError, not ValueError"),
    ("raises(RuntimeError, /^replica/)", RAISED, False,
     "XLA's message does not match /^replica/: INTERNAL: replica groups x"),
    ("mismatch(any)", RAISED, False, "XLA raised JaxRuntimeError: INTERNAL: replica groups x"),
    ("unsupported", xfails.exception_failure("xla", NotImplementedError("no thunk"), unsupported=True), True, ""),
    ("raises(NotImplementedError)", xfails.exception_failure("xla", NotImplementedError("x"), unsupported=True),
     False, "the platform cannot run it (unsupported)"),
    ("unsupported", {"kind": "accepted", "side": "xla"}, False,
     "XLA accepted a program that refsim (following JAX's rules) rejects"),
    ("raises(ValueError)", xfails.exception_failure("refsim", ValueError("bad")), False,
     "the failure is on the refsim side (only XLA-side failures can be expected)"),
    ("unsupported", None, False, "the check reported no failure signature to match"),
    # each signature accepts the XLA side's failure only: not refsim's, not a check's whose side is
    # unknown, not a record that names no side; and a value difference only with classified elements
    ("raises(ValueError, /bad/)", xfails.exception_failure("unknown", ValueError("bad")), False,
     "the failure is on the unknown side (only XLA-side failures can be expected)"),
    ("raises(ValueError, /bad/)", {"kind": "raises", "exception": "ValueError", "message": "bad"}, False,
     "the failure is on the unknown side (only XLA-side failures can be expected)"),
    ("unsupported", xfails.exception_failure("refsim", NotImplementedError("x"), unsupported=True), False,
     "the failure is on the refsim side (only XLA-side failures can be expected)"),
    ("model(xla-cpu-arith)", dict(VALUES, side="refsim", models={"xla-cpu-arith": True}), False,
     "the failure is on the refsim side (only XLA-side failures can be expected)"),
    ("mismatch(signed-zero)", dict(VALUES, classes=[]), False,
     "the values differ, but no differing element has a class an entry can name"),
    ("mismatch(any)", dict(VALUES, classes=[]), False,
     "the values differ, but no differing element has a class an entry can name"),
])
def test_expects(sig, failure, ok, why):
    (entry,) = xfails.parse(f"case {sig}: reason")
    assert entry.expects(failure) == (ok, why)


def test_failure_signatures():
    class Boom(KeyError):
        pass

    assert xfails.exception_failure("xla", Boom("k")) == {
        "kind": "raises", "side": "xla", "exception": "Boom", "message": "'k'",
        "exception_mro": ["Boom", "KeyError", "LookupError", "Exception", "BaseException", "object"]}
    assert xfails.exception_failure("unknown", RuntimeError("x"), unsupported=True) == {
        "kind": "unsupported", "side": "unknown", "message": "x"}

    class M:  # what comparison_failure reads of a mismatch: its side and kind
        def __init__(self, side, kind):
            self.side, self.kind = side, kind

    class Result:
        def __init__(self, mismatches, classes):
            self.mismatches, self.classes = mismatches, classes

    got = xfails.comparison_failure(Result([M("xla", "values"), M("xla", "shape"), M("xla", "bound")], ("1-ulp",)),
                                    models={"xla-cpu-arith": False})
    assert got == {"kind": "mismatch", "side": "xla", "classes": ["1-ulp"], "layout": ["shape"],
                   "models": {"xla-cpu-arith": False}}
    assert xfails.comparison_failure(Result([M("xla", "values"), M("refsim", "bound")], ()))["side"] == "refsim"


@pytest.mark.parametrize("line,broad", [
    ("a mismatch(any): r", "mismatch(any) accepts every value difference; name the classes that occur"),
    ("a raises(ValueError): r", "raises(ValueError) accepts any message; add a /message regex/"),
    ("a mismatch(value, inf): r", ""), ("a raises(ValueError, /x/): r", ""), ("a model(xla-cpu-arith): r", ""),
    ("a unsupported: r", ""), ("a crash: r", ""),
])
def test_too_broad(line, broad):
    assert xfails.parse(line)[0].too_broad() == broad


def test_audit_counts_each_entry_and_names_the_stale_and_the_too_broad(entries):
    xl = xfails.XfailList(entries, jax_version="0.12.0", source="hand.txt")

    def result(case_id, status):
        return CaseResult(case_id=case_id, suite="s", family="f", dtype="float32", status=status)

    results = [result("psum[axes='x',groups=none,dtype=float32,mesh=2:default]", "xfail"),
               result("psum[axes='x',groups=none,dtype=float32,mesh=4:default]", "xpass"),
               result("psum[axes='y',dtype=int32]", "pass"),
               result("p[ab](c).d", "pass"),
               result("pbroadcast[axes='x']", "unsupported"),
               result("all_gather[axes='x']", "error")]
    audit = xfails.audit(xl, results)
    rows = {r["entry"]: r for r in audit["entries"]}
    line3 = rows["psum[axes='x',*,dtype=float32,*] (hand.txt:3)"]
    assert (line3["cases"], line3["xfail"], line3["xpass"], line3["pass"]) == (2, 1, 1, 0)
    # every entry counts every case it matches, not only the cases lookup() gave it
    assert rows["psum[* (hand.txt:8)"]["cases"] == 3
    assert rows["all_gather[* (hand.txt:6)"]["error"] == 1
    # stale: matched cases, none expected (xfail / unsupported), none failing
    assert audit["stale"] == ["p[ab](c).d (hand.txt:4)"]
    assert audit["too_broad"] == ["psum[* (hand.txt:8): mismatch(any) accepts every value difference; "
                                  "name the classes that occur"]


def test_load(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("pbroadcast[* unsupported: r\n", encoding="utf-8")
    xl = xfails.load(str(path), jax_version="0.12.0")
    assert [e.pattern for e in xl.entries] == ["pbroadcast[*"] and xl.source == str(path)
    root = pathlib.Path(__file__).resolve().parents[3]      # the repository: tests/conformance/verdict/
    assert pathlib.Path(xfails.default_path("cpu")).resolve() == root / "xfails" / "cpu.txt"
    assert len(xfails.load(None, platform="no-such-platform", jax_version="0.12.0")) == 0   # no file: nothing expected
    with pytest.raises(ValueError, match=r"xfails file '.*absent.txt' does not exist; pass a file"):
        xfails.load(str(tmp_path / "absent.txt"))


# -- a case several entries match -------------------------------------------------------------------
SEVERAL = """\
re:^axis_index_ppermute\\[ sometimes model(xla-cpu-arith): XLA:CPU's arithmetic
re:^axis_index_ppermute\\[axes=\\('y','x' jax<0.11 sometimes model(jax-0.10-ppermute-mesh-order): device numbering
axis_index_ppermute[*dtype=int8* sometimes mismatch(value): a third reason
"""


def test_a_failure_any_matching_entry_expects_is_expected():
    xl = xfails.XfailList(xfails.parse(SEVERAL, source="hand.txt"), jax_version="0.10.2", source="hand.txt")
    case = "axis_index_ppermute[axes=('y','x','z'),perm=cycles,dtype=int32,mesh=2x2x2:default]"
    entry = xl.lookup(case)
    assert isinstance(entry, xfails.Entries) and [e.line for e in entry.entries] == [1, 2]
    assert xl.unused() == [xl.entries[2]]
    assert entry.models == ("xla-cpu-arith", "jax-0.10-ppermute-mesh-order")
    second = dict(VALUES, classes=["value"], models={"xla-cpu-arith": False, "jax-0.10-ppermute-mesh-order": True})
    assert entry.expects(second) == (True, "")
    assert entry.expecting(second).line == 2
    neither = dict(second, models={"xla-cpu-arith": False, "jax-0.10-ppermute-mesh-order": False})
    ok, why = entry.expects(neither)
    assert not ok and why == ("model(xla-cpu-arith): XLA's values differ from model 'xla-cpu-arith' too; "
                              "model(jax-0.10-ppermute-mesh-order): XLA's values differ from model "
                              "'jax-0.10-ppermute-mesh-order' too")
    assert entry.expecting(neither).line == 1
    # on jax 0.12 only the first line applies: the single entry itself
    new = xfails.XfailList(xfails.parse(SEVERAL, source="hand.txt"), jax_version="0.12.0", source="hand.txt")
    assert isinstance(new.lookup(case), xfails.Entry)


def test_several_entries_crash_if_any_does_and_agree_sometimes_only_if_all_do():
    import pickle

    es = xfails.parse("psum[* sometimes mismatch(signed-zero): a\npsum[*int8* crash: b\npsum[* mismatch(value): c")
    both = xfails.Entries(es[:2])
    assert both.crash and both.reason == "b" and both.line == 2
    assert xfails.Entries([es[0], es[2]]).sometimes is False and xfails.Entries([es[0], es[0]]).sometimes
    assert xfails.Entries([es[0], es[2]]).signature == "mismatch(value)"   # what an agreeing case passed
    again = pickle.loads(pickle.dumps(both))                                  # sent to a worker
    assert [e.line for e in again.entries] == [1, 2] and again.crash


ABORT = -6   # multiprocessing's exitcode of a process killed by SIGABRT
FATAL = "F1126 19:46:39.59 9667 hlo_sharding_util.cc:3007] Check failed: sliced.has_value() Could not slice"
OTHER_FATAL = "F1126 spmd_partitioner.cc:1115] Check failed: get_first_valid_element_offset_on_dilated_shard(0)"
ACCEPTS = ("; the xfails entry at cpu.txt:2 aborts(/Check failed: sliced.has_value/) accepts only a worker killed "
           "by SIGABRT while XLA compiles or runs the case, with a fatal line /Check failed: sliced.has_value/ matches")


def _aborts_entry():
    (entry,) = xfails.parse("# a comment\nsharded[* jax>=0.11 sometimes aborts(/Check failed: sliced.has_value/): "
                            "0.12 reshards", source="cpu.txt")
    return entry


def test_an_aborts_entry_expects_a_sigabrt_in_xlas_step_with_its_fatal_line():
    entry = _aborts_entry()
    assert (entry.kind, entry.signature, entry.sometimes, entry.aborts, entry.crash, entry.where) == (
        "aborts", "aborts(/Check failed: sliced.has_value/)", True, True, False, "cpu.txt:2")
    died = xfails.abort_failure(FATAL, "...\n" + FATAL, exitcode=ABORT, step=xfails.XLA_STEP)
    assert (died["signal"], died["how"], died["side"]) == ("SIGABRT", "killed by SIGABRT", "xla")
    assert entry.expects(died) == (True, "")


@pytest.mark.parametrize("fatal, tail, exitcode, step, why", [
    # another signal, or an exit, after the matching line
    (FATAL, FATAL, -9, "xla", "the worker was killed by SIGKILL, not by SIGABRT"),
    (FATAL, FATAL, -11, "xla", "the worker was killed by SIGSEGV, not by SIGABRT"),
    (FATAL, FATAL, 0, "xla", "the worker exited with code 0, it was not killed by SIGABRT"),
    (FATAL, FATAL, 3, "xla", "the worker exited with code 3, it was not killed by SIGABRT"),
    (FATAL, FATAL, None, "xla", "the worker's exit status is unknown, not a death by SIGABRT"),
    # a SIGABRT outside XLA's step
    (FATAL, FATAL, ABORT, "refsim", "the worker was killed by SIGABRT in refsim's step (refsim evaluating the "
     "case), which is never an XLA abort, not while XLA compiled or ran the case"),
    (FATAL, FATAL, ABORT, "xla-after-refsim", "the worker was killed by SIGABRT on the XLA side after refsim had "
     "raised (refsim's failure came first, and a refsim failure is never expected), not while XLA compiled or ran "
     "the case"),
    (FATAL, FATAL, ABORT, "check", "the worker was killed by SIGABRT in a check that runs refsim and XLA together "
     "(which side aborted cannot be told), not while XLA compiled or ran the case"),
    (FATAL, FATAL, ABORT, "compare", "the worker was killed by SIGABRT while the results were compared (this "
     "project's code, not XLA), not while XLA compiled or ran the case"),
    (FATAL, FATAL, ABORT, None, "the worker was killed by SIGABRT before its task marked a step, not while XLA "
     "compiled or ran the case"),
    # XLA's step, but not its fatal line: none (the tail is never searched), or another one
    ("", FATAL, ABORT, "xla", "the worker was killed by SIGABRT while XLA ran the case, but XLA wrote no fatal line"),
    (OTHER_FATAL, FATAL + "\n" + OTHER_FATAL, ABORT, "xla",
     f"XLA's fatal line does not match /Check failed: sliced.has_value/: {OTHER_FATAL}"),
])
def test_an_aborts_entry_accepts_no_other_death(fatal, tail, exitcode, step, why):
    failure = xfails.abort_failure(fatal, tail, exitcode=exitcode, step=step)
    assert _aborts_entry().expects(failure) == (False, why + ACCEPTS)


def test_only_aborts_and_crash_entries_accept_a_death_and_an_aborts_entry_nothing_else():
    xlas_abort = xfails.abort_failure(FATAL, FATAL, exitcode=ABORT, step="xla")
    (raises,) = xfails.parse("a raises(ValueError, /x/): r")
    assert raises.expects(xlas_abort) == (False, f"the process running it died (killed by SIGABRT: {FATAL})")
    (crash,) = xfails.parse("a crash: r", source="cpu.txt")
    assert crash.expects(xlas_abort) == (True, "")   # crash: any fatal line of a SIGABRT in XLA's step
    assert crash.expects(xfails.abort_failure(FATAL, FATAL, exitcode=-9, step="xla")) == (
        False, "the worker was killed by SIGKILL, not by SIGABRT; the xfails entry at cpu.txt:1 crash accepts "
        "only a worker killed by SIGABRT while XLA compiles or runs the case, with its fatal line")
    assert not crash.expects(xfails.abort_failure("", "", exitcode=ABORT, step="xla"))[0]
    assert not crash.expects(xfails.abort_failure(FATAL, FATAL, exitcode=ABORT, step="refsim"))[0]
    entry = _aborts_entry()
    assert not entry.expects({"kind": "raises", "side": "xla", "exception": "ValueError", "message": "x"})[0]
    assert not entry.expects(VALUES)[0]
    assert xfails.parse("a aborts(): r")[0].too_broad().startswith("aborts() accepts any abort")
    assert xfails.parse("a aborts(/x/): r")[0].too_broad() == ""
    with pytest.raises(ValueError, match=r"fatal line pattern /\(/ is not a valid regular expression"):
        xfails.parse("a aborts(/(/): r")
    two = xfails.XfailList(xfails.parse("a* aborts(/x/): r\na* mismatch(value): v"), jax_version="0.12").lookup("ab")
    assert two.aborts and not two.crash
