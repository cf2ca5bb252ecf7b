"""The pytest plugin (`--conformance-platform`), loaded from its pytest11 entry point in a child pytest."""
from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_without_the_option_nothing_is_collected(pytester):
    pytester.makepyfile(test_one="def test_ok():\n    assert True\n")
    res = pytester.runpytest_subprocess("-q")
    res.assert_outcomes(passed=1)


def test_options_are_listed_in_help(pytester):
    res = pytester.runpytest_subprocess("--help")
    res.stdout.fnmatch_lines(["*--conformance-platform=P*", "*--conformance-devices=N*", "*--conformance-examples=N*"])


def test_cases_become_items_with_statuses(pytester):
    res = pytester.runpytest_subprocess(
        "-q", "--conformance-platform", "cpu", "--conformance-devices", "8",
        "--conformance-examples", "1", "--conformance-suite", "errors,layouts", "-m", "conformance", "-rA")
    res.assert_outcomes(passed=len([ln for ln in res.outlines if ln.startswith("PASSED conformance/")]))
    res.stdout.fnmatch_lines(["PASSED conformance/errors::perm_repeated_source*",
                              "PASSED conformance/layouts::named_sharding*"])
    assert res.ret == 0


def test_failures_unsupported_and_xfails(pytester, tmp_path):
    xf = tmp_path / "xf.txt"
    xf.write_text("pbroadcast[* unsupported: no XLA:CPU lowering\n"
                  "corpus:psum_x[* mismatch(value): known difference for this test\n")
    res = pytester.runpytest_subprocess(
        "-q", "--conformance-platform", "cpu", "--conformance-examples", "1",
        "--conformance-suite", "collectives", "--conformance-xfails", str(xf), "-m", "conformance", "-rs",
        "-k", "pbroadcast")
    res.stdout.fnmatch_lines(["*unsupported on this platform: unsupported: no XLA:CPU lowering*"])
    outcomes = res.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 1 and "failed" not in outcomes
    # without an entry the same cases fail, with the message naming the fix
    res = pytester.runpytest_subprocess(
        "-q", "--conformance-platform", "cpu", "--conformance-examples", "1",
        "--conformance-suite", "collectives", "--conformance-xfails", str(tmp_path / "empty.txt"), "-m",
        "conformance", "-k", "pbroadcast") if (tmp_path / "empty.txt").write_text("") == 0 else None
    assert res.ret == 1
    res.stdout.fnmatch_lines(["*ERROR: pbroadcast*", "*unsupported: REASON*"])
