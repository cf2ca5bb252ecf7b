"""refsim.stablehlo on hand-written modules: expected values computed by hand from the StableHLO spec."""
import numpy as np
import pytest

import refsim.stablehlo as sh

ALL_REDUCE = """
module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
    %0 = "stablehlo.all_reduce"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<2xf32>) -> tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
"""


def test_all_reduce_within_replica_groups():
    x = np.array([[1, 2], [10, 20], [100, 200], [1000, 2000]], np.float32)  # device d holds row d
    (out,) = sh.interpret(ALL_REDUCE, x, per_device=True)
    # groups {0,2} and {1,3}: 1+100, 10+1000
    np.testing.assert_array_equal(out, [[101, 202], [1010, 2020], [101, 202], [1010, 2020]])


PERMUTE = """
module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<i32>) -> (tensor<i32>, tensor<ui32>) {
    %0 = "stablehlo.collective_permute"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        source_target_pairs = dense<[[0, 2], [3, 1]]> : tensor<2x2xi64>}> : (tensor<i32>) -> tensor<i32>
    %1 = stablehlo.partition_id : tensor<ui32>
    return %0, %1 : tensor<i32>, tensor<ui32>
  }
}
"""


def test_collective_permute_zero_fills_non_targets_and_partition_id():
    x = np.array([5, 6, 7, 8], np.int32)
    out, pid = sh.interpret(PERMUTE, x, per_device=True)
    # 0 -> 2, 3 -> 1; devices 0 and 3 receive nothing: 0
    np.testing.assert_array_equal(out, [0, 8, 5, 0])
    np.testing.assert_array_equal(pid, [0, 1, 2, 3])


GATHER_LOOP = """
module @m attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1x2xf32>) -> (tensor<2x2xf32>, tensor<i32>) {
    %g = "stablehlo.all_gather"(%arg0) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>,
        replica_groups = dense<[[1, 0]]> : tensor<1x2xi64>, use_global_device_ids}> : (tensor<1x2xf32>) -> tensor<2x2xf32>
    %pid = stablehlo.partition_id : tensor<ui32>
    %lim = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %bound = stablehlo.add %lim, %c3 : tensor<i32>
    %r = stablehlo.while(%i = %c0) : tensor<i32>
      cond {
        %p = stablehlo.compare LT, %i, %bound : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %p : tensor<i1>
      } do {
        %n = stablehlo.add %i, %c1 : tensor<i32>
        stablehlo.return %n : tensor<i32>
      }
    return %g, %r : tensor<2x2xf32>, tensor<i32>
  }
}
"""


def test_all_gather_group_order_and_per_device_trip_count():
    x = np.array([[[1, 2]], [[3, 4]]], np.float32)
    g, r = sh.interpret(GATHER_LOOP, x, per_device=True)
    # the group lists device 1 first, so its block comes first on both devices
    np.testing.assert_array_equal(np.broadcast_to(g, (2, 2, 2)), [[[3, 4], [1, 2]], [[3, 4], [1, 2]]])
    # device p loops while i < p + 3
    np.testing.assert_array_equal(r, [3, 4])


MANUAL = """
module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=2]>
  func.func public @main(%arg0: tensor<4x2xf32>) -> tensor<2x2xf32> {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"x"}, {"y"}]>] out_shardings=[<@mesh, [{}, {"y"}]>]
        manual_axes={"x", "y"} (%a: tensor<2x1xf32>) {
      %1 = "stablehlo.all_reduce"(%a) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
          replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>, use_global_device_ids}> ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %m = stablehlo.maximum %p, %q : tensor<f32>
        stablehlo.return %m : tensor<f32>
      }) : (tensor<2x1xf32>) -> tensor<2x1xf32>
      sdy.return %1 : tensor<2x1xf32>
    } : (tensor<4x2xf32>) -> tensor<2x2xf32>
    return %0 : tensor<2x2xf32>
  }
}
"""


def test_manual_computation_splits_and_joins_like_shard_map():
    a = np.array([[1, 8], [7, 2], [5, 4], [3, 6]], np.float32)
    (out,) = sh.interpret(MANUAL, a)
    # pmax over x of the row blocks [[1,8],[7,2]] and [[5,4],[3,6]]: [[5,8],[7,6]], same on every device
    for d in range(out.shape[0]):
        np.testing.assert_array_equal(out[d], [[5, 8], [7, 6]])


def test_unsupported_op_is_named():
    text = """
module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @no_such_target(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""
    assert list(sh.coverage(text)) == ["stablehlo.custom_call @no_such_target"]
    with pytest.raises(sh.UnsupportedOp, match="no_such_target"):
        sh.interpret(text, np.zeros(4, np.float32))


def test_bad_argument_shape_names_the_argument():
    with pytest.raises(ValueError, match="argument 0 has shape"):
        sh.interpret(ALL_REDUCE, np.zeros((4, 3), np.float32), per_device=True)
