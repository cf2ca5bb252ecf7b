"""Oracle mode checks programs that take and return typed PRNG keys (`jax.random.key`): a key
argument reaches refsim as its key data, a key output is compared word by word, and a
disagreement in key words is reported with the words of both sides."""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from conformance.verdict.compare import compare
from conformance.oracle import intercept
from conformance.oracle import session as sess
from xla_backend import convert
from conformance import faults


def _checked(run):
    session = sess.Session()
    session.context = "keys"
    intercept.install(session)
    try:
        run()
    finally:
        intercept.uninstall()
    return session.calls


def test_key_argument_and_key_output_are_checked():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    x = jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P(("x", "y"))))
    results = {}

    def run():
        noisy = jax.jit(jax.shard_map(lambda k, a: jax.lax.psum(a + jax.random.uniform(k, a.shape), ("x", "y")),
                                      mesh=mesh, in_specs=(P(), P(("x", "y"))), out_specs=P()))
        results["noisy"] = noisy(jax.random.key(0), x)
        split = jax.jit(lambda k, a: (jax.random.split(k, 3), a * 2), out_shardings=(None, x.sharding))
        results["split"] = split(jax.random.key(7), x)

    calls = _checked(run)
    assert [c["outcome"] for c in calls] == ["agree", "agree"], calls  # both calls checked, none skipped
    # the key words XLA returned are JAX's own split, read back as refsim's structured key array
    keys = convert.to_refsim(results["split"][0])
    words = np.asarray(keys)[keys.dtype.names[0]]
    np.testing.assert_array_equal(words, np.asarray(jax.random.key_data(jax.random.split(jax.random.key(7), 3))))


def test_key_outputs_that_differ_are_a_disagreement_naming_the_words():
    a = convert.to_refsim(jax.random.split(jax.random.key(0), 3))
    b = convert.to_refsim(jax.random.split(jax.random.key(1), 3))
    assert compare(a, convert.to_refsim(jax.random.split(jax.random.key(0), 3))).ok
    res = compare(a, b)
    assert not res.ok
    want = tuple(int(w) for w in np.asarray(jax.random.key_data(jax.random.split(jax.random.key(0), 3)))[0])
    assert f"element (0,) (global (0,)): refsim {want}" in res.report(), res.report()


def test_planted_fault_in_a_program_with_a_key_argument_is_caught():
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)

    def run():
        ring = jax.jit(jax.shard_map(
            lambda k, a: jax.lax.ppermute(a + jax.random.uniform(k, a.shape), "y", [(i, (i + 1) % 4) for i in range(4)]),
            mesh=mesh, in_specs=(P(), P("x", "y")), out_specs=P("x", "y")))
        with faults.inject("ppermute_pairs_reversed"):
            ring(jax.random.key(3), x)
        ring(jax.random.key(3), x)

    assert [c["outcome"] for c in _checked(run)] == ["disagree", "agree"]
