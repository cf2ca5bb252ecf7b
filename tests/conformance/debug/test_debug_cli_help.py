"""Every command line's `--help` works: exit status 0 and a usage text, for `python -m conformance`
and each of its subcommands (the debugging loop's check, explain and bisect among them),
`python -m conformance.debug` and `python -m xla_backend` with each of its subcommands. Each runs
as a user runs it, in a fresh interpreter from an empty folder."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance.cli import COMMANDS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HELPS = ([("conformance",), ("conformance.debug",), ("xla_backend",)]
         + [("conformance", name) for name in COMMANDS]
         + [("xla_backend", name) for name in ("info", "launch", "selftest")])


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    """(exit status, stdout, stderr) of `python -m MODULE [SUBCOMMAND] --help`, for every entry of HELPS."""
    cwd = tmp_path_factory.mktemp("empty")
    env = {**os.environ, "PYTHONPATH": ROOT}

    def run(entry):
        module, *sub = entry
        p = subprocess.run([sys.executable, "-m", module, *sub, "--help"], capture_output=True, text=True,
                           cwd=cwd, env=env, timeout=300)
        return p.returncode, p.stdout, p.stderr

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(HELPS, pool.map(run, HELPS)))


@pytest.mark.parametrize("entry", HELPS, ids=lambda e: " ".join(e))
def test_help_exits_0_with_usage(helps, entry):
    code, out, err = helps[entry]
    assert code == 0, f"python -m {' '.join(entry)} --help exited {code}\n{out}\n{err}"
    assert out.lstrip().startswith("usage: python -m "), out
    assert "Traceback" not in err, err


def test_top_level_help_lists_every_subcommand(helps):
    _, out, _ = helps[("conformance",)]
    for name in COMMANDS:
        assert name in out, (name, out)


def test_bisect_help_names_the_runner_the_code_uses(helps, monkeypatch):
    import importlib

    import numpy as np

    from refsim import Mesh, PartitionSpec as P

    bisect_mod = importlib.import_module("conformance.debug.bisect")   # the package exports a function of that name

    _, out, _ = helps[("conformance", "bisect")]
    text = " ".join(out.split())
    assert "(default conformance.debug.region:isolated_runner" in text, text
    assert "default conformance.debug.region:xla_runner" not in text
    used = []

    def isolated_runner(region, args):      # stands in for the one the help names
        used.append(region)
        return bisect_mod.region_mod.xla_runner(region, args)

    monkeypatch.setattr(bisect_mod, "isolated_runner", isolated_runner)
    res = bisect_mod.bisect(lambda a: a * 2, np.ones((8, 2), np.float32), mesh=Mesh((8,), ("i",)), in_specs=P("i"),
                            out_specs=P("i"))
    assert res.ok and used


@pytest.mark.parametrize("command", ["check", "explain", "bisect"])
def test_the_loop_takes_plant_and_lists_its_names(helps, command):
    from conformance.faults import catalogue

    _, out, _ = helps[("conformance", command)]
    text = "".join(out.split())
    assert "--plantNAME" in text, out
    for entry in catalogue.entries():
        assert (entry.name in text) == (command in entry.tools), (command, entry.name)
