"""Regressions for the defects found by running JAX's own shard_map / pmap tests on refsim.

Each test states its expected values from hand computation or a naive NumPy model of what
each device computes (never from refsim); vs-JAX checks run the same program on XLA:CPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding as JNS, PartitionSpec as JP

import refsim
from refsim import compat
from refsim import Mesh, NamedSharding, P

EXPLICIT = AxisType.Explicit


def _explicit(shape, names):
    return (jax.make_mesh(shape, names, axis_types=(EXPLICIT,) * len(shape)),
            Mesh(shape, names, axis_types=(refsim.AxisType.Explicit,) * len(shape)))


def _shards(arr) -> dict:
    """device id -> data, for a refsim.Array or a jax.Array."""
    if isinstance(arr, refsim.Array):
        return {s.device_id: np.asarray(s.data) for s in arr.shards}
    return {s.device.id: np.asarray(s.data) for s in arr.addressable_shards}


# --- defect 1: unreduced / reduced values end to end ------------------------------------------

def test_unreduced_input_to_shard_map_is_per_device_partial_sums():
    # The reproducer: ones(2,4) @ ones(4,6) contracts 4 ones, so every entry is 4;
    # a shard_map that psums its unreduced input must see partial sums 2 + 2, not 4 + 4.
    _, rmesh = _explicit((2,), ("x",))

    def f(a, b):
        z = jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"}))
        return jax.shard_map(lambda z: jax.lax.psum(z, "x"), in_specs=JP(unreduced={"x"}),
                             out_specs=JP())(z)

    a, b = np.ones((2, 4), np.float32), np.ones((4, 6), np.float32)
    out = refsim.jit(f, in_shardings=(NamedSharding(rmesh, P(None, "x")), NamedSharding(rmesh, P("x", None))))(a, b)
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 6), 4.0, np.float32))


def _partial_matmul(a, b, x_axis_blocks, y_axis_blocks):
    """Naive model of device (i, j) in P('x','y') @ P('y', None) with unreduced y:
    rows of block i, the j-th contraction block only."""
    out = {}
    rows = np.split(np.arange(a.shape[0]), x_axis_blocks)
    ks = np.split(np.arange(a.shape[1]), y_axis_blocks)
    for i in range(x_axis_blocks):
        for j in range(y_axis_blocks):
            out[(i, j)] = a[np.ix_(rows[i], ks[j])] @ b[ks[j], :]
    return out


def test_shard_map_unreduced_out_specs_keep_partial_sums_and_reshard_sums_them():
    jmesh, rmesh = _explicit((2, 2), ("x", "y"))
    a = np.arange(8.0, dtype=np.float32).reshape(2, 4)
    b = np.arange(8.0, dtype=np.float32).reshape(4, 2)

    @jax.shard_map(in_specs=(JP("x", "y"), JP("y", None)), out_specs=JP("x", None, unreduced={"y"}))
    def partial(a, b):
        return jax.lax.pcast(jnp.einsum("ab,bc->ac", a, b), "y", to="unreduced")

    def prog(a, b):
        u = partial(a, b)
        return u, jax.sharding.reshard(u, JP("x", None))

    sh = (NamedSharding(rmesh, P("x", "y")), NamedSharding(rmesh, P("y", None)))
    u, full = refsim.jit(prog, in_shardings=sh)(a, b)
    assert u.sharding.spec == P("x", None, unreduced={"y"})
    expect = _partial_matmul(a, b, 2, 2)
    for pos in np.ndindex(2, 2):
        np.testing.assert_array_equal(u.shard(int(rmesh.device_ids[pos])).data, expect[pos])
    # Device 0 (x=0, y=0) holds [0,1] @ [[0,1],[2,3]] = [[2, 3]]: JAX's own test states the same.
    np.testing.assert_array_equal(u.shard(0).data, [[2.0, 3.0]])
    np.testing.assert_array_equal(np.asarray(full), a @ b)


def test_dot_general_into_unreduced_out_sharding_matches_xla_device_by_device():
    jmesh, rmesh = _explicit((2, 2), ("x", "y"))
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (4, 8)).astype(np.float32)
    b = rng.integers(-3, 4, (8, 6)).astype(np.float32)

    def f(a, b):
        return jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"}))

    with jax.set_mesh(jmesh):
        want = jax.jit(f)(jax.device_put(a, JP(None, "x")), jax.device_put(b, JP("x", None)))
    got = refsim.jit(f, in_shardings=(NamedSharding(rmesh, P(None, "x")), NamedSharding(rmesh, P("x", None))))(a, b)
    assert got.sharding.spec.unreduced == {"x"} and not got.sharding.spec.used_axes()
    w, g = _shards(want), _shards(got)
    assert w.keys() == g.keys()
    for d in w:
        np.testing.assert_array_equal(g[d], w[d], err_msg=f"device {d}")
    # and by hand: device at x=i holds a[:, 4i:4i+4] @ b[4i:4i+4]
    for pos in np.ndindex(2, 2):
        i = pos[0]
        np.testing.assert_array_equal(g[int(rmesh.device_ids[pos])], a[:, 4 * i:4 * i + 4] @ b[4 * i:4 * i + 4])


def _jax_read_error_class():
    """What real JAX raises reading an unreduced array: 0.10 NotImplementedError, 0.12 JaxRuntimeError."""
    jmesh, _ = _explicit((2,), ("x",))
    f = lambda a, b: jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"}))
    with jax.set_mesh(jmesh):
        z = jax.jit(f)(jax.device_put(np.ones((2, 4), np.float32), JP(None, "x")),
                       jax.device_put(np.ones((4, 6), np.float32), JP("x", None)))
    try:
        np.asarray(z)
    except Exception as e:  # noqa: BLE001  (the class is what is compared)
        return type(e)
    return None


def test_reading_an_unreduced_array_raises_jax_error_class_and_shards_hold_partial_sums():
    if compat.jax_version() < (0, 10):
        pytest.skip("jax 0.9 reads an unreduced array without raising (refsim.compat.unreduced_read_error: 0.10 and later)")
    jmesh, rmesh = _explicit((2,), ("x",))
    a = np.ones((2, 4), np.float32)
    b = np.arange(24, dtype=np.float32).reshape(4, 6)

    def f(a, b):
        return jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"}))

    got = refsim.jit(f, in_shardings=(NamedSharding(rmesh, P(None, "x")), NamedSharding(rmesh, P("x", None))))(a, b)
    want_cls = _jax_read_error_class()
    assert want_cls is not None  # JAX refuses the read on both supported versions
    with pytest.raises(want_cls, match=r"unreduced over mesh axes \['x'\].*reshard"):
        np.asarray(got)
    # the partial sums stay readable per device (by hand: column sums of b's row halves)
    shards = _shards(got)
    np.testing.assert_array_equal(shards[int(rmesh.device_ids[0])], np.tile(b[:2].sum(0), (2, 1)))
    np.testing.assert_array_equal(shards[int(rmesh.device_ids[1])], np.tile(b[2:].sum(0), (2, 1)))
    # and reducing first gives the global value, as in JAX
    with jax.set_mesh(jmesh):
        total = refsim.jit(lambda a, b: jax.reshard(f(a, b), JP()),
                           in_shardings=(NamedSharding(rmesh, P(None, "x")), NamedSharding(rmesh, P("x", None))))(a, b)
    np.testing.assert_array_equal(np.asarray(total), np.tile(b.sum(0), (2, 1)))


def test_grad_through_reduced_all_gather_consumes_unreduced_cotangent():
    # loss = psum_x(sum(all_gather_y(v)**2)) is the sum of squares of every element once,
    # so d loss / d v = 2 v; a cotangent handed whole to every device would double it.
    jmesh, rmesh = _explicit((2, 2), ("x", "y"))
    v = np.arange(32.0, dtype=np.float32).reshape(8, 4)

    @jax.shard_map(out_specs=JP(reduced={"y"}))
    def loss(values):
        gathered = jax.lax.all_gather(values, "y", axis=1, tiled=True, to="reduced")
        return jax.lax.psum(jnp.sum(gathered * gathered), "x")

    out = refsim.jit(jax.grad(loss), in_shardings=NamedSharding(rmesh, P("x", "y")))(v)
    np.testing.assert_array_equal(np.asarray(out), 2 * v)


def test_grad_through_pcast_to_reduced():
    # loss = psum_x(sum(pcast(v, 'y', to='reduced')**2)) sums every element's square once
    # (v is replicated over y), so the gradient is 2 v, not 2 v times the size of y
    jmesh, rmesh = _explicit((2, 2), ("x", "y"))
    w = np.arange(16.0, dtype=np.float32).reshape(4, 4)

    @jax.shard_map(out_specs=JP(reduced={"y"}))
    def loss(v):
        r = jax.lax.pcast(v, "y", to="reduced")
        return jax.lax.psum(jnp.sum(r * r), "x")

    got = refsim.jit(jax.grad(loss), in_shardings=NamedSharding(rmesh, P("x", None)))(w)
    np.testing.assert_array_equal(np.asarray(got), 2 * w)


def test_fsdp_reduced_weights_gradient_matches_xla():
    jmesh, rmesh = _explicit((2,), ("x",))
    rng = np.random.default_rng(1)
    x = rng.integers(-2, 3, (4, 8)).astype(np.float32)
    w = rng.integers(-2, 3, (8, 6)).astype(np.float32)

    @jax.shard_map(out_specs=JP(reduced={"x"}))
    def gather(w):
        return jax.lax.all_gather(w, "x", axis=0, tiled=True, to="reduced")

    def step(x, w):
        return jax.grad(lambda x, w: ((x @ gather(w)) ** 2).sum(), argnums=(0, 1))(x, w)

    with jax.set_mesh(jmesh):
        want = jax.jit(step)(jax.device_put(x, JP("x", None)), jax.device_put(w, JP("x", None)))
    got = refsim.jit(step, in_shardings=(NamedSharding(rmesh, P("x", None)),) * 2)(x, w)
    for wa, ga in zip(want, got):
        assert _shards(wa).keys() == _shards(ga).keys()
        for d, data in _shards(wa).items():
            np.testing.assert_array_equal(_shards(ga)[d], data, err_msg=f"device {d}")
    # by hand: d/dw sum((xw)^2) = 2 x^T (x w)
    np.testing.assert_array_equal(np.asarray(got[1]), 2 * x.T @ (x @ w))


# --- defect 2: refsim.shard_map under jax.set_mesh -------------------------------------------

@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_shard_map_runs_inside_set_mesh(axis_type):
    jmesh = jax.make_mesh((4,), ("x",), axis_types=(axis_type,))
    rmesh = Mesh.from_jax(jmesh)
    x = refsim.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(rmesh, P("x")))
    with jax.set_mesh(jmesh):
        for mesh in (jmesh, rmesh, None):  # None: the context mesh, as jax.shard_map allows
            out = refsim.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=JP("x"), out_specs=JP())(x)
            # device k holds [2k, 2k+1]; the psum is [0+2+4+6, 1+3+5+7]
            np.testing.assert_array_equal(np.asarray(out), [12.0, 16.0])


# --- defect 3: jit output placement with reduced / unreduced specs ----------------------------

def test_jit_output_placement_reads_partitions_of_unreduced_specs():
    _, rmesh = _explicit((2,), ("x",))

    def f(a, b):
        return jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"}))

    a, b = np.ones((2, 4), np.float32), np.ones((4, 2), np.float32)
    out = refsim.jit(f, in_shardings=(NamedSharding(rmesh, P(None, "x")), NamedSharding(rmesh, P("x", None))))(a, b)
    assert out.sharding.spec.unreduced == {"x"} and not out.sharding.spec.used_axes()
    for s in out.shards:  # each device contracted 2 of the 4 ones
        np.testing.assert_array_equal(s.data, np.full((2, 2), 2.0, np.float32))


# --- defect 5: typed PRNG keys ------------------------------------------------------------------

def test_closed_over_typed_key_and_key_arguments():
    key = jax.random.key(0)
    f = lambda x: x + jax.random.bits(key, x.shape, jnp.uint32)  # noqa: E731
    want = np.asarray(jax.jit(f)(np.zeros(3, np.uint32)))
    np.testing.assert_array_equal(np.asarray(refsim.jit(f)(np.zeros(3, np.uint32))), want)

    keys = jax.random.split(jax.random.key(1), 4)
    g = lambda k: jax.random.bits(k, (2,), jnp.uint32)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(refsim.pmap(g)(keys)), np.asarray(jax.pmap(g)(keys)))
    np.testing.assert_array_equal(np.asarray(refsim.jit(g)(keys[0])), np.asarray(jax.jit(g)(keys[0])))


# --- defect 6: with_sharding_constraint naming a manual axis ------------------------------------

def test_sharding_constraint_on_a_manual_axis_is_rejected():
    jmesh = jax.make_mesh((2, 2), ("i", "j"), axis_types=(AxisType.Auto,) * 2)

    def g(x):
        return jax.lax.with_sharding_constraint(x, JNS(jmesh, JP("i", "j"))) * 2

    def f(x):
        return jax.shard_map(g, mesh=jmesh, in_specs=JP("i", None), out_specs=JP("i", None),
                             check_vma=False, axis_names=frozenset({"i"}))(x)

    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    with pytest.raises(ValueError, match=r"contains a manual axes \('i',\)"):
        jax.jit(f)(x)
    with pytest.raises(ValueError, match=r"contains a manual axes \('i',\)"):
        refsim.jit(f)(x)
    # naming only the automatic axis is fine: the constraint is the identity on values
    ok = lambda x: jax.shard_map(lambda v: jax.lax.with_sharding_constraint(v, JNS(jmesh, JP(None, "j"))) * 2,  # noqa: E731
                                 mesh=jmesh, in_specs=JP("i", None), out_specs=JP("i", None),
                                 check_vma=False, axis_names=frozenset({"i"}))(x)
    np.testing.assert_array_equal(np.asarray(refsim.jit(ok)(x)), 2 * x)


# --- defect 7: error classes and wording -------------------------------------------------------

def test_empty_mesh_raises_value_error():
    from jax._src.mesh import empty_concrete_mesh

    for mesh in (empty_concrete_mesh, jax.sharding.AbstractMesh((), ()), Mesh((), ())):
        with pytest.raises(ValueError, match="requires a non-empty mesh"):
            refsim.shard_map(lambda a: a, mesh=mesh, in_specs=P(), out_specs=P())(np.ones(2))
    with pytest.raises(ValueError, match="context mesh is empty"):
        refsim.shard_map(lambda a: a, in_specs=P(), out_specs=P())(np.ones(2))


def test_pmap_in_axes_prefix_error_names_the_argument_as_jax_does():
    args = (np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"pmap in_axes\[0\]") as want:
        jax.pmap(lambda x, y: x + y, in_axes=((0,),))(*args)
    with pytest.raises(ValueError, match=r"pmap in_axes\[0\]") as got:
        refsim.pmap(lambda x, y: x + y, in_axes=((0,),))(*args)
    assert "different lengths of tuple" in str(want.value) and "different lengths of tuple" in str(got.value)


# --- item 8: Python control flow on a collective's result (eager shard_map) --------------------

def test_eager_shard_map_branches_on_invariant_collective_results():
    if compat.jax_version() < (0, 10):
        pytest.skip("jax 0.9's eager shard_map traces the body: no Python branch on a collective's result")
    mesh = Mesh((4,), ("x",))

    def eager_only(x):  # 0+1+2+3 = 6 > 0: the same Python value on every device
        return x * (1.0 if jax.lax.psum(jax.lax.axis_index("x"), "x") > 0 else -1.0)

    x = np.arange(4.0, dtype=np.float32)
    out = refsim.shard_map(eager_only, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    np.testing.assert_array_equal(np.asarray(out), x)
    assert out.info["independent"]

    def halve_until_small(x):  # a Python while loop on a pmax: 7 -> 3.5 -> 1.75 -> 0.875
        n = 0
        while jax.lax.pmax(x.max(), "x") > 1:
            x, n = x / 2, n + 1
        return jax.lax.psum(x, "x"), jnp.float32(n)

    total, n = refsim.shard_map(halve_until_small, mesh=mesh, in_specs=P("x"), out_specs=(P(), P()))(
        np.arange(8.0, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(n), 3.0)
    np.testing.assert_array_equal(np.asarray(total), np.array([12.0, 16.0]) / 8)  # [0+2+4+6, 1+3+5+7] / 8
    jmesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
    want = jax.shard_map(halve_until_small, mesh=jmesh, in_specs=JP("x"), out_specs=(JP(), JP()))(
        np.arange(8.0, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(total), np.asarray(want[0]))


def test_eager_shard_map_rejects_branching_on_a_device_varying_value():
    if compat.jax_version() < (0, 10):
        pytest.skip("jax 0.9's eager shard_map traces the body: every Python branch raises TracerBoolConversionError")
    mesh = Mesh((4,), ("x",))

    def bad(x):  # each device's sum differs: no single Python value (JAX raises the same)
        return x * (1.0 if x.sum() > 0 else -1.0)

    with pytest.raises(jax.errors.TracerBoolConversionError):
        refsim.shard_map(bad, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(np.arange(4.0, dtype=np.float32))


def _loop_programs():
    def ein(a, b):
        return jnp.einsum("ab,bc->ac", a, b, out_sharding=JP(unreduced={"x"}))

    def scan_carry(a, b):  # gradient-accumulation shape: an unreduced carry summed at the end
        c, _ = jax.lax.scan(lambda c, i: (c + ein(a * i, b), None), ein(a, b), jnp.arange(3.0))
        return c

    def while_carry(a, b):
        return jax.lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] + ein(a, b)),
                                  (0, ein(a, b)))[1]

    def scan_ys(a, b):
        return jax.lax.scan(lambda c, i: (c, ein(a * i, b)), 0.0, jnp.arange(1.0, 3.0))[1]

    def cond_operand(a, b):  # a replicated predicate choosing what to do with partial sums
        return jax.lax.cond(a.sum() > 0, lambda z: z + z + z, lambda z: z, ein(a, b))

    # by hand: the carried sums are (1 + 0 + 1 + 2) a@b and 4 a@b; the ys are [a@b, 2 a@b]
    return [(scan_carry, lambda m: 4 * m), (while_carry, lambda m: 4 * m),
            (scan_ys, lambda m: np.stack([m, 2 * m])), (cond_operand, lambda m: 3 * m)]


@pytest.mark.parametrize("k", range(4))
def test_unreduced_loop_carries_and_ys_keep_partial_sums(k):
    fn, by_hand = _loop_programs()[k]
    jmesh, rmesh = _explicit((2,), ("x",))
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.arange(24, dtype=np.float32).reshape(4, 6)
    in_sh = (NamedSharding(rmesh, P(None, "x")), NamedSharding(rmesh, P("x", None)))
    with jax.set_mesh(jmesh):
        ja, jb = jax.device_put(a, JP(None, "x")), jax.device_put(b, JP("x", None))
        want = jax.jit(fn)(ja, jb)
        want_total = np.asarray(jax.jit(lambda a, b: jax.reshard(fn(a, b), JP()))(ja, jb))
        got_total = np.asarray(refsim.jit(lambda a, b: jax.reshard(fn(a, b), JP()), in_shardings=in_sh)(a, b))
    got = refsim.jit(fn, in_shardings=in_sh)(a, b)
    w, g = _shards(want), _shards(got)
    assert w.keys() == g.keys()
    for d in w:  # each device's partial sum, as XLA holds it
        np.testing.assert_array_equal(g[d], w[d], err_msg=f"device {d}")
    np.testing.assert_array_equal(got_total, want_total)
    np.testing.assert_array_equal(got_total, by_hand(a @ b))
