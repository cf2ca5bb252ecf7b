"""The oracle's own cost on large arrays (docs/oracle.md, "Cost"): device buffers read in place
where nothing can donate them, donated inputs still copied (JAX's donation unchanged), the
phases of a check recorded, verdicts unchanged."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import oracle_sessions
from conformance.oracle import program as prog

MESH = jax.make_mesh((8,), ("x",), devices=jax.devices()[:8])
LAY = NamedSharding(MESH, P("x"))
PHASES = {"trace", "host_inputs", "host_outputs", "refsim", "policy", "compare", "summaries"}


def oracle():
    return oracle_sessions.installed()


def _x(n=16):
    return jax.device_put(np.arange(n * 4, dtype=np.float32).reshape(n, 4), LAY)


def test_host_array_in_place_and_copied():
    x = _x()
    buffers = [np.asarray(s.data) for s in x.addressable_shards]
    viewed, copied = prog.host_array(x, copy=False), prog.host_array(x)
    by_dev = {s.device.id: b for s, b in zip(x.addressable_shards, buffers)}
    assert all(np.shares_memory(s.data, by_dev[s.device_id]) for s in viewed.shards)   # XLA:CPU: zero-copy
    assert not any(np.shares_memory(s.data, by_dev[s.device_id]) for s in copied.shards)
    naive = np.concatenate([np.asarray(x.addressable_shards[k].data) for k in range(8)])  # P('x'): in device order
    np.testing.assert_array_equal(np.asarray(viewed), naive)
    np.testing.assert_array_equal(np.asarray(copied), naive)


def test_from_execution_records_donation():
    closed = jax.make_jaxpr(lambda a, b: a + b)(np.ones(2, np.float32), np.ones(2, np.float32))
    t = prog.from_execution({"jaxpr": closed, "donated_invars": (True, False)}, [np.ones(2), np.ones(2)])
    assert t.donated == (True, False)
    assert prog.from_execution({"jaxpr": closed}, [np.ones(2), np.ones(2)]).donated is None


def test_donated_input_is_still_donated_under_the_oracle():
    """A view of a donated input would make XLA refuse the donation (the input would stay alive):
    the oracle copies donated inputs, so the call behaves as without it."""
    f = jax.jit(lambda a: a * 2, donate_argnums=0)
    plain = _x()
    f(plain).block_until_ready()
    x = _x()
    with oracle() as s:
        out = f(x)
        out.block_until_ready()
    assert plain.is_deleted() and x.is_deleted()                            # donated with and without the oracle
    np.testing.assert_array_equal(np.asarray(out), np.arange(64, dtype=np.float32).reshape(16, 4) * 2)
    assert s.calls[-1]["outcome"] == "agree"


def test_checked_calls_record_their_phases_and_agree():
    x = _x()
    progs = [jax.jit(lambda a: jnp.reshape(a, (8, 2, 4)), out_shardings=NamedSharding(MESH, P("x"))),
             jax.jit(lambda a: a.T, out_shardings=NamedSharding(MESH, P(None, "x"))),
             jax.jit(lambda a: a * 2 + 1, out_shardings=LAY)]
    with oracle() as s:
        for f in progs:
            f(x).block_until_ready()
        jax.device_put(np.arange(64, dtype=np.float32).reshape(16, 4), LAY).block_until_ready()
    checked = [c for c in s.calls if c["via"] == "jit call"]
    assert [c["outcome"] for c in checked] == ["agree"] * 3
    for c in checked:
        assert set(c["phases"]) == PHASES and all(v >= 0 for v in c["phases"].values())
        assert c["seconds"] >= 0 and c["xla_seconds"] >= 0
    put = [c for c in s.calls if c["via"] == "device_put"][-1]
    assert put["outcome"] == "agree" and {"host_inputs", "host_outputs", "refsim", "compare"} <= set(put["phases"])


def test_a_wrong_result_still_disagrees():
    """The fast paths read bits: a miscompiled ring (pairs reversed) still disagrees, its
    output read in place like any other."""
    from conformance import faults

    ring = jax.jit(jax.shard_map(lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % 8) for i in range(8)]),
                                 mesh=MESH, in_specs=P("x"), out_specs=P("x")))
    x = _x()
    with oracle() as s:
        with faults.inject("ppermute_pairs_reversed"):
            ring(x).block_until_ready()
        ring(x).block_until_ready()
    assert [c["outcome"] for c in s.calls if c["via"] == "jit call"] == ["disagree", "agree"]


def test_check_result_seconds_split_into_phases():
    import conformance

    res = conformance.check(jax.jit(lambda a: a * 2, out_shardings=LAY), _x())
    assert res.ok
    assert PHASES | {"xla", "xla_wait", "refsim_and_compare"} <= set(res.seconds)
    own = sum(res.seconds[k] for k in ("xla_wait", "host_outputs", "refsim", "policy", "compare", "summaries"))
    assert own <= res.seconds["refsim_and_compare"] + 1e-6


def test_exact_outputs_that_agree_are_not_read_again_for_the_summary(monkeypatch):
    import conformance
    from conformance.oracle import check as chk

    x = _x()
    real = chk._max_diff
    calls = []
    monkeypatch.setattr(chk, "_max_diff", lambda e, a: calls.append(1) or real(e, a))
    res = conformance.check(jax.jit(lambda a: jnp.reshape(a, (8, 2, 4)), out_shardings=NamedSharding(MESH, P("x"))), x)
    assert res.ok and res.outputs[0].policy == "exact" and res.outputs[0].max_abs_diff == 0.0 and not calls
    res = conformance.check(jax.jit(lambda a: a * 3 + 1, out_shardings=LAY), x)     # a scaled bound: measured
    assert res.ok and calls
