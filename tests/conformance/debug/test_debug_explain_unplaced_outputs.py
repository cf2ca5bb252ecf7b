"""explain on a jit program whose output placement JAX left to XLA, when XLA does not compile it.

found-bugs 23 (a pad with a negative low edge and interior padding of a split dimension) aborts
in XLA's SPMD partitioner, so no compiled output placement is known. The lowered stage then
compares the global value on every device; the jaxpr stage used to look for each device's own
shard of refsim's output, which refsim puts on one device, and raised ``KeyError: np.int64(1)``.
"""
import numpy as np

import jax

import refsim
from conformance.debug.explain import explain
from conformance.debug.explain.stages import per_partition

P = jax.sharding.PartitionSpec


def test_an_output_on_one_device_is_the_global_value_on_every_device():
    value = np.arange(6.0).reshape(2, 3)
    arr = refsim.device_put(value, refsim.SingleDeviceSharding(0))
    got = per_partition(arr, None, [np.int64(0), np.int64(1)])
    assert got.shape == (2, 2, 3) and (got == value).all()


def test_an_output_on_every_device_keeps_each_devices_own_shard():
    mesh = refsim.Mesh((2,), ("x",))
    arr = refsim.device_put(np.arange(4.0), refsim.NamedSharding(mesh, P("x")))
    assert per_partition(arr, None, [np.int64(1), np.int64(0)]).tolist() == [[2.0, 3.0], [0.0, 1.0]]


def test_explain_on_found_bug_23_evaluates_the_jaxpr_and_blames_the_compiler():
    mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    cfg = [(-1, 0, 1), (0, 0, 0)]
    f = jax.jit(lambda a: jax.lax.pad(a, np.float32(-1), cfg),
                in_shardings=jax.sharding.NamedSharding(mesh, P("x", None)))
    e = explain(f, x)
    jaxpr, lowered, compiled = e.stages[:3]
    assert jaxpr.error is None and "jaxpr" not in e.not_evaluated, e.report()
    want = np.array([[-1.0] * 6, list(range(6, 12))], np.float32)
    for stage in (jaxpr, lowered):
        assert all((dev == want).all() for dev in stage.outputs[0]), stage.name
    assert e.agrees["lowered"] is True, e.report()
    if compiled.status == "crashed":   # the partitioner's CHECK (jax 0.10.2 and 0.12)
        assert e.diverged_in == "compiler" and "Check failed" in e.crash, e.report()
    else:                              # a fixed XLA
        assert e.diverged_in is None, e.report()
