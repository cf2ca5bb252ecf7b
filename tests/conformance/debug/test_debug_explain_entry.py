"""explain and bisect take what `conformance.check` takes: JAX meshes, callables already under
jax.jit / jax.shard_map with placed jax.Arrays, and the reproducers `check` writes.

Faults come from `conformance.faults` (wrong lowering rules injected into JAX), so refsim's
answer is the program's documented semantics and XLA's is the faulty one.
"""
import json
import textwrap

import numpy as np
import pytest

import jax
from jax import lax

import conformance
from conformance.faults import lowering as faults

P = jax.sharding.PartitionSpec
NS = jax.sharding.NamedSharding


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))


def _x():
    return (np.arange(16, dtype=np.float32).reshape(8, 2) + 1) * np.array([1, -3], np.float32)


def test_conformance_explain_is_the_callable_module():
    import conformance.explain as mod
    from conformance.debug.explain import explain
    from conformance.debug.explain.core import explain as core_explain

    assert conformance.explain is mod and callable(mod) and explain is core_explain
    assert mod.STAGES == ("jaxpr", "lowered", "compiled", "executed") and mod.core.Explanation is mod.Explanation
    from conformance.debug import bisect

    assert conformance.bisect is bisect


def test_a_jax_mesh_is_accepted_by_explain_and_bisect(mesh):
    def f(a):
        return lax.psum(a * 2, "i")

    with faults.inject("psum_drop_member"):
        e = conformance.explain(f, _x(), mesh=mesh, in_specs=P("i"), out_specs=P())
        r = conformance.bisect(f, _x(), mesh=mesh, in_specs=P("i"), out_specs=P())
    assert (e.diverged_in, e.op) == ("lowering", "stablehlo.all_reduce"), e.report()
    assert not r.ok and r.divergence.primitive.startswith("psum"), r.report()


def test_a_jit_shard_map_callable_with_placed_arrays_runs_as_given(mesh):
    step = jax.jit(jax.shard_map(lambda a: lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)]) + 1,
                                 mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(_x(), NS(mesh, P("i")))
    e = conformance.explain(step, x)
    assert e.diverged_in is None and e.complete, e.report()
    assert conformance.bisect(step, x).ok
    with faults.inject("ppermute_pairs_reversed"):
        e = conformance.explain(step, x)
        r = conformance.bisect(step, x)
    assert (e.diverged_in, e.op) == ("lowering", "stablehlo.collective_permute"), e.report()
    assert r.divergence.primitive == "ppermute", r.report()
    assert dict(e.mesh.shape) == {"i": 8}


def test_a_jit_with_shardings_callable_is_a_global_view_program(mesh):
    step = jax.jit(lambda a: (a * 2).sum(0), in_shardings=NS(mesh, P("i")))
    x = jax.device_put(_x(), NS(mesh, P("i")))
    assert conformance.explain(step, x).diverged_in is None
    with faults.inject("partitioned_reduction_drops_shard"):
        e = conformance.explain(step, x)
        r = conformance.bisect(step, x)
    assert e.diverged_in == "lowering", e.report()
    assert not r.ok and r.region.kind == "jit", r.report()


USER = '''\
import jax
from jax import lax

P = jax.sharding.PartitionSpec
mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))


def _ring(a):
    return lax.ppermute(a * 2, "i", [(j, (j + 1) % 8) for j in range(8)])


ring = jax.jit(jax.shard_map(_ring, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
'''


def test_a_reproducer_written_by_check_is_accepted_by_explain_and_bisect(tmp_path, monkeypatch, capsys):
    import importlib

    from conformance.cli import main

    (tmp_path / "user_ring.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    user = importlib.import_module("user_ring")
    x = jax.device_put(_x(), NS(user.mesh, P("i")))
    with faults.inject("ppermute_pairs_reversed"):
        with pytest.raises(conformance.ConformanceError) as info:
            conformance.check(user.ring, x, repro_dir=str(tmp_path / "repro"))
        repro = info.value.repro_path
        assert main(["explain", repro, "--json"]) == 1
        got = json.loads(capsys.readouterr().out)
        assert (got["diverged_in"], got["op"]) == ("lowering", "stablehlo.collective_permute"), got
        assert main(["bisect", repro]) == 1
        out = capsys.readouterr().out
        assert "primitive: ppermute" in out
    # without the fault the reproducer's program agrees at every stage
    assert main(["explain", repro]) == 0
    assert "all stages agree" in capsys.readouterr().out


EXPLICIT_SOURCE = '''\
def f(a):
    s = jnp.sum(jax.sharding.reshard(a, P("x")), axis=0, keepdims=True)
    return (jnp.matmul(jnp.swapaxes(s, -1, -2), s, out_sharding=P("y")),)
'''


def test_a_reproducer_on_an_explicit_mesh_is_explained_on_that_mesh(tmp_path):
    # The sharded suite's Explicit programs (reshard, out_sharding=) do not even trace on Auto axes:
    # the reproducer states its AXIS_TYPES and the loader builds the mesh with them, so a failing
    # case gets its stage instead of "not localised (... axis name: y of type: AxisType.Auto)".
    import refsim
    from conformance.cases.program import Program
    from conformance.debug import loader
    from conformance.debug.explain.summary import stage_of_reproducer
    from refsim.layouts.mesh import AxisType, Mesh
    from refsim.layouts.named_sharding import NamedSharding
    from refsim.layouts.partition_spec import PartitionSpec

    m = Mesh((4, 2), ("x", "y"), device_ids=np.arange(8).reshape(4, 2), axis_types=(AxisType.Explicit,) * 2)
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    case = Program(family="explicit", source=EXPLICIT_SOURCE, entry="jit", mesh=m, args=(x,),
                   in_shardings=(NamedSharding(m, PartitionSpec("x")),),
                   out_shardings=(NamedSharding(m, PartitionSpec("y")),))
    path = tmp_path / "explicit.py"
    path.write_text(case.repro(case.run(refsim)))
    assert "AXIS_TYPES = ('Explicit', 'Explicit')" in path.read_text()
    assert loader.load(str(path)).mesh.axis_types == (AxisType.Explicit,) * 2
    assert stage_of_reproducer(str(path)) == {**stage_of_reproducer(str(path)), "diverged_in": None,
                                              "headline": "all stages agree"}
    with faults.inject("partitioned_reduction_drops_shard"):   # the sum over the split dimension x leaves out a shard
        stage = stage_of_reproducer(str(path))
    assert stage.get("diverged_in") == "lowering" and ":2" in stage.get("source", ""), stage
