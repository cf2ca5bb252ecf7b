"""The public corpus through refsim and through xla_backend: equal per device, in several device orders.

Every corpus program XLA:CPU can run goes through `refsim.<entry>` and
`xla_backend.<entry>` on one refsim Mesh whose device ids are JAX device ids, in
the default order and in permuted orders; results are compared by the comparison
policy (conformance.verdict.compare): same device ids, indices, shard shapes and dtypes,
bit-exact data for exact-friendly inputs (or the program's stated `tol`).
"""
from __future__ import annotations

import numpy as np
import pytest

import refsim
import xla_backend
from conformance.verdict import compare
from conformance.cases.corpus import PROGRAMS, _entry

RUNNABLE = [p for p in PROGRAMS if p.xla_runs]
# Each program in the default order and one permuted order (alternating reversed / seeded random),
# which keeps the module fast while every program meets a permuted mesh.
CASES = [(p, o) for k, p in enumerate(RUNNABLE)
         for o in ("default", "reversed" if k % 2 else ("random", k))]
# Programs whose body places data on jax.devices() in default order (a pmap inside jit): with a
# permuted context mesh JAX itself rejects them ("incompatible devices"), and so must we.
PINNED_TO_DEFAULT_ORDER = {"pmap_inside_jit"}


def _mesh(prog, order):
    return xla_backend.mesh(prog.mesh_shape, prog.axis_names, order=order, axis_types=prog.axis_types)


def _callable(prog, api, mesh):
    if prog.kind == "pmap":  # the pmap devices follow the mesh's device order
        return api.pmap(prog.fn, **prog.pmap_kwargs, devices=mesh.device_ids.ravel().tolist())
    return _entry(prog, api, mesh)


def _assert_close_per_device(ref, xla, tol, what):
    for k, (r, x) in enumerate(zip(compare.as_outputs(ref), compare.as_outputs(xla))):
        for s in x.shards:
            np.testing.assert_allclose(s.data, r.shard(s.device_id).data, rtol=tol, atol=tol,
                                       err_msg=f"{what} output {k} device {s.device_id}")


def test_corpus_has_enough_xla_programs():
    assert len(RUNNABLE) >= 40, f"only {len(RUNNABLE)} corpus programs run on XLA"


@pytest.mark.parametrize("prog,order", CASES, ids=[f"{p.name}-{o}" for p, o in CASES])
def test_xla_equals_refsim(prog, order):
    mesh = _mesh(prog, order)
    inputs = prog.inputs(0)
    if prog.name in PINNED_TO_DEFAULT_ORDER and order != "default":
        with pytest.raises(ValueError, match="incompatible devices"):
            _callable(prog, xla_backend, mesh)(*inputs)
        return
    ref = _callable(prog, refsim, mesh)(*inputs)
    xla = _callable(prog, xla_backend, mesh)(*inputs)
    what = f"{prog.name} on {mesh!r}"
    assert all(a.info.get("backend") == "xla" for a in compare.as_outputs(xla))
    if prog.tol:
        res = compare.compare(ref, xla, tolerances=compare.Exact())
        layout = [m for m in res.mismatches if m.kind not in ("values",)]
        assert not layout, res.report()
        _assert_close_per_device(ref, xla, prog.tol, what)
    else:
        res = compare.compare(ref, xla, ulp=prog.ulp or None)
        assert res.ok, f"{what}\n{res.report()}"


def test_new_data_reuses_the_compiled_executable():
    progs = [p for p in RUNNABLE if p.kind == "shard_map"][:5]
    for prog in progs:
        run = _callable(prog, xla_backend, _mesh(prog, "default"))
        run(*prog.inputs(0))
        before = xla_backend.stats()
        outs = compare.as_outputs(run(*prog.inputs(1)))
        after = xla_backend.stats()
        assert after["compiles"] == before["compiles"], prog.name
        assert after["cache_hits"] == before["cache_hits"] + 1
        assert all(a.info["cache_hit"] for a in outs)
