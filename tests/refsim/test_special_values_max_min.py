"""max / min on special values, as StableHLO's maximum / minimum (IEEE 754-2019) define them.

Every expected value is written out by hand from the spec: +0 > -0 whichever operand comes
first (so max of a -0 and a +0 is +0, sign bit 0, and min is -0, sign bit 1), and a NaN result is
a quiet NaN: a float32 signalling NaN 0x7f800001 comes back as 0x7fc00001 (quiet bit 0x00400000
set, sign and payload kept). Checked in every place refsim computes a max / min: the elementwise
kernel (lax.max / jnp.maximum), reduce_max / reduce_min, reduce_window, pmax / pmin (jaxpr front
end) and refsim.stablehlo's maximum, reduce, reduce_window, all_reduce and reduce_scatter.
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import refsim
import refsim.collectives as C
from refsim.collectives.reductions import all_reduce
import refsim.stablehlo as sh
from refsim import Mesh
from refsim.values import quiet_nan

SNAN = np.array([0x7F800001], np.uint32).view(np.float32)[0]   # signalling: quiet bit clear
QNAN_OF_SNAN = 0x7FC00001                                        # the same NaN, quiet bit set
M2 = Mesh((2,), ("i",))


def bits(x) -> list:
    return np.asarray(x, np.float32).reshape(-1).view(np.uint32).tolist()


# -- the helper ------------------------------------------------------------------------------------------
def test_quiet_nan_sets_the_quiet_bit_and_keeps_sign_payload_and_other_values():
    neg_snan = np.array([0xFF800005], np.uint32).view(np.float32)
    x = np.concatenate([[SNAN], neg_snan, np.float32([np.nan, 1.5, -0.0, np.inf])])
    assert bits(quiet_nan(x)) == [0x7FC00001, 0xFFC00005, 0x7FC00000, 0x3FC00000, 0x80000000, 0x7F800000]
    # bfloat16 sNaN 0x7f81 -> 0x7fc1; float8_e5m2 sNaN 0x7d -> 0x7f; e4m3fnuz's only NaN (0x80) stays
    assert quiet_nan(np.array([0x7F81], np.uint16).view(ml_dtypes.bfloat16)).view(np.uint16).tolist() == [0x7FC1]
    assert quiet_nan(np.array([0x7D], np.uint8).view(ml_dtypes.float8_e5m2)).view(np.uint8).tolist() == [0x7F]
    assert quiet_nan(np.array([0x80], np.uint8).view(ml_dtypes.float8_e4m3fnuz)).view(np.uint8).tolist() == [0x80]
    assert quiet_nan(np.array([1, 2], np.int32)).tolist() == [1, 2]


# -- jaxpr front end ------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [(-0.0, 0.0), (0.0, -0.0)])
def test_elementwise_max_min_order_zeros_in_either_operand_order(a, b):
    x, y = np.float32([a]), np.float32([b])
    assert bits(refsim.jit(jax.lax.max)(x, y)) == [0x00000000]
    assert bits(refsim.jit(jax.lax.min)(x, y)) == [0x80000000]


def test_elementwise_max_min_of_a_signalling_nan_is_quiet():
    one = np.float32([1.0])
    for fn in (jax.lax.max, jax.lax.min):
        assert bits(refsim.jit(fn)(np.float32([SNAN]), one)) == [QNAN_OF_SNAN]
        assert bits(refsim.jit(fn)(one, np.float32([SNAN]))) == [QNAN_OF_SNAN]


@pytest.mark.parametrize("data", [[-0.0, 0.0], [0.0, -0.0]])
def test_reduce_max_min_and_reduce_window_order_zeros(data):
    x = np.float32(data)
    assert bits(refsim.jit(jnp.max)(x)) == [0x00000000]
    assert bits(refsim.jit(jnp.min)(x)) == [0x80000000]
    window = lambda v: jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, (2,), (1,), "VALID")  # noqa: E731
    assert bits(refsim.jit(window)(x)) == [0x00000000]


def test_reduce_max_of_one_signalling_nan_is_quiet():
    # reduce applies maximum to the init (-inf) and the one element: a quiet NaN
    assert bits(refsim.jit(jnp.max)(np.float32([SNAN]))) == [QNAN_OF_SNAN]
    assert bits(refsim.jit(jnp.min)(np.float32([SNAN, 2.0]))) == [QNAN_OF_SNAN]


@pytest.mark.parametrize("data", [[-0.0, 0.0], [0.0, -0.0]])
def test_pmax_pmin_over_both_zeros_in_both_orders(data):
    x = np.float32(data)
    assert bits(C.pmax(x, "i", mesh=M2)) == [0x00000000]
    assert bits(C.pmin(x, "i", mesh=M2)) == [0x80000000]
    b = np.array(data, ml_dtypes.bfloat16)
    assert np.signbit(C.pmax(b, "i", mesh=M2).astype(np.float32)).tolist() == [False]
    assert np.signbit(C.pmin(b, "i", mesh=M2).astype(np.float32)).tolist() == [True]


def test_pmax_pmin_of_a_signalling_nan_is_quiet_and_positional_axes_too():
    for data in ([SNAN, 1.0], [1.0, SNAN]):
        assert bits(C.pmax(np.float32(data), "i", mesh=M2)) == [QNAN_OF_SNAN]
        assert bits(C.pmin(np.float32(data), "i", mesh=M2)) == [QNAN_OF_SNAN]
    # a positional axis (as vmap binds it) reduces the local dim with the same rule
    local = np.float32([[-0.0, 0.0], [0.0, -0.0]])          # (mesh dim 2, local dim 2)
    assert bits(all_reduce(local, mesh=M2, axes=(0,), op="max")) == [0, 0]
    assert bits(all_reduce(local, mesh=M2, axes=(0,), op="min")) == [0x80000000, 0x80000000]


# -- refsim.stablehlo ----------------------------------------------------------------------------------
_BODY = """({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.{op} %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }})"""


def _module(op: str) -> str:
    body = _BODY.format(op=op)
    return f"""
module @m attributes {{mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<2xf32>) -> (tensor<2xf32>, tensor<f32>, tensor<2xf32>, tensor<1xf32>, tensor<1xf32>) {{
    %init = stablehlo.constant dense<0x{'FF800000' if op == 'maximum' else '7F800000'}> : tensor<f32>
    %rev = stablehlo.reverse %arg0, dims = [0] : tensor<2xf32>
    %0 = stablehlo.{op} %arg0, %rev : tensor<2xf32>
    %1 = stablehlo.reduce(%arg0 init: %init) applies stablehlo.{op} across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
    %2 = "stablehlo.all_reduce"(%arg0) <{{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}}> {body} : (tensor<2xf32>) -> tensor<2xf32>
    %3 = "stablehlo.reduce_scatter"(%arg0) <{{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, scatter_dimension = 0 : i64, use_global_device_ids}}> {body} : (tensor<2xf32>) -> tensor<1xf32>
    %4 = "stablehlo.reduce_window"(%arg0, %init) <{{window_dimensions = array<i64: 2>}}> {body.replace('%a: tensor<f32>, %b: tensor<f32>', '%a: tensor<f32>, %b: tensor<f32>')} : (tensor<2xf32>, tensor<f32>) -> tensor<1xf32>
    return %0, %1, %2, %3, %4 : tensor<2xf32>, tensor<f32>, tensor<2xf32>, tensor<1xf32>, tensor<1xf32>
  }}
}}
"""


@pytest.mark.parametrize("op, zero_bits", [("maximum", 0x00000000), ("minimum", 0x80000000)])
def test_stablehlo_max_min_order_zeros_in_every_op(op, zero_bits):
    # device 0 holds [-0, +0], device 1 [+0, -0]: every max is +0 and every min -0, whatever the order
    x = np.float32([[-0.0, 0.0], [0.0, -0.0]])
    outs = sh.interpret(_module(op), x, per_device=True)
    for out in outs:
        assert set(bits(out)) == {zero_bits}, (op, out)


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_stablehlo_max_min_of_a_signalling_nan_is_quiet_in_every_op(op):
    x = np.float32([[SNAN, 1.0], [1.0, SNAN]])
    elementwise, reduced, all_reduced, scattered, windowed = sh.interpret(_module(op), x, per_device=True)
    for out in (elementwise, reduced, all_reduced, scattered, windowed):
        assert set(bits(out)) == {QNAN_OF_SNAN}, (op, out)
