"""bench.reruns: the issue-29 measures run (tiny), and its targets are judged from the records.
No timed assertions: the figures depend on the machine."""
from __future__ import annotations

from bench import docs as bench_docs
from bench import reruns


def test_quick_run_records_a_cold_run_and_a_rerun():
    recs = reruns.run(quick=True)
    by = {r["variant"]: r for r in recs if r["bench"] == "conformance_reruns"}
    assert set(by) == {"cold", "rerun"}
    for r in by.values():
        assert r["examples"] > 0 and r["cpu_ms_per_example"] > 0 and 0 <= r["busy_share"] <= 1.5
    assert by["cold"]["examples"] == by["rerun"]["examples"]     # the same plan, drawn again
    assert reruns.targets(recs) == []                             # no baseline: nothing to judge


def _rec(variant, eps, cpu_ms, busy, epm, wall):
    each = [dict(examples_per_s=eps, cpu_ms_per_example=cpu_ms, busy_share=busy, examples_per_minute=epm,
                 process_s=wall, cpu_s=cpu_ms * 100 / 1000)]
    return dict(bench="conformance_reruns", variant=variant, commit="abc", processes=2, cases=10, examples=100,
                passes=1, each=each, examples_per_s=eps, cpu_ms_per_example=cpu_ms, busy_share=busy,
                examples_per_minute=epm, process_s=wall)


def test_targets_are_judged_from_hand_made_records():
    recs = [_rec("baseline cold", 10, 30, 0.8, 600, 60), _rec("cold", 12, 25, 0.96, 1900, 58),
            _rec("baseline rerun", 20, 14, 0.6, 1200, 30), _rec("rerun", 45, 6.5, 0.7, 2400, 15)]
    # the rerun: 0.65 CPU-s in all (6.5 ms x 100 examples), of which 0.05 s identity checks (7.7%)
    recs[3].update(identity_checks_s=0.05, identity_share=0.05 / 0.65, cpu_s=0.65)
    recs[2].update(cpu_s=1.4)
    recs.append(dict(bench="conformance_reruns_targets", rerun_cpu_ms_per_example=6.5,
                     baseline_rerun_cpu_ms_per_example=14, rerun_speedup=45 / 20, rerun_speedup_each=[2.25],
                     cold_busy_share=0.96, baseline_cold_busy_share=0.8, cold_data_per_minute_ratio=1900 / 600,
                     cold_data_per_minute_ratio_each=[1900 / 600], cold_wall_ratio=58 / 60))
    rows = reruns.targets(recs)
    assert [ok for _t, _m, ok in rows] == [True, True]
    assert rows[0][1] == "6.5 ms (baseline 14.0 ms)" and rows[1][1] == "7.7% (0.05 CPU-s)"
    recs[3].update(identity_share=0.2)
    assert [ok for _t, _m, ok in reruns.targets(recs)] == [True, False]
    table = bench_docs._reruns(recs)
    assert "| rerun | `abc` | 2 | 10 | 100 | 45.0 (45.0) | 6.5 | 1 | 70% | 2400 | 15 | 0.05 (20.0%) |" in table
    assert "| baseline rerun | `abc` | 2 | 10 | 100 | 20.0 (20.0) | 14.0 | 1 | 60% | 1200 | 30 | - |" in table


def test_cold_cpu_per_program_is_judged_against_the_baseline():
    # two plans of different sizes: the baseline checks 100 programs for 50 CPU-s (0.5 s each),
    # this checkout 120 programs for 54 CPU-s (0.45 s each): cheaper per program though dearer in all
    base = dict(examples=2000, cases=100, cpu_s=50.0, examples_per_s=40.0, cpu_ms_per_example=25.0,
                busy_share=0.9, examples_per_minute=2400.0, process_s=50.0, wall_s=48.0, cpu_s_per_program=0.5,
                processes=2)
    this = dict(base, examples=7000, cases=120, cpu_s=54.0, cpu_s_per_program=54.0 / 120)
    runs = {"baseline cold": [base], "cold": [this], "baseline rerun": [base], "rerun": [this]}
    recs = reruns.summarize(runs, {v: "abc" for v in runs}, examples=None, passes=1, suite="all")
    rows = reruns.targets(recs)
    assert rows[0] == ("cold run CPU per distinct program <= the baseline's (issue 40)",
                       "450 ms (baseline 500 ms; each pass 0.90x)", True)
    runs["cold"] = [dict(this, cpu_s=66.0, cpu_s_per_program=66.0 / 120)]   # 0.55 s per program
    rows = reruns.targets(reruns.summarize(runs, {v: "abc" for v in runs}, examples=None, passes=1, suite="all"))
    assert rows[0][2] is False and rows[0][1].startswith("550 ms (baseline 500 ms")


def test_examples_option_takes_default():
    assert reruns._examples_option("default") is None
    assert reruns._examples_option("7") == 7


def test_cold_runs_are_broken_down_by_suite_from_the_case_records():
    cases = [dict(suite="programs", examples=10, seconds=0.2, phases={"xla_compile": 0.05}),
             dict(suite="programs", examples=3, seconds=0.1, phases={"xla_compile": 0.03}),
             dict(suite="sharded", examples=9, seconds=0.5, phases={"xla_compile": 0.3}),
             dict(suite="layouts", examples=2, seconds=0.01, phases={})]
    got = reruns.by_suite(cases)
    assert got["programs"] == dict(programs=2, examples=13, seconds=0.30000000000000004, compile_s=0.08)
    assert got["sharded"] == dict(programs=1, examples=9, seconds=0.5, compile_s=0.3)
    assert got["layouts"]["compile_s"] == 0.0
    base = dict(examples=100, cases=10, cpu_s=5.0, examples_per_s=40.0, cpu_ms_per_example=50.0, busy_share=0.9,
                examples_per_minute=2400.0, process_s=5.0, wall_s=4.8, cpu_s_per_program=0.5, processes=2,
                by_suite={"programs": dict(programs=10, examples=100, seconds=4.0, compile_s=2.0)})
    this = dict(base, by_suite={"programs": dict(programs=10, examples=300, seconds=4.4, compile_s=2.0),
                                "sharded": dict(programs=2, examples=20, seconds=1.0, compile_s=0.6)})
    runs = {"baseline cold": [base], "cold": [this]}
    rows = reruns.suite_rows(reruns.summarize(runs, {v: "abc" for v in runs}, examples=None, passes=1, suite="all"))
    # the baseline has no sharded suite: a row of zeros says so
    assert rows == [("programs", "baseline cold", 10, 100, "4.0", "400", "200"),
                    ("programs", "cold", 10, 300, "4.4", "440", "200"),
                    ("sharded", "baseline cold", 0, 0, "-", "-", "-"),
                    ("sharded", "cold", 2, 20, "1.0", "500", "300")]
