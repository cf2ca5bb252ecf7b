"""Oracle mode sees programs by what executes, not by the name they were built with: JAX's older
entry points (`jax.experimental.shard_map.shard_map`, `jax.experimental.pjit.pjit`) are checked as
`jax.shard_map` / `jax.jit` programs are, installing it replaces no function a user holds, and it
says loudly when a script ran nothing it could see."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import warnings

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from conformance.oracle import intercept
from conformance.oracle import session as sess
from conformance import faults

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository
SUMMARY = re.compile(r"conformance oracle: (\d+) calls checked, (\d+) disagreed, (\d+) not checkable")
LEGACY = (("jax.experimental.shard_map", "shard_map"), ("jax.experimental.pjit", "pjit"))

# Both scripts import the older entry points after the oracle started (as `python -m conformance
# check` runs them), the way programs written for JAX < 0.5 do.
AGREE = '''\
import numpy as np, jax
from functools import partial
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.experimental.shard_map import shard_map
from jax.experimental.pjit import pjit

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))
x = np.arange(32, dtype=np.int32).reshape(4, 8)

# psum over 'y' with the replication check off (check_rep, the old name of check_vma)
row_sums = shard_map(lambda a: jax.lax.psum(a, "y"), mesh, in_specs=P("x", "y"), out_specs=P("x", None),
                     check_rep=False)
got = np.asarray(row_sums(x))
assert (got == x.reshape(4, 4, 2).sum(axis=1)).all(), got      # the four column blocks added

# pjit with shardings given positionally, as pjit allowed
scale = pjit(lambda a, w: a * w + 1, (NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P("y"))),
             NamedSharding(mesh, P("x", "y")))
w = np.arange(8, dtype=np.int32)
assert (np.asarray(scale(x, w)) == x * w + 1).all()
print("script done")
'''

PLANTED = '''\
import numpy as np, jax
from jax.sharding import Mesh, PartitionSpec as P
from jax.experimental.shard_map import shard_map
from conformance import faults

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))
ring = shard_map(lambda a: jax.lax.ppermute(a, "y", [(i, (i + 1) % 4) for i in range(4)]), mesh,
                 in_specs=P("x", "y"), out_specs=P("x", "y"))
with faults.inject("ppermute_pairs_reversed"):           # XLA's ppermute sends the other way
    ring(np.arange(32, dtype=np.float32).reshape(4, 8))
'''

NOTHING = '''\
import numpy as np
print(np.arange(4).sum())
'''


def _env():
    # TMPDIR: the test's tmp_path (conftest.py), where the runs' default reproducer folders go
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TMPDIR=tempfile.gettempdir())
    env.pop("XLA_FLAGS", None)
    return env


def _check(tmp_path, text, name):
    script, report = tmp_path / name, tmp_path / f"{name}.json"
    script.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "conformance", "check", "--report", str(report), str(script)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    return proc, proc.stdout + proc.stderr, json.loads(report.read_text())


def test_cli_checks_experimental_shard_map_and_pjit_calls(tmp_path):
    proc, out, data = _check(tmp_path, AGREE, "legacy.py")
    assert proc.returncode == 0, out
    assert "script done" in proc.stdout and "WARNING" not in out, out
    m = SUMMARY.search(proc.stdout)
    # the eager shard_map runs as three programs (its input reshard, the psum, its output
    # reshard), the pjit as one
    assert m and m.groups() == ("4", "0", "0"), out
    got = [(c["via"], c["name"], c["outcome"], c["policy"]) for c in data["calls"]]
    assert [g[0] for g in got] == ["eager shard_map"] * 3 + ["jit call"], got
    assert all(g[2:] == ("agree", ["exact"]) for g in got), got
    assert any(g[1].startswith("shard_map body: psum") for g in got), got
    assert data["census"] == {"seen": 4, "by_path": {"jit call": 1, "eager shard_map": 3}, "not_intercepted": {}}


def test_cli_catches_a_planted_disagreement_through_experimental_shard_map(tmp_path):
    proc, out, data = _check(tmp_path, PLANTED, "planted.py")
    assert proc.returncode == 1, out
    assert "DISAGREE" in proc.stderr, out
    m = SUMMARY.search(proc.stdout)
    assert m and m.groups() == ("3", "1", "0"), out
    (rec,) = [c for c in data["calls"] if c["outcome"] != "agree"]
    assert (rec["via"], rec["name"], rec["outcome"]) == ("eager shard_map", "shard_map body: ppermute", "disagree"), rec


def test_cli_warns_when_no_call_went_through_the_wrapped_entry_points(tmp_path):
    proc, out, data = _check(tmp_path, NOTHING, "nothing.py")
    assert proc.returncode == 0, out                          # a warning, not a failure (docs/oracle.md)
    m = SUMMARY.search(proc.stdout)
    assert m and m.groups() == ("0", "0", "0"), out
    (warning,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("WARNING")]
    assert "checked nothing" in warning and "no jit program, pmap, shard_map or eager operation" in warning, warning
    assert data["checked"] == 0 and data["calls"] == []


def test_summary_warns_when_every_call_seen_was_skipped_or_not_checkable():
    counts = {"checked": 0, "disagreed": 0, "not_checkable": {"host callback": 1}, "skipped": 2,
              "overhead": {"mean_seconds": 0.0, "median_seconds": 0.0, "total_seconds": 0.0}}
    lines = sess.summary_lines(counts)
    assert lines[-1] == ("WARNING: conformance oracle checked nothing: the 3 calls it saw were "
                         "single-device or not checkable"), lines
    assert not any("WARNING" in ln for ln in sess.summary_lines({**counts, "checked": 1}))


def _legacy_state():
    """Each older entry point: (in the module's own namespace?, what the module serves)."""
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return {f"{m}.{a}": (a in vars(importlib.import_module(m)), getattr(importlib.import_module(m), a))
                for m, a in LEGACY}


def test_install_replaces_no_entry_point_and_uninstall_restores_the_hooks():
    from jax._src import pjit as pjit_internal

    before = _legacy_state()
    jax_before = (jax.jit, jax.shard_map, jax.pmap)
    hooks_before = (pjit_internal._pjit_call_impl_python, pjit_internal._get_fastpath_data,
                    pjit_internal._run_python_pjit, pjit_internal.jit_p.impl)
    session = sess.Session()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)    # installing reads nothing deprecated
        intercept.install(session)
        intercept.install(session)                            # idempotent
    try:
        assert (jax.jit, jax.shard_map, jax.pmap) == jax_before and _legacy_state() == before
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from jax.experimental.pjit import pjit
        mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        step = pjit(lambda a, n: a * n, NamedSharding(mesh, P(("x", "y"))), None, 1)   # static_argnums=1
        assert type(step) is type(jax.jit(lambda a: a))
        out = step(np.arange(8, dtype=np.int32), 3)
        assert (np.asarray(out) == 3 * np.arange(8)).all()
    finally:
        intercept.uninstall()
    (rec,) = session.calls
    assert (rec["entry"], rec["via"], rec["outcome"]) == ("jit", "jit call", "agree"), rec
    assert (pjit_internal._pjit_call_impl_python, pjit_internal._get_fastpath_data,
            pjit_internal._run_python_pjit, pjit_internal.jit_p.impl) == hooks_before


def test_planted_disagreement_through_experimental_shard_map_in_process():
    session = sess.Session()
    session.context = "planted"
    intercept.install(session)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from jax.experimental.shard_map import shard_map
        mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        ring = shard_map(lambda a: jax.lax.ppermute(a, "y", [(i, (i + 1) % 4) for i in range(4)]), mesh,
                         in_specs=P("x", "y"), out_specs=P("x", "y"), check_rep=False)
        x = np.arange(32, dtype=np.float32).reshape(4, 8)
        with faults.inject("ppermute_pairs_reversed"):
            ring(x)
        first = len(session.calls)
        ring(x)                                               # the same program without the fault agrees
    finally:
        intercept.uninstall()
    outcomes = [(c["name"], c["outcome"]) for c in session.calls]
    assert [o for o in outcomes[:first] if o[1] != "agree"] == [("shard_map body: ppermute", "disagree")], outcomes
    assert all(o == "agree" for _, o in outcomes[first:]) and len(outcomes) == 2 * first, outcomes
    (err,) = session.pop_failures("planted")
    assert "values differ" in str(err)


def test_a_sharding_over_an_abstract_mesh_counts_by_the_mesh_size():
    """`device_set` of a NamedSharding over an AbstractMesh raises ValueError (hasattr does not
    catch it); the oracle counts such a sharding as distributed when its mesh has > 1 device."""
    from conformance.oracle import program

    abstract = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2).abstract_mesh
    assert program._multi_device_sharding(NamedSharding(abstract, P("x")))
    one = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:1]).abstract_mesh
    assert not program._multi_device_sharding(NamedSharding(one, P()))
    assert not program._multi_device_sharding(None)
    assert not program._multi_device_sharding(object())            # e.g. jit's UnspecifiedValue
