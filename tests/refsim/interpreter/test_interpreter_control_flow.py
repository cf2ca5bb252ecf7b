"""Control flow inside manual regions: per-device branches and trip counts, loops with collectives."""
from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

import refsim
from refsim import Mesh, P

MESH8 = Mesh((8,), ("i",))


def test_cond_with_per_device_predicate_takes_each_devices_branch():
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    f = lambda v: lax.cond(lax.axis_index("i") < 3, lambda a: a * 10, lambda a: -a, v)  # noqa: E731
    out = refsim.shard_map(f, mesh=MESH8, in_specs=P("i"), out_specs=P("i"))(x)
    np.testing.assert_array_equal(np.asarray(out)[:, 0], [0, 10, 20, -3, -4, -5, -6, -7])


def test_switch_clamps_index_like_xla():
    x = np.ones((8, 1), np.int32)
    f = lambda v: lax.switch(lax.axis_index("i") - 2, [lambda a: a, lambda a: a * 2, lambda a: a * 3], v)  # noqa: E731
    out = refsim.shard_map(f, mesh=MESH8, in_specs=P("i"), out_specs=P("i"))(x)
    # lax.switch clamps to [0, 2]: devices 0..2 -> branch 0, 3 -> branch 1, 4..7 -> branch 2.
    np.testing.assert_array_equal(np.asarray(out)[:, 0], [1, 1, 1, 2, 3, 3, 3, 3])


def test_while_runs_each_device_its_own_trip_count():
    x = np.zeros((8, 1), np.int32)

    def f(v):
        n = lax.axis_index("i")
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 2), (0, v))[1]

    out = refsim.shard_map(f, mesh=MESH8, in_specs=P("i"), out_specs=P("i"), check_vma=False)(x)
    np.testing.assert_array_equal(np.asarray(out)[:, 0], 2 * np.arange(8))


def test_scan_with_psum_carry_and_reverse_ys():
    xs = np.arange(3 * 8, dtype=np.float32).reshape(3, 8)

    def f(x):
        return lax.scan(lambda c, r: (c + lax.psum(r, "i"), c), jnp.zeros((1,), jnp.float32), x, reverse=True)

    carry, ys = refsim.shard_map(f, mesh=MESH8, in_specs=P(None, "i"), out_specs=(P(), P()))(xs)
    row_sums = xs.sum(1)  # psum over 8 devices of one element each = row sum
    np.testing.assert_array_equal(np.asarray(carry), [row_sums.sum()])
    # reverse scan: step t sees the carry accumulated from rows t+1..2
    np.testing.assert_array_equal(np.asarray(ys)[:, 0], [row_sums[1:].sum(), row_sums[2:].sum(), 0])


def test_fori_loop_with_axis_index_and_ppermute():
    x = np.zeros((8, 1), np.int32)
    perm = [(j, (j + 1) % 8) for j in range(8)]
    f = lambda v: lax.fori_loop(0, 3, lambda k, c: lax.ppermute(c + lax.axis_index("i"), "i", perm), v)  # noqa: E731
    out = np.asarray(refsim.shard_map(f, mesh=MESH8, in_specs=P("i"), out_specs=P("i"))(x))[:, 0]
    # after 3 steps device d holds (d-1) + (d-2) + (d-3) mod 8, each term the sender's index
    expect = [sum((d - k) % 8 for k in (1, 2, 3)) for d in range(8)]
    np.testing.assert_array_equal(out, expect)


def test_platform_dependent_runs_the_cpu_branch():
    f = lambda x: lax.platform_dependent(x, cpu=lambda v: v + 1, default=lambda v: v - 1)  # noqa: E731
    out = refsim.jit(f)(np.float32(1.0))
    np.testing.assert_array_equal(np.asarray(out), 2.0)


def test_custom_linear_solve_checkpoint_and_barrier_in_jit():
    a = np.diag([2.0, 4.0]).astype(np.float32)
    b = np.array([2.0, 8.0], np.float32)

    def f(b):
        matvec = lambda x: a @ x  # noqa: E731
        x = lax.custom_linear_solve(matvec, b, solve=lambda mv, r: r / jnp.diag(a))
        y, z = lax.optimization_barrier((x, jax.checkpoint(lambda v: v * 2)(x)))
        return y + z

    np.testing.assert_array_equal(np.asarray(refsim.jit(f)(b)), [3.0, 6.0])
