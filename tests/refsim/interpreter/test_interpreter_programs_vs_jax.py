"""Every corpus program through refsim and through JAX on the 8 CPU devices, device by device.

Outputs must agree per device: same device ids, same index, same shape and dtype, and
bit-identical data (inputs are exact-friendly) or within the program's stated `tol`.
Programs XLA:CPU cannot run are checked against their independent NumPy `reference`.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import jax

from refsim import compat

from conformance.cases.corpus import PROGRAMS, Program

SEEDS = (0, 1)


def _norm_index(index, shape):
    out = []
    for i, n in zip(index, shape):
        out.append(i.indices(n)[:2] if isinstance(i, slice) else int(i))
    return tuple(out)


def _jax_mesh(prog: Program):
    size = int(np.prod(prog.mesh_shape))
    devs = np.array(jax.devices()[:size]).reshape(prog.mesh_shape)
    types = prog.axis_types or ("Auto",) * len(prog.mesh_shape)
    return jax.sharding.Mesh(devs, prog.axis_names,
                             axis_types=tuple(getattr(jax.sharding.AxisType, t) for t in types))


def _set_mesh(mesh):
    return jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else jax.sharding.use_mesh(mesh)


def run_with_jax(prog: Program, inputs):
    """The program under JAX's own entry point on the CPU devices; flat list of jax.Arrays."""
    mesh = _jax_mesh(prog)
    named = lambda tree: None if tree is None else jax.tree_util.tree_map(  # noqa: E731
        lambda s: None if s is None else jax.sharding.NamedSharding(mesh, s), tree,
        is_leaf=lambda x: x is None or isinstance(x, jax.sharding.PartitionSpec))
    if prog.kind == "pmap":
        out = jax.pmap(prog.fn, **prog.pmap_kwargs)(*inputs)
    elif prog.kind == "shard_map":
        kw = {} if prog.manual_axes is None else {"axis_names": set(prog.manual_axes)}
        f = jax.jit(jax.shard_map(prog.fn, mesh=mesh, in_specs=prog.in_specs, out_specs=prog.out_specs,
                                  check_vma=prog.check_vma, **kw))
        with _set_mesh(mesh):
            out = f(*inputs)
    else:
        in_sh = named(prog.in_specs)
        args = list(inputs)
        if in_sh is not None:
            args = [jax.device_put(a, s) if s is not None else a for a, s in zip(args, in_sh)]
        kw = {}
        if in_sh is not None:
            kw["in_shardings"] = in_sh
        if prog.out_specs is not None:
            kw["out_shardings"] = named(prog.out_specs)
        with _set_mesh(mesh):
            out = jax.jit(prog.fn, **kw)(*args)
    return jax.tree_util.tree_leaves(out)


def _equal(a, b, tol, ulp=0):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if ulp:  # the program's bound from refsim's accuracy contract
        from conformance.verdict.compare import ulp_distance

        return bool(np.all(ulp_distance(a, b) <= ulp))
    if tol:
        return np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
    if np.issubdtype(a.dtype, np.inexact):
        return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
    return np.array_equal(a, b)


def assert_same_per_device(prog, ref_arr, jax_arr, i):
    shape = tuple(jax_arr.shape)
    assert tuple(ref_arr.shape) == shape and ref_arr.dtype == jax_arr.dtype, (
        f"{prog.name} output {i}: refsim {ref_arr.dtype}{ref_arr.shape} vs jax {jax_arr.dtype}{shape}")
    jshards = {s.device.id: s for s in jax_arr.addressable_shards}
    rshards = {s.device_id: s for s in ref_arr.shards}
    assert set(jshards) == set(rshards), (
        f"{prog.name} output {i}: devices {sorted(rshards)} (refsim) vs {sorted(jshards)} (jax)")
    for d, js in jshards.items():
        rs = rshards[d]
        assert _norm_index(rs.index, shape) == _norm_index(js.index, shape), (
            f"{prog.name} output {i} device {d}: index {rs.index} (refsim) vs {js.index} (jax)")
        jd = np.asarray(js.data)
        rd = np.asarray(rs.data)
        assert _equal(rd, jd, prog.tol, prog.ulp), (
            f"{prog.name} output {i} device {d}: refsim\n{rd}\njax\n{jd}")


RUNNABLE = [p for p in PROGRAMS if p.xla_runs]
NO_XLA = [p for p in PROGRAMS if not p.xla_runs]


def test_corpus_is_large_and_diverse():
    assert len(PROGRAMS) >= 60
    fams = {p.family for p in PROGRAMS}
    assert {"collectives", "control_flow", "autodiff", "models", "explicit_sharding", "pmap", "nested",
            "random", "no_xla"} <= fams


@pytest.mark.parametrize("prog", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_program_matches_jax_per_device(prog):
    if prog.name == "nested_shard_map_partial_manual" and compat.jax_version() < (0, 10):
        pytest.skip("jax 0.9.2 cannot lower an axis_index nested in a partial-manual shard_map (found-bugs 30)")
    for seed in SEEDS:
        inputs = prog.inputs(seed)
        ours = prog.run_refsim(seed)
        theirs = run_with_jax(prog, inputs)
        assert len(ours) == len(theirs), f"{prog.name}: {len(ours)} outputs vs {len(theirs)}"
        for i, (r, j) in enumerate(zip(ours, theirs)):
            assert_same_per_device(prog, r, j, i)


@pytest.mark.parametrize("prog", NO_XLA, ids=[p.name for p in NO_XLA])
def test_program_matches_numpy_reference(prog):
    for seed in SEEDS:
        inputs = prog.inputs(seed)
        ours = prog.run_refsim(seed)
        expected = prog.reference(*inputs)
        assert len(ours) == len(expected)
        for r, e in zip(ours, expected):
            np.testing.assert_array_equal(np.asarray(r), e)
