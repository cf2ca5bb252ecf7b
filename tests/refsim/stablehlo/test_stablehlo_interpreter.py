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


REDUCE_SCATTER_A2A = """
module @m attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<2xf32>, tensor<4xf32>) {
    %0 = "stablehlo.reduce_scatter"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4xf32>) -> tensor<2xf32>
    %1 = "stablehlo.all_to_all"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>,
        concat_dimension = 0 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, split_count = 2 : i64,
        split_dimension = 0 : i64}> : (tensor<4xf32>) -> tensor<4xf32>
    return %0, %1 : tensor<2xf32>, tensor<4xf32>
  }
}
"""


def test_reduce_scatter_and_all_to_all_blocks():
    x = np.array([[1, 2, 3, 4], [10, 20, 30, 40]], np.float32)
    rs, a2a = sh.interpret(REDUCE_SCATTER_A2A, x, per_device=True)
    # sum [11, 22, 33, 44]: device 0 keeps block 0, device 1 block 1
    np.testing.assert_array_equal(rs, [[11, 22], [33, 44]])
    # device j receives block j of every sender, in sender order
    np.testing.assert_array_equal(a2a, [[1, 2, 10, 20], [3, 4, 30, 40]])


CASE_ARGMAX_CUMSUM = """
module @m attributes {mhlo.num_partitions = 3 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<f32>, tensor<i32>, tensor<4xf32>) {
    %pid = stablehlo.partition_id : tensor<ui32>
    %idx = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
    %r = "stablehlo.case"(%idx) ({
      %c = stablehlo.constant dense<1.0> : tensor<f32>
      stablehlo.return %c : tensor<f32>
    }, {
      %c = stablehlo.constant dense<2.0> : tensor<f32>
      stablehlo.return %c : tensor<f32>
    }) : (tensor<i32>) -> tensor<f32>
    %iota = stablehlo.iota dim = 0 : tensor<4xi32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %z = stablehlo.constant dense<0> : tensor<i32>
    %m:2 = stablehlo.reduce(%arg0 init: %ninf), (%iota init: %z) across dimensions = [0] : (tensor<4xf32>, tensor<4xi32>, tensor<f32>, tensor<i32>) -> (tensor<f32>, tensor<i32>)
      reducer(%a: tensor<f32>, %c: tensor<f32>) (%b: tensor<i32>, %d: tensor<i32>) {
        %gt = stablehlo.compare GT, %c, %a : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %v = stablehlo.select %gt, %c, %a : tensor<i1>, tensor<f32>
        %i = stablehlo.select %gt, %d, %b : tensor<i1>, tensor<i32>
        stablehlo.return %v, %i : tensor<f32>, tensor<i32>
      }
    %zf = stablehlo.constant dense<0.0> : tensor<f32>
    %cs = "stablehlo.reduce_window"(%arg0, %zf) <{padding = dense<[[3, 0]]> : tensor<1x2xi64>, window_dimensions = array<i64: 4>}> ({
    ^bb0(%p: tensor<f32>, %q: tensor<f32>):
      %s = stablehlo.add %p, %q : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
    return %r, %m#1, %cs : tensor<f32>, tensor<i32>, tensor<4xf32>
  }
}
"""


def test_case_per_device_variadic_reduce_and_reduce_window():
    x = np.array([[1, 5, 2, 5], [9, 0, 0, 1], [0, 0, 7, 3]], np.float32)
    r, argmax, cumsum = sh.interpret(CASE_ARGMAX_CUMSUM, x, per_device=True)
    # partition 2 is out of range for 2 branches: StableHLO case runs the last branch
    np.testing.assert_array_equal(r, [1, 2, 2])
    # the first maximum wins (strict GT), per device
    np.testing.assert_array_equal(argmax, [1, 0, 2])
    np.testing.assert_array_equal(cumsum, np.cumsum(x, axis=1))


def test_hlo_text_mesh_groups_become_explicit_device_lists():
    from refsim.stablehlo.hlo_text import explicit_groups, reduction_types_match_operands

    line = "x = f32[8] all-reduce(y), replica_groups=mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'a'}, to_apply=%r"
    # device ids over the (a, b) mesh are iota(8).reshape(2, 4).T.reshape(2, 4) = [[0, 4, 1, 5], [2, 6, 3, 7]];
    # groups vary a with b fixed
    assert "replica_groups={{0,2},{4,6},{1,3},{5,7}}," in explicit_groups(line)
    assert "replica_groups={{0},{1}}" in explicit_groups("replica_groups=mesh['a'=2]")
    text = ("%r (p: f8e5m2[], q: f8e5m2[]) -> f8e5m2[] {\n  ROOT %s = f8e5m2[] add(%p, %q)\n}\n"
            "ENTRY %main (x: f16[2]) -> f16[2] {\n  ROOT %ar = f16[2]{0} all-reduce(%x), to_apply=%r\n}\n")
    fixed = reduction_types_match_operands(text)
    assert "%r (p: f16[], q: f16[]) -> f16[] {\n  ROOT %s = f16[] add(%p, %q)" in fixed
    assert fixed.endswith("ROOT %ar = f16[2]{0} all-reduce(%x), to_apply=%r\n}\n")
