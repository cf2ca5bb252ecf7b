"""bisect names exactly the equation planted into the XLA side, and the devices it affects.

Expected equation positions come from the program text (counted by hand below) and the
expected device sets from a naive per-device NumPy model of the program prefix.
"""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conformance.debug import bisect, trace
from conformance.faults import inject
from conformance.faults.jaxpr import regrouped_psum, reversed_ppermute, rewrite
from refsim import Mesh, NamedSharding, PartitionSpec as P

IDS = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])
MESH = Mesh((2, 4), ("x", "y"), device_ids=IDS)


def program(a, b):                                         # equation (0-based)
    t = a * 2.0                                             # 0 mul
    t = t + b                                               # 1 add
    t = jnp.maximum(t, 3.0)                                 # 2 max
    t = t - 1.0                                             # 3 sub
    u = jax.lax.ppermute(t, "y", [(0, 1), (1, 2)])          # 4 ppermute
    u = u + t                                               # 5 add
    v = jax.lax.psum(u, "x")                                # 6 psum
    v = v * 0.5                                             # 7 mul
    w = jax.lax.psum(v, "y", axis_index_groups=[[0, 1], [2, 3]])  # 8 psum (groups)
    w = w - a                                               # 9 sub
    w = jnp.abs(w)                                          # 10 abs
    z = jax.lax.ppermute(w, "x", [(0, 1), (1, 0)])          # 11 ppermute
    z = z + w                                               # 12 add
    z = jnp.minimum(z, 1000.0)                              # 13 min
    z = z * 3.0                                             # 14 mul
    s = jax.lax.pmax(z, "y")                                # 15 pmax
    s = s - z                                               # 16 sub
    s = s + 1.0                                             # 17 add
    r = jax.lax.ppermute(s, "y", [(i, (i + 1) % 4) for i in range(4)])  # 18 ppermute
    return r + s                                            # 19 add


A = (np.arange(64, dtype=np.float32).reshape(4, 16) % 7)
B = (np.arange(64, dtype=np.float32).reshape(4, 16) % 5)
KW = dict(mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"), check_vma=False)


def _line_of(text: str) -> int:
    lines, start = inspect.getsourcelines(program)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _blocks(g):
    """Naive: device (x, y)'s block of a global (4, 16) array laid out P('x', 'y')."""
    return {(i, j): g[2 * i:2 * i + 2, 4 * j:4 * j + 4] for i in range(2) for j in range(4)}


def _naive_ppermute(blocks, pairs, axis):
    out = {}
    for pos in blocks:
        src = [s for s, d in pairs if d == pos[axis]]
        out[pos] = np.zeros_like(blocks[pos]) if not src else blocks[
            (src[0], pos[1]) if axis == 0 else (pos[0], src[0])]
    return out


def _naive_prefix_to_psum_input():
    """Value j (input of equation 8) per device, computed block by block."""
    a, b = _blocks(A), _blocks(B)
    t = {p: np.maximum(a[p] * 2 + b[p], 3) - 1 for p in a}
    u = _naive_ppermute(t, [(0, 1), (1, 2)], axis=1)
    u = {p: u[p] + t[p] for p in t}
    return {p: (u[(0, p[1])] + u[(1, p[1])]) * 0.5 for p in u}, t


def _devices(positions):
    return sorted(int(IDS[p]) for p in positions)


def test_program_is_twenty_equations_and_agrees_on_real_xla():
    region, _ = trace(program, (A, B), **KW)
    assert len(region.jaxpr.eqns) == 20
    res = bisect(program, A, B, **KW)
    assert res.ok and res.compiles == 1
    assert "MATCH" in res.report()


def test_reversed_ppermute_is_named_with_its_devices():
    _, t = _naive_prefix_to_psum_input()
    good = _naive_ppermute(t, [(0, 1), (1, 2)], axis=1)
    bad = _naive_ppermute(t, [(1, 0), (2, 1)], axis=1)
    expected = _devices(p for p in t if not np.array_equal(good[p], bad[p]))
    assert expected == _devices(p for p in t if p[1] != 3)  # y=3 receives nothing either way

    with inject(reversed_ppermute(4)):      # the jaxpr stage through the one inject: bisect's runner
        res = bisect(program, A, B, **KW)
    d = res.divergence
    assert (d.index, d.primitive) == (4, "ppermute")
    assert d.params["perm"] == ((0, 1), (1, 2))  # the program's own params, as refsim ran them
    assert d.affected == expected
    assert d.devices == {dev: dev not in expected for dev in range(8)}
    assert d.source.endswith(f"test_debug_bisect.py:{_line_of('u = jax.lax.ppermute')}:8 (program)")
    assert [i.source for i in d.inputs] == ["equation #3 (sub)"]
    assert res.compiles <= 6  # ceil(log2(20)) + 1
    (out,) = d.outputs
    dev0 = out.devices[int(IDS[0, 2])]  # y=2 held t[y=1]; reversed it receives nothing
    assert dev0.ranges() == ["[0:2, 0:4]"] and not dev0.actual.any()
    text = res.report()
    assert "ppermute" in text and "#4" in text and "dev 2" in text


def test_changed_psum_groups_is_named_with_its_devices():
    j, _ = _naive_prefix_to_psum_input()
    groups_ok, groups_bad = [[0, 1], [2, 3]], [[0, 2], [1, 3]]

    def psum(groups, pos):
        g = next(g for g in groups if pos[1] in g)
        return sum(j[(pos[0], y)] for y in g)

    expected = _devices(p for p in j if not np.array_equal(psum(groups_ok, p), psum(groups_bad, p)))
    res = bisect(program, A, B, runner=regrouped_psum(8, groups_bad), **KW)
    d = res.divergence
    assert (d.index, d.primitive) == (8, "psum")
    assert d.params["axis_index_groups"] == ((0, 1), (2, 3))
    assert d.affected == expected and expected
    assert d.source.endswith(f":{_line_of('w = jax.lax.psum')}:8 (program)")
    (out,) = d.outputs
    for pos in j:
        dd = out.devices[int(IDS[pos])]
        np.testing.assert_array_equal(dd.expected, psum(groups_ok, pos))
        np.testing.assert_array_equal(dd.actual, psum(groups_bad, pos))


def test_no_op_rewrite_agrees_and_a_fault_in_the_last_collective_is_found():
    res = bisect(program, A, B, runner=rewrite(15, lambda p: p), **KW)
    assert res.ok
    res = bisect(program, A, B, runner=rewrite(18, lambda p: {**p, "perm": ((0, 1),)}), **KW)
    assert (res.divergence.index, res.divergence.primitive) == (18, "ppermute")


def test_reversing_a_swap_plants_nothing():
    def f(a):
        b = a * 2.0
        c = jax.lax.ppermute(b, "y", [(0, 1), (1, 0)])
        return jax.lax.psum(c, "x")

    # the reversed pairs of a swap are the swap itself
    res = bisect(f, A, mesh=MESH, in_specs=P("x", "y"), out_specs=P(None, "y"), runner=reversed_ppermute())
    assert res.ok


def test_ring_reversal_with_check_vma_reports_vma_layouts():
    def f(a):
        b = a * 2.0
        c = jax.lax.ppermute(b, "y", [(0, 1), (1, 2), (2, 3), (3, 0)])
        return jax.lax.psum(c, "x")

    res = bisect(f, A, mesh=MESH, in_specs=P("x", "y"), out_specs=P(None, "y"), runner=reversed_ppermute())
    d = res.divergence
    assert d.primitive == "ppermute" and d.affected == list(range(8))
    (inp,) = d.inputs
    assert inp.layout == "per-device block [2, 4], varying over (x, y)"


def test_jit_program_per_device_by_xla_placement():
    mesh = Mesh((8,), ("x",))
    s = NamedSharding(mesh, P("x"))

    def g(x):
        y = x * 2.0
        z = jax.lax.rev(y, (0,))
        return z + 1.0

    x = np.arange(16, dtype=np.float32)
    assert bisect(g, x, mesh=mesh, in_shardings=s, out_shardings=s).ok
    res = bisect(g, x, mesh=mesh, in_shardings=s, out_shardings=s,
                 runner=rewrite("rev", lambda p: {**p, "dimensions": ()}))
    d = res.divergence
    assert (d.index, d.primitive) == (1, "rev")
    # rev of 2*arange(16) differs from it everywhere, so every device holding a block differs
    assert d.affected == sorted(d.devices) and len(d.devices) >= 1
    assert d.inputs[0].layout.startswith("XLA placed dev 0:")


def test_bad_arguments_raise_with_the_fix():
    with pytest.raises(ValueError, match=r"max_ulp=-1; pass a finite number >= 0"):
        bisect(program, A, B, max_ulp=-1, **KW)
    with pytest.raises(ValueError, match="in_specs given without out_specs"):
        bisect(program, A, B, mesh=MESH, in_specs=P("x", "y"))
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh or a refsim.Mesh"):
        bisect(program, A, B, mesh=None, in_specs=P("x", "y"), out_specs=P("x", "y"))


def test_runner_returning_wrong_count_is_rejected():
    with pytest.raises(ValueError, match="runner returned 0 values"):
        bisect(program, A, B, runner=lambda region, args: [], **KW)
