"""One argument cannot take the machine (issue 28, point 5) nor reach XLA's flag parser out of range
(point 7). Each refusal is one line on stderr, exit status 2, before anything starts or is
written, naming the value, the ceiling, why, and --force. The ceilings are derived from this
machine (xla_backend.limits; tests/xla_backend/test_xla_backend_limits.py pins the figures); these tests use
values above them on any machine and never run what they ask for."""
import argparse
import os
import subprocess
import sys

import pytest

from conformance import cli
from conformance.engine import runner
from xla_backend import limits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOO_MANY_PROCESSES = limits.max_processes().value + 1


def _run(*argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_line_exit_2(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr + r.stdout
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("flag, value, why", [
    ("--processes", str(TOO_MANY_PROCESSES), "usable CPU core"),
    ("--devices", "1000000000", "a virtual CPU device takes about 256 KiB in each of the"),
    ("--examples", str(10**12), "the documented maximum of draws per family"),
])
def test_conformance_run_refuses_a_value_above_the_machines_ceiling(tmp_path, flag, value, why):
    rep = tmp_path / "rep"
    line = _one_line_exit_2(_run("conformance", "run", "--suite", "layouts", "--no-progress", "--report", str(rep),
                                 flag, value))
    assert line.startswith(f"error: {flag} {value} is above the ceiling of "), line
    assert why in line and f"add --force to run with {value} anyway" in line, line
    assert not rep.exists()  # refused before the report folder was made


def test_a_device_count_xla_cannot_read_is_refused_by_its_range_even_with_force():
    for argv in (["conformance", "run", "--devices", str(2**63)], ["conformance", "run", "--devices", str(2**63),
                                                                     "--force"],
                 ["conformance", "check", "--devices", str(2**63), "script.py"],
                 ["conformance", "mutate", "--devices", str(2**63)],
                 ["xla_backend", "info", "--devices", str(2**63)],
                 ["xla_backend", "launch", "--devices-per-process", str(2**63), "--", "true"]):
        r = _run(*argv)
        err = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2, r.stderr
        assert f"{2**63} must be >= 1 and <= 2147483647 (XLA reads the device count as a 32-bit int)" in err, err
        assert "--xla_" not in r.stderr and "Traceback" not in r.stderr  # not the help of XLA's flags


@pytest.mark.parametrize("flag, value", [("--processes", str(TOO_MANY_PROCESSES)),
                                         ("--devices-per-process", "1000000000")])
def test_launch_refuses_a_value_above_the_machines_ceiling_before_starting_anything(flag, value):
    line = _one_line_exit_2(_run("xla_backend", "launch", flag, value, "--", sys.executable, "-c",
                                 "raise SystemExit('started')"))
    assert line.startswith(f"launch: error: {flag} {value} is above the ceiling of "), line
    assert "add --force" in line


def _args(argv):
    return cli.build_parser().parse_args(["run", *argv])


def test_force_lifts_every_ceiling_and_the_defaults_are_under_them():
    cli.check_ceilings(_args([]))  # the default run: one process per core, 8 devices, 20 draws
    huge = ["--processes", str(10**6), "--devices", str(10**9), "--examples", str(10**12)]
    with pytest.raises(limits.AboveCeiling):
        cli.check_ceilings(_args(huge))
    cli.check_ceilings(_args(huge + ["--force"]))
    cli.check_ceilings(_args(["--examples", str(runner.MAX_EXAMPLES)]))
    with pytest.raises(limits.AboveCeiling, match=f"--examples {runner.MAX_EXAMPLES + 1} is above the ceiling "
                                                  f"of {runner.MAX_EXAMPLES}"):
        cli.check_ceilings(_args(["--examples", str(runner.MAX_EXAMPLES + 1)]))
    # an accelerator's --devices is a count to find, not to create: no memory ceiling
    cli.check_ceilings(_args(["--platform", "cuda", "--devices", str(10**9)]))


def test_the_help_names_the_ceilings(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"at most {runner.MAX_EXAMPLES} without --force" in text and "--force" in text
    assert isinstance(cli.build_parser(), argparse.ArgumentParser)
