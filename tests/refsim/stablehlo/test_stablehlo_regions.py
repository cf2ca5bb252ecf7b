"""refsim.stablehlo runs any region: reduction bodies other than add, comparators, update
computations. Modules are written by hand; expected values come from naive NumPy loops that
follow the StableHLO spec's definition of each op."""
import numpy as np

import refsim.stablehlo as sh

HEAD = 'module @m attributes {mhlo.num_partitions = %d : i32, mhlo.num_replicas = 1 : i32} {\n'


def _body(op: str, t: str = "f32") -> str:
    return (f"    ^bb0(%a: tensor<{t}>, %b: tensor<{t}>):\n      %s = {op} %a, %b : tensor<{t}>\n"
            f"      stablehlo.return %s : tensor<{t}>\n")


def _all_reduce(op: str, t: str = "f32") -> str:
    return HEAD % 4 + f"""  func.func public @main(%arg0: tensor<3x{t}>) -> tensor<3x{t}> {{
    %0 = "stablehlo.all_reduce"(%arg0) <{{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[0, 2], [3, 1]]> : tensor<2x2xi64>, use_global_device_ids}}> ({{
{_body(op, t)}    }}) : (tensor<3x{t}>) -> tensor<3x{t}>
    return %0 : tensor<3x{t}>
  }}
}}
"""


X4 = np.array([[1, -2, 3], [4, 5, -6], [-7, 8, 9], [10, -11, 12]], np.float32)


def _naive_group_fold(x, groups, fn):
    out = np.empty_like(x)
    for g in groups:
        acc = x[g[0]]
        for d in g[1:]:
            acc = fn(acc, x[d])
        for d in g:
            out[d] = acc
    return out


def test_all_reduce_multiply_body():
    (out,) = sh.interpret(_all_reduce("stablehlo.multiply"), X4, per_device=True)
    np.testing.assert_array_equal(out, _naive_group_fold(X4, [[0, 2], [3, 1]], np.multiply))


def test_all_reduce_xor_body_on_integers():
    x = np.array([[1, 2, 3], [12, 5, 6], [7, 8, 9], [10, 11, 15]], np.int32)
    (out,) = sh.interpret(_all_reduce("stablehlo.xor", "i32"), x, per_device=True)
    np.testing.assert_array_equal(out, _naive_group_fold(x, [[0, 2], [3, 1]], np.bitwise_xor))


def test_all_reduce_general_body_is_interpreted_in_group_order():
    # a body that is no single op: a - 2b (not associative: the group order shows)
    body = ("    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n      %two = stablehlo.constant dense<2.0> : tensor<f32>\n"
            "      %t = stablehlo.multiply %b, %two : tensor<f32>\n      %s = stablehlo.subtract %a, %t : tensor<f32>\n"
            "      stablehlo.return %s : tensor<f32>\n")
    text = _all_reduce("stablehlo.add").replace(_body("stablehlo.add"), body)
    (out,) = sh.interpret(text, X4, per_device=True)
    np.testing.assert_array_equal(out, _naive_group_fold(X4, [[0, 2], [3, 1]], lambda a, b: a - 2 * b))


REDUCE_SCATTER_MAX = HEAD % 4 + """  func.func public @main(%arg0: tensor<4x2xf32>) -> tensor<1x2xf32> {
    %0 = "stablehlo.reduce_scatter"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
        replica_groups = dense<[[3, 1, 0, 2]]> : tensor<1x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
""" + _body("stablehlo.maximum") + """    }) : (tensor<4x2xf32>) -> tensor<1x2xf32>
    return %0 : tensor<1x2xf32>
  }
}
"""


def test_reduce_scatter_with_a_max_body_keeps_the_block_of_each_group_position():
    x = np.random.default_rng(0).standard_normal((4, 4, 2)).astype(np.float32)
    (out,) = sh.interpret(REDUCE_SCATTER_MAX, x, per_device=True)
    total = x.max(axis=0)
    group = [3, 1, 0, 2]
    for d in range(4):
        j = group.index(d)
        np.testing.assert_array_equal(out[d], total[j:j + 1])


SORT_DESC_TWO_KEYS = HEAD % 1 + """  func.func public @main(%k0: tensor<6xi32>, %k1: tensor<6xf32>) -> (tensor<6xi32>, tensor<6xf32>) {
    %0:2 = "stablehlo.sort"(%k0, %k1) <{dimension = 0 : i64, is_stable = true}> ({
    ^bb0(%a0: tensor<i32>, %b0: tensor<i32>, %a1: tensor<f32>, %b1: tensor<f32>):
      %gt = stablehlo.compare GT, %a0, %b0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %eq = stablehlo.compare EQ, %a0, %b0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %lt1 = stablehlo.compare LT, %a1, %b1, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %tie = stablehlo.and %eq, %lt1 : tensor<i1>
      %r = stablehlo.or %gt, %tie : tensor<i1>
      stablehlo.return %r : tensor<i1>
    }) : (tensor<6xi32>, tensor<6xf32>) -> (tensor<6xi32>, tensor<6xf32>)
    return %0#0, %0#1 : tensor<6xi32>, tensor<6xf32>
  }
}
"""


def test_sort_by_a_two_key_comparator_descending_then_ascending():
    k0 = np.array([2, 5, 2, 5, 1, 2], np.int32)
    k1 = np.array([0.5, -1.0, -3.0, 4.0, 9.0, 0.5], np.float32)
    a, b = sh.interpret(SORT_DESC_TWO_KEYS, k0, k1)
    # naive: stable sort by (-k0, k1)
    order = sorted(range(6), key=lambda i: (-k0[i], k1[i]))
    np.testing.assert_array_equal(a[0], k0[order])
    np.testing.assert_array_equal(b[0], k1[order])


SCATTER_GENERAL = HEAD % 1 + """  func.func public @main(%x: tensor<5xf32>, %i: tensor<4x1xi32>, %u: tensor<4xf32>) -> tensor<5xf32> {
    %0 = "stablehlo.scatter"(%x, %i, %u) <{indices_are_sorted = false, scatter_dimension_numbers =
        #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>,
        unique_indices = false}> ({
    ^bb0(%old: tensor<f32>, %new: tensor<f32>):
      %two = stablehlo.constant dense<2.0> : tensor<f32>
      %t = stablehlo.multiply %old, %two : tensor<f32>
      %r = stablehlo.add %t, %new : tensor<f32>
      stablehlo.return %r : tensor<f32>
    }) : (tensor<5xf32>, tensor<4x1xi32>, tensor<4xf32>) -> tensor<5xf32>
    return %0 : tensor<5xf32>
  }
}
"""


def test_scatter_with_a_general_update_computation_in_update_order_and_out_of_bounds_skipped():
    x = np.array([1, 2, 3, 4, 5], np.float32)
    idx = np.array([[1], [3], [1], [7]], np.int32)          # index 7 is out of bounds: skipped
    upd = np.array([10, 20, 30, 40], np.float32)
    (out,) = sh.interpret(SCATTER_GENERAL, x, idx, upd)
    want = x.copy()
    for k, (i,) in enumerate(idx):
        if 0 <= i < 5:
            want[i] = want[i] * 2 + upd[k]
    np.testing.assert_array_equal(out[0], want)


REDUCE_WINDOW_GENERAL = HEAD % 1 + """  func.func public @main(%x: tensor<6xf32>) -> tensor<3xf32> {
    %init = stablehlo.constant dense<1.0> : tensor<f32>
    %0 = "stablehlo.reduce_window"(%x, %init) <{window_dimensions = array<i64: 3>, window_strides = array<i64: 2>,
        padding = dense<[[1, 0]]> : tensor<1x2xi64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %m = stablehlo.multiply %a, %b : tensor<f32>
      %r = stablehlo.add %m, %a : tensor<f32>
      stablehlo.return %r : tensor<f32>
    }) : (tensor<6xf32>, tensor<f32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""


def test_reduce_window_with_a_general_body_folds_the_taps_in_order_from_init():
    x = np.array([2, -1, 3, 0.5, 4, -2], np.float32)
    (out,) = sh.interpret(REDUCE_WINDOW_GENERAL, x)
    padded = np.concatenate([[1.0], x]).astype(np.float32)   # padding with the init value
    want = []
    for start in (0, 2, 4):
        acc = np.float32(1.0)
        for t in padded[start:start + 3]:
            acc = acc * t + acc
        want.append(acc)
    np.testing.assert_array_equal(out[0], np.array(want, np.float32))


SELECT_AND_SCATTER = HEAD % 1 + """  func.func public @main(%x: tensor<6xf32>, %s: tensor<3xf32>) -> tensor<6xf32> {
    %init = stablehlo.constant dense<0.5> : tensor<f32>
    %0 = "stablehlo.select_and_scatter"(%x, %s, %init) <{window_dimensions = array<i64: 2>,
        window_strides = array<i64: 2>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %p = stablehlo.compare LE, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    }, {
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %m = stablehlo.multiply %a, %b : tensor<f32>
      stablehlo.return %m : tensor<f32>
    }) : (tensor<6xf32>, tensor<3xf32>, tensor<f32>) -> tensor<6xf32>
    return %0 : tensor<6xf32>
  }
}
"""


def test_select_and_scatter_min_select_and_multiply_scatter():
    x = np.array([3, 1, 2, 2, 9, 4], np.float32)
    s = np.array([10, 20, 30], np.float32)
    (out,) = sh.interpret(SELECT_AND_SCATTER, x, s)
    want = np.full(6, 0.5, np.float32)
    for w in range(3):
        a, b = 2 * w, 2 * w + 1
        pick = a if x[a] <= x[b] else b           # select keeps the current element while it holds
        want[pick] = want[pick] * s[w]
    np.testing.assert_array_equal(out[0], want)


def test_coverage_cli_names_a_missing_op(tmp_path, capsys):
    from refsim.stablehlo.__main__ import main

    good = tmp_path / "good.mlir"
    good.write_text(_all_reduce("stablehlo.multiply"))
    assert main(["coverage", str(good)]) == 0
    assert "(100.0%)" in capsys.readouterr().out
    bad = tmp_path / "bad.mlir"
    bad.write_text(HEAD % 1 + """  func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {
    %0 = stablehlo.custom_call @no_such_target(%x) : (tensor<2xf32>) -> tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
""")
    assert main(["coverage", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "missing stablehlo.custom_call @no_such_target" in out and str(bad) in out
