"""Both reproducer templates judge a complex psum part by part, as conformance.compare does: the
reproducer text is executed (not as __main__) and its own `check` is handed JAX's true result and
a wrong one placed the same way. By hand: psum over 2 devices of 1+2j and 3+4j is 4+6j."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as JP

import refsim
from conformance.cases import CollectiveCall
from conformance.oracle import check as oracle_check
from conformance.oracle import reproduce
from conformance.verdict.compare import SumBound, Ulp
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import PartitionSpec as P

TERMS = np.array([1 + 2j, 3 + 4j], np.complex64)
MESH = jax.make_mesh((2,), ("x",))


def _psum(a):
    return jax.lax.psum(a, "x")


# module level, so the oracle's reproducer can import it
psum_c = jax.jit(jax.shard_map(_psum, mesh=MESH, in_specs=JP("x"), out_specs=JP()))


def _load(text: str) -> dict:
    ns = {"__name__": "reproducer_under_test"}
    exec(compile(text, "<reproducer>", "exec"), ns)
    return ns


def _like(out, value) -> jax.Array:
    """`value` laid out as JAX's result `out` is (same sharding, every device)."""
    return jax.device_put(np.array([value], np.complex64), out.sharding)


def test_case_reproducer_rejects_4_plus_99j():
    case = CollectiveCall(family="psum", source="def f(a):\n    return jax.lax.psum(a, 'x')\n", entry="shard_map",
                          mesh=Mesh((2,), ("x",)), args=(TERMS,), in_specs=(P("x"),), out_specs=P(),
                          labels=(("axes", "'x'"),), outputs=("sum",), name="psum", params={"axis_name": "x"})
    ns = _load(case.repro(case.run(refsim)))
    assert ns["POLICIES"] == ["sum_bound"]
    out = ns["run"]()
    assert np.asarray(out).tolist() == [4 + 6j] and ns["check"](out) == []
    failures = ns["check"](_like(out, 4 + 99j))
    assert len(failures) == 2, failures
    assert all("element (0,): got " in f and "4+99j" in f and "exact " in f and "4+6j" in f for f in failures)
    assert ns["check"](_like(out, 4 + 6j)) == []


@pytest.mark.parametrize("policy, name, near_ok", [
    ("auto", "scaled", True),                                     # 256 ulp of max|output| = 6
    (SumBound.from_terms({d: TERMS.reshape(2, 1) for d in (0, 1)}), "sum_bound", False),  # exact sum
    (Ulp(1), "ulp", True),
])
def test_program_reproducer_rejects_4_plus_99j(policy, name, near_ok):
    x = jax.device_put(TERMS, NamedSharding(MESH, JP("x")))
    traced = oracle_check.prepare(psum_c, (x,), {})
    out = psum_c(x)
    res, ref, pols = oracle_check.finish(traced, out, name="psum_c", entry="jit", policy=policy)
    assert res.ok
    ns = _load(reproduce.source(psum_c, "psum_c", (x,), {}, ref, pols))
    assert ns["POLICIES"] == [name]
    assert ns["check"](out) == []
    failures = ns["check"](_like(out, 4 + 99j))
    assert len(failures) == 2 and all("element (0,): got (4+99j)" in f for f in failures), failures
    one_ulp = complex(4, np.nextafter(np.float32(6), np.float32(7)))
    assert (ns["check"](_like(out, one_ulp)) == []) is near_ok
