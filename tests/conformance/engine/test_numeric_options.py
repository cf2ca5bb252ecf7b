"""Numeric options are finite and in range everywhere (issue 28, point 3): `conformance.validation`.

`--max-ulp nan` made bisect print MATCH and explain "all stages agree" on a known miscompile
(NaN compares false, so `max_ulp < 0` let it through and every difference then "agreed").
Every numeric option of every command line refuses NaN, infinity and out-of-range values with
argparse's exit status 2 naming the option, the value and the range; the Python entry points
raise ValueError the same way.
"""
import argparse
import math

import numpy as np
import pytest

from conformance import cli, validation
from conformance.engine import runner

BAD_FLOATS = ["nan", "inf", "-inf", "-1"]
BAD_INTS = ["nan", "inf", "-1", "0", "1.5"]


def _exit_2(capsys, main, argv, flag, value):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:")
             and not ln.startswith(" ")]
    assert lines and flag in lines[-1] and value in lines[-1], err
    assert "Traceback" not in err
    return lines[-1]


# (entry point, argv before the option, the option, its bad values)
RUN = ["run", "--suite", "layouts", "--no-progress"]
CLI_CASES = [
    *[(cli.main, RUN, "--examples", v) for v in BAD_INTS],
    *[(cli.main, RUN, "--devices", v) for v in BAD_INTS],
    *[(cli.main, RUN, "--processes", v) for v in BAD_INTS],
    *[(cli.main, RUN, "--seed", v) for v in ["nan", "inf", "-1", "1.5"]],
    *[(cli.main, RUN, "--shrink-seconds", v) for v in [*BAD_FLOATS, "1e308"]],
    *[(cli.main, RUN, "--case-timeout", v) for v in [*BAD_FLOATS, "0", "1e308"]],
    *[(cli.main, ["bisect", "repro.py"], "--max-ulp", v) for v in BAD_FLOATS],
    *[(cli.main, ["explain", "repro.py"], "--max-ulp", v) for v in BAD_FLOATS],
    *[(cli.main, ["check"], "--devices", v) for v in ["nan", "-1", "0"]],
]


@pytest.mark.parametrize("main, argv, flag, value", CLI_CASES,
                         ids=[f"{a[0]}{f}={v}" for _, a, f, v in CLI_CASES])
def test_conformance_commands_refuse_bad_numbers(capsys, main, argv, flag, value):
    extra = ["script.py"] if argv == ["check"] else []
    line = _exit_2(capsys, main, argv + [f"{flag}={value}"] + extra, flag, value)
    assert "must be" in line or "pass " in line  # the allowed range


MUTATE = ["--examples", "--seed", "--processes", "--case-timeout", "--devices", "--shrink-calls"]


@pytest.mark.parametrize("flag", MUTATE)
def test_mutate_refuses_bad_numbers(capsys, flag):
    from conformance.engine import mutate

    for value in ("nan", "-1"):
        _exit_2(capsys, mutate.main, [f"{flag}={value}"], flag, value)


@pytest.mark.parametrize("flag", ["--examples", "--seed"])
def test_mpmd_checks_refuse_bad_numbers(capsys, flag):
    from conformance.suites import mpmd_checks

    _exit_2(capsys, mpmd_checks.main, [f"{flag}=-1"], flag, "-1")


@pytest.mark.parametrize("module, flag", [
    ("collectives", "--mib"), ("collectives", "--devices"), ("collectives", "--repeat"),
    ("bandwidth", "--mib"), ("scaling", "--timeout"), ("scaling", "--mib"), ("throughput", "--count"),
    ("trace_reuse", "--orders"), ("accuracy", "--samples"), ("stablehlo", "--repeat"), ("overhead", "--repeat"),
    ("conformance_rate", "--passes"), ("__main__", "--examples"),
])
def test_bench_commands_refuse_bad_numbers(capsys, module, flag):
    import importlib

    main = importlib.import_module(f"bench.{module}").main
    for value in ("nan", "-1"):
        _exit_2(capsys, main, [f"{flag}={value}"], flag, value)


def test_xla_backend_info_refuses_a_bad_device_count(capsys):
    from xla_backend.__main__ import _info

    with pytest.raises(SystemExit) as info:
        _info(["--devices=-1"])
    assert info.value.code == 2 and "--devices" in capsys.readouterr().err


# -- the Python entry points -----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, -1])
def test_bisect_and_explain_refuse_a_bad_max_ulp(value):
    import xla_backend
    from jax.sharding import PartitionSpec as P

    from conformance.debug import bisect
    from conformance.debug.movement import compare_device_put
    from conformance.debug.explain import explain
    from refsim.layouts.named_sharding import NamedSharding

    mesh = xla_backend.mesh((8,), ("i",))
    x = np.arange(8.0, dtype=np.float32)
    with pytest.raises(ValueError, match=r"max_ulp=.*pass a finite number >= 0"):
        bisect(lambda v: v, x, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"), max_ulp=value)
    with pytest.raises(ValueError, match=r"max_ulp=.*pass a finite number >= 0"):
        explain(lambda v: v, x, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"), max_ulp=value)
    with pytest.raises(ValueError, match=r"rtol=.*pass a finite number >= 0"):
        explain(lambda v: v, x, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"), rtol=value)
    sharding = NamedSharding(mesh, P("i"))
    with pytest.raises(ValueError, match=r"max_ulp=.*pass a finite number >= 0"):
        compare_device_put(x, sharding, sharding, max_ulp=value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, 1.5])
def test_conformance_check_refuses_bad_ulps(value):
    import jax

    import conformance
    import xla_backend  # noqa: F401 - 8 devices

    f = jax.jit(lambda v: v * 2)
    with pytest.raises(ValueError, match=r"ulps="):
        conformance.check(f, np.arange(8.0, dtype=np.float32), ulps=value)


@pytest.mark.parametrize("kw, name", [
    ({"examples": 0}, "examples"), ({"examples": 2.5}, "examples"), ({"seed": -1}, "seed"),
    ({"processes": 0}, "processes"), ({"shrink_seconds": math.nan}, "shrink_seconds"),
    ({"shrink_seconds": -1.0}, "shrink_seconds"), ({"shrink_seconds": math.inf}, "shrink_seconds"),
    ({"processes": 1, "case_timeout": math.inf}, "case_timeout"),
    ({"processes": 1, "case_timeout": math.nan}, "case_timeout"),
    ({"processes": 1, "case_timeout": 0}, "case_timeout"), ({"devices": 0}, "devices"),
])
def test_runner_run_refuses_bad_numbers_before_anything_runs(tmp_path, kw, name):
    with pytest.raises((ValueError, TypeError), match=rf"^{name}="):
        runner.run(suite="layouts", progress=False, report_dir=tmp_path / "rep", **kw)
    assert not (tmp_path / "rep").exists()  # refused before the folder is made


# -- the validator itself -----------------------------------------------------------------------------------------
def test_check_names_the_argument_the_value_and_the_range():
    assert validation.check("x", 3, integer=True, low=1) == 3
    assert validation.check("x", np.float32(0.5), low=0) == 0.5
    assert validation.check("x", None, low=0, none=True) is None
    with pytest.raises(ValueError, match=r"^max_ulp=nan; pass a finite number >= 0 \(0: exact\): NaN"):
        validation.check("max_ulp", math.nan, low=0, what="0: exact")
    with pytest.raises(ValueError, match=r"^t=inf; pass a finite number > 0 and <= 1000000"):
        validation.check_seconds("t", math.inf)
    with pytest.raises(ValueError, match=r"^n=0; pass a positive int\.$"):
        validation.check("n", 0, integer=True, low=1)
    with pytest.raises(ValueError, match=r"^n=9; pass an int >= 1 and <= 8\.$"):
        validation.check("n", 9, integer=True, low=1, high=8)
    with pytest.raises(TypeError, match=r"^n=True; pass a positive int"):
        validation.check("n", True, integer=True, low=1)
    with pytest.raises(TypeError, match=r"^n='3'"):
        validation.check("n", "3", low=1)
    parse = validation.option("--max-ulp", low=0)
    assert parse("2.5") == 2.5
    for text in ("nan", "inf", "-0.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            parse(text)
