"""Realistic distributed programs, each run by refsim and by XLA on the 8 CPU devices and compared
device by device (`conformance.verdict.compare`): same device ids, indices, shapes, dtypes, and
bit-identical values — or, for programs using transcendentals, within the ulp bound refsim's
accuracy contract states for them (`refsim.interpreter.accuracy.ulp_bound`).

The programs are the patterns JAX's own shard_map / pmap tests and real training code use:
FSDP and tensor-parallel matmuls with `jit` + NamedSharding, a pipeline-stage loop with
`ppermute`, `shard_map` over some axes of the mesh (partial manual), unreduced / reduced
values, `scan` with collectives, PRNG inside `shard_map`, and a transformer-style block.
Inputs are small integers (exact-friendly) unless a program says otherwise.
"""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as JP

import refsim
import xla_backend
from conformance.verdict.compare import compare
from refsim import NamedSharding, P
from refsim.interpreter.accuracy import ulp_bound


def _ints(rng, shape, lo=-3, hi=4):
    return rng.integers(lo, hi, shape).astype(np.float32)


def _check(ref_out, xla_out, **kw):
    res = compare(ref_out, xla_out, **kw)
    assert res.ok, res.report()


@pytest.fixture(scope="module")
def mesh24():
    return xla_backend.mesh((2, 4), ("x", "y"))


def test_fsdp_and_tensor_parallel_matmuls_with_named_shardings(mesh24):
    rng = np.random.default_rng(0)
    x, w1, w2 = _ints(rng, (8, 16)), _ints(rng, (16, 32)), _ints(rng, (32, 16))

    def mlp(x, w1, w2):  # weights FSDP-sharded over x, tensor-parallel over y
        h = jax.nn.relu(x @ w1)
        return h @ w2

    sh = (NamedSharding(mesh24, P("x", None)), NamedSharding(mesh24, P("x", "y")),
          NamedSharding(mesh24, P("y", "x")))
    out_sh = NamedSharding(mesh24, P("x", None))
    _check(refsim.jit(mlp, in_shardings=sh, out_shardings=out_sh)(x, w1, w2),
           xla_backend.jit(mlp, in_shardings=sh, out_shardings=out_sh)(x, w1, w2))


def test_megatron_mlp_in_shard_map(mesh24):
    rng = np.random.default_rng(1)
    x, w1, w2 = _ints(rng, (8, 16)), _ints(rng, (16, 32)), _ints(rng, (32, 16))

    def block(x, w1, w2):  # column-parallel then row-parallel, reduce-scattered over y
        h = jax.nn.relu(x @ w1)
        return jax.lax.psum_scatter(h @ w2, "y", scatter_dimension=1, tiled=True)

    specs = dict(in_specs=(P("x", None), P(None, "y"), P("y", None)), out_specs=P("x", "y"))
    _check(refsim.shard_map(block, mesh=mesh24, **specs)(x, w1, w2),
           xla_backend.shard_map(block, mesh=mesh24, **specs)(x, w1, w2))


def test_pipeline_stage_loop_with_ppermute():
    mesh = xla_backend.mesh((4,), ("pp",))
    rng = np.random.default_rng(2)
    n_stages, n_micro = 4, 6
    w = _ints(rng, (n_stages, 8, 8), -1, 2)
    xs = _ints(rng, (n_micro, 2, 8), -1, 2)

    def pipeline(w, xs):  # GPipe: each step every stage works on its microbatch, then passes it on
        w = w[0]
        stage = jax.lax.axis_index("pp")
        perm = [(i, (i + 1) % n_stages) for i in range(n_stages)]

        def step(carry, t):
            state, outs = carry
            inp = jnp.where(stage == 0, xs[jnp.minimum(t, n_micro - 1)], state)
            y = jnp.clip(inp @ w, -8.0, 8.0)
            done = t - (n_stages - 1)
            outs = jnp.where((stage == n_stages - 1) & (done >= 0),
                             outs.at[jnp.clip(done, 0, n_micro - 1)].set(y), outs)
            return (jax.lax.ppermute(y, "pp", perm), outs), None

        init = (jnp.zeros((2, 8), jnp.float32), jnp.zeros((n_micro, 2, 8), jnp.float32))
        init = jax.tree_util.tree_map(lambda a: a + 0 * w[0, 0], init)  # device-varying carries
        (_, outs), _ = jax.lax.scan(step, init, jnp.arange(n_micro + n_stages - 1))
        return jax.lax.psum(outs, "pp")  # only the last stage holds them

    specs = dict(in_specs=(P("pp"), P()), out_specs=P())
    ref = refsim.shard_map(pipeline, mesh=mesh, **specs)(w, xs)
    _check(ref, xla_backend.shard_map(pipeline, mesh=mesh, **specs)(w, xs))
    # and by hand: microbatch m passes through the four stages in order
    want = xs
    for k in range(n_stages):
        want = np.clip(want @ w[k], -8.0, 8.0)
    np.testing.assert_array_equal(np.asarray(ref), want)


def test_partial_manual_shard_map_inside_jit(mesh24):
    rng = np.random.default_rng(3)
    x = _ints(rng, (8, 8))

    def f(x):
        def body(v):  # manual over x only; y stays automatic inside
            v = jax.lax.with_sharding_constraint(v * 2, JP(None, "y"))
            return jax.lax.psum(v.sum(0, keepdims=True), "x")
        return jax.shard_map(body, in_specs=JP("x", None), out_specs=JP(None, None), axis_names={"x"})(x)

    sh = NamedSharding(mesh24, P("x", "y"))
    out = NamedSharding(mesh24, P())
    _check(refsim.jit(f, in_shardings=sh, out_shardings=out)(x),
           xla_backend.jit(f, in_shardings=sh, out_shardings=out)(x))


def test_unreduced_and_reduced_types():
    mesh = xla_backend.mesh((2, 4), ("x", "y"), axis_types=("Explicit", "Explicit"))
    rng = np.random.default_rng(4)
    v, a, b = _ints(rng, (8, 16), -2, 3), _ints(rng, (8, 16), -2, 3), _ints(rng, (16, 8), -2, 3)

    @jax.shard_map(out_specs=JP(reduced={"y"}))
    def loss(values):  # gathered to a reduced value: its cotangent comes back unreduced over y
        gathered = jax.lax.all_gather(values, "y", axis=1, tiled=True, to="reduced")
        return jax.lax.psum(jnp.sum(gathered * gathered), "x")

    def step(v, a, b):
        # a matmul left unreduced over the contracted axis y, then summed by a reshard
        partial = jnp.einsum("bd,df->bf", a, b, out_sharding=JP("x", None, unreduced={"y"}))
        # (the unreduced value itself stays inside: xla_backend cannot yet copy unreduced shards
        # off devices; tests/refsim/interpreter/test_interpreter_jax_suite_defects.py compares those with jax directly)
        return loss(v), jax.grad(loss)(v), jax.sharding.reshard(partial, JP("x", None))

    sh = (NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P("y", None)))
    ref = refsim.jit(step, in_shardings=sh)(v, a, b)
    _check(ref, xla_backend.jit(step, in_shardings=sh)(v, a, b))
    # by hand: the loss is the sum of squares, its gradient 2 v; the reshard is a @ b
    np.testing.assert_array_equal(np.asarray(ref[0]), (v * v).sum())
    np.testing.assert_array_equal(np.asarray(ref[1]), 2 * v)
    np.testing.assert_array_equal(np.asarray(ref[2]), a @ b)


def test_scan_over_layers_with_collectives(mesh24):
    rng = np.random.default_rng(5)
    ws, x = _ints(rng, (3, 8, 8), -1, 2), _ints(rng, (8, 8), -1, 2)

    def layers(ws, x):  # data-parallel over x, each layer's weights sharded over y
        def layer(h, w):
            full = jax.lax.all_gather(w, "y", axis=1, tiled=True)
            h = jnp.clip(h @ full, -4.0, 4.0)
            return h, jax.lax.pmax(h.max(), ("x", "y"))
        return jax.lax.scan(layer, jax.lax.pcast(x, "y", to="varying"), ws)

    specs = dict(in_specs=(P(None, None, "y"), P("x", None)), out_specs=(P("x", "y"), P()))
    _check(refsim.shard_map(layers, mesh=mesh24, **specs)(ws, x),
           xla_backend.shard_map(layers, mesh=mesh24, **specs)(ws, x))


def test_prng_inside_shard_map_gives_each_device_its_own_stream(mesh24):
    def dropout(x, seed):
        key = jax.random.fold_in(jax.random.key(seed[0]), jax.lax.axis_index("x") * 4 + jax.lax.axis_index("y"))
        keep = jax.random.bernoulli(key, 0.5, x.shape)
        bits = jax.random.bits(jax.random.split(key)[1], (2,), jnp.uint32)
        return jnp.where(keep, x * 2, 0.0), bits[None]

    x = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    seed = np.array([7], np.int32)
    specs = dict(in_specs=(P("x", "y"), P()), out_specs=(P("x", "y"), P(("x", "y"))))
    _check(refsim.shard_map(dropout, mesh=mesh24, **specs)(x, seed),
           xla_backend.shard_map(dropout, mesh=mesh24, **specs)(x, seed))


def test_attention_block_within_the_stated_ulp_bounds(mesh24):
    rng = np.random.default_rng(6)
    # q, k in eighths: the score matmul is exact; v >= 0: no cancellation in p @ v, so the only
    # differences are exp / tanh (softmax, gelu) and the rounding of the softmax sum
    q, k = (rng.integers(-4, 5, (8, 4, 16)).astype(np.float32) / 8 for _ in range(2))
    v = rng.integers(0, 4, (8, 4, 16)).astype(np.float32) / 8

    def attention(q, k, v):  # heads sharded over y
        s = jnp.einsum("bhd,chd->hbc", q, k)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("hbc,chd->bhd", p, v)
        return jax.nn.gelu(o, approximate=True)

    sh = NamedSharding(mesh24, P(None, "y", None))
    ref = refsim.jit(attention, in_shardings=(sh, sh, sh), out_shardings=sh)(q, k, v)
    xla = xla_backend.jit(attention, in_shardings=(sh, sh, sh), out_shardings=sh)(q, k, v)
    # exp's bound, then a sum of 8 terms and division (a few ulp), then tanh's bound
    bound = ulp_bound("exp") + 8 + ulp_bound("tanh")
    _check(ref, xla, ulp=4 * bound)
