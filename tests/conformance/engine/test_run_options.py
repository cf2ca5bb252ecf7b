"""`RunOptions`: every option of a run in one frozen dataclass, built by `run(**kw)` and the CLI."""
import dataclasses

import pytest

from conformance import cli
from conformance.engine import runner

SMALL = dict(suite="collectives", examples=1, seed=3, devices=8, progress=False, shrink_seconds=0)


def test_run_and_run_options_are_the_same_run():
    a = runner.run(**SMALL)
    b = runner.run_options(runner.RunOptions(**SMALL))
    assert [(r.case_id, r.status, r.examples) for r in a.results] == \
        [(r.case_id, r.status, r.examples) for r in b.results]
    assert a.results


def test_options_are_frozen_and_every_run_keyword_is_a_field():
    import inspect

    opts = runner.RunOptions(**SMALL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1
    fields = {f.name for f in dataclasses.fields(runner.RunOptions)}
    assert set(inspect.signature(runner.run).parameters) == fields


@pytest.mark.parametrize("kw,match", [
    (dict(examples=0), r"examples=0"),
    (dict(seed=-1), r"seed=-1"),
    (dict(data_per_program=0), r"data_per_program=0"),
    (dict(resume=True), r"resume=True needs report_dir"),
    (dict(case_timeout=5.0), r"case_timeout needs processes"),
    (dict(started_workers=object()), r"started_workers needs processes"),
])
def test_bad_options_are_refused_before_anything_runs(kw, match):
    with pytest.raises(ValueError, match=match):
        runner.RunOptions(**kw).validate()


def test_the_command_line_builds_the_options():
    args = cli.build_parser().parse_args(["run", "--examples", "3", "--seed", "2", "--data-per-program", "5",
                                          "--compile-cache", "off", "--processes", "1"])
    opts = cli.run_options(args, devices=8)
    assert (opts.examples, opts.seed, opts.devices, opts.data_per_program, opts.processes) == (3, 2, 8, 5, 1)
    assert opts.compile_cache is None
    args = cli.build_parser().parse_args(["run", "--compile-cache", "/tmp/some-cache"])
    opts = cli.run_options(args, devices=8)
    assert opts.compile_cache == "/tmp/some-cache"


def test_the_summary_compile_share_is_a_share_of_the_work_as_the_phase_line():
    res = runner.run(**SMALL)
    ph = res.summary["phases"]
    assert res.summary["compile_share"] == pytest.approx(ph["xla_compile"] / sum(ph.values()))
    assert 0 <= res.summary["compile_share"] <= 1
