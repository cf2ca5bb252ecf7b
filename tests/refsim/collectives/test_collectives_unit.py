"""Hand-computed unit tests of refsim.collectives (values from JAX's docstrings or by hand)."""
import ml_dtypes
import numpy as np
import pytest

import refsim.collectives as C
from refsim import AbstractMesh, Mesh
from refsim.collectives import vma
from refsim.collectives.groups import device_groups, replica_groups
from refsim.interpreter.registry import Context, lookup

M4 = Mesh((4,), ("i",))
M24 = Mesh((2, 4), ("x", "y"))


def full(x, mesh):
    x = np.asarray(x)
    return np.broadcast_to(x, mesh.axis_sizes + x.shape[mesh.ndim:])


# ---- groups -----------------------------------------------------------------------------------

def test_device_groups_linear_index_in_given_order():
    m = Mesh((2, 3), ("x", "y"))
    assert device_groups(m, ("x", "y")).tolist() == [[0, 1, 2, 3, 4, 5]]
    assert device_groups(m, "y", [[2, 0], [1]]) is not None
    assert replica_groups(m, "x") == [[0, 3], [1, 4], [2, 5]]
    assert replica_groups(m, ("y", "x")) == [[0, 3, 1, 4, 2, 5]]
    assert replica_groups(m, "y", [[0, 2], [1]]) == [[0, 2], [1], [3, 5], [4]]


@pytest.mark.parametrize("groups", [[[0, 1]], [[0, 1], [1, 2, 3]], [[0, 1], [2, 4]]])
def test_groups_must_cover_exactly_once(groups):
    with pytest.raises(ValueError, match="axis_index_groups must cover all indices exactly once"):
        C.psum(np.arange(4), "i", axis_index_groups=groups, mesh=M4)


def test_unknown_axis_is_name_error():
    with pytest.raises(NameError, match="unbound axis name: 'z'"):
        C.psum(np.arange(4), "z", mesh=M4)
    with pytest.raises(NameError, match="'q'"):
        C.axis_index(("i", "q"), mesh=M4)


def test_gather_needs_equal_groups():
    with pytest.raises(ValueError, match="same size"):
        C.all_gather(np.arange(4), "i", axis_index_groups=[[0], [1, 2, 3]], mesh=M4)


# ---- reductions -------------------------------------------------------------------------------

def test_psum_docstring_examples():
    x = np.arange(4)
    assert C.psum(x, "i", mesh=M4).tolist() == [6]
    assert C.psum(x, "i", axis_index_groups=[[0, 1], [2, 3]], mesh=M4).tolist() == [1, 1, 5, 5]
    x2 = np.arange(16).reshape(4, 4)
    assert C.psum(x2, "i", mesh=M4).tolist() == [[24, 28, 32, 36]]
    assert C.psum(x2, "i", axis_index_groups=[[0, 1], [2, 3]], mesh=M4).tolist() == [
        [4, 6, 8, 10], [4, 6, 8, 10], [20, 22, 24, 26], [20, 22, 24, 26]]


def test_psum_groups_strided_shuffled_singleton_unequal():
    x = np.array([1, 10, 100, 1000])
    assert C.psum(x, "i", axis_index_groups=[[0, 2], [1, 3]], mesh=M4).tolist() == [101, 1010, 101, 1010]
    assert C.psum(x, "i", axis_index_groups=[[3, 0], [2, 1]], mesh=M4).tolist() == [1001, 110, 110, 1001]
    assert C.psum(x, "i", axis_index_groups=[[0], [1], [2], [3]], mesh=M4).tolist() == [1, 10, 100, 1000]
    assert C.psum(x, "i", axis_index_groups=[[0], [1, 2, 3]], mesh=M4).tolist() == [1, 1110, 1110, 1110]


def test_psum_tuple_axes_in_and_out_of_mesh_order():
    x = np.arange(8).reshape(2, 4)
    assert C.psum(x, ("x", "y"), mesh=M24).tolist() == [[28]]
    assert C.psum(x, ("y", "x"), mesh=M24).tolist() == [[28]]
    assert C.psum(x, "y", mesh=M24).tolist() == [[6], [22]]
    assert C.psum(x, "x", mesh=M24).tolist() == [[4, 6, 8, 10]]
    # groups index the linear order of the axes as given: ('y', 'x') index = 2*y + x
    got = C.psum(x, ("y", "x"), axis_index_groups=[[0, 1], [2, 3], [4, 5], [6, 7]], mesh=M24)
    assert got.tolist() == [[4, 6, 8, 10], [4, 6, 8, 10]]


def test_psum_bool_int_wrap_nan_and_invariant_input():
    assert C.psum(np.array([True, True, False, True]), "i", mesh=M4).dtype == np.int32
    assert C.psum(np.array([True, True, False, True]), "i", mesh=M4).tolist() == [3]
    assert C.psum(np.array([100, 100, 0, 1], np.int8), "i", mesh=M4).tolist() == [-55]
    assert C.psum(np.array([4294967295, 2, 0, 0], np.uint32), "i", mesh=M4).tolist() == [1]
    assert np.isnan(C.psum(np.array([1.0, np.nan, 2.0, 3.0]), "i", mesh=M4)).all()
    # invariant over 'i' (size-1 mesh dim): every device contributes the same value
    assert C.psum(np.array([2.5]), "i", mesh=M4).tolist() == [10.0]
    v = np.array([[1.0, 2.0, 3.0, 4.0]])  # invariant over 'x' (size-1 dim), varying over 'y'
    assert C.psum(v, "x", mesh=M24).tolist() == [[2.0, 4.0, 6.0, 8.0]]


def test_pmax_pmin_all_negative_nan_bf16():
    x = np.array([-5.0, -2.0, -7.0, -3.0], np.float32)
    assert C.pmax(x, "i", mesh=M4).tolist() == [-2.0]
    assert C.pmin(x, "i", mesh=M4).tolist() == [-7.0]
    assert np.isnan(C.pmax(np.array([1.0, np.nan, 3.0, 0.0]), "i", mesh=M4)[0])
    assert np.isnan(C.pmin(np.array([1.0, np.nan, 3.0, 0.0]), "i", mesh=M4)[0])
    b = np.array([1, 3, 2, -4], ml_dtypes.bfloat16)
    assert C.pmax(b, "i", mesh=M4).dtype == ml_dtypes.bfloat16
    assert C.pmin(b, "i", axis_index_groups=[[0, 3], [1, 2]], mesh=M4).astype(float).tolist() == [-4, 2, 2, -4]


def test_pmean_docstring_and_groups():
    assert C.pmean(np.arange(4), "i", mesh=M4).tolist() == [1.5]
    assert C.pmean(np.arange(4), "i", mesh=M4).dtype == np.float32
    assert C.pmean(np.arange(4.0), "i", axis_index_groups=[[0, 1], [2, 3]], mesh=M4).tolist() == [0.5, 0.5, 2.5, 2.5]


# JAX's pmean is `psum(x) / psum(1)`, and psum(1) over axis_index_groups is the constant
# len(groups[0]) (jax/_src/lax/parallel.py: pmean, _axis_size, _psum's constant case), so with
# unequal groups every device divides by the first group's size. Values 0, 1, 2, 3 on devices 0..3:
#   [[0], [1, 2, 3]]: sums 0 | 6 6 6, n = 1 -> 0, 6, 6, 6
#   [[0, 1, 2], [3]]: sums 3 3 3 | 3, n = 3 -> 1, 1, 1, 1
PMEAN_UNEQUAL = [([[0], [1, 2, 3]], [0.0, 6.0, 6.0, 6.0]), ([[0, 1, 2], [3]], [1.0, 1.0, 1.0, 1.0])]


@pytest.mark.parametrize("groups,want", PMEAN_UNEQUAL)
def test_pmean_unequal_groups_divides_by_the_first_groups_size_as_jax(groups, want):
    got = C.pmean(np.arange(4.0, dtype=np.float32), "i", axis_index_groups=groups, mesh=M4)
    assert got.dtype == np.float32 and got.tolist() == want
    assert C.pmean(np.arange(4), "i", axis_index_groups=groups, mesh=M4).tolist() == want  # int -> float32


@pytest.mark.parametrize("groups,want", PMEAN_UNEQUAL)
def test_pmean_eager_and_traced_agree(groups, want):
    """The eager function and refsim's jaxpr interpreter (jax.lax.pmean traced under refsim.pmap)."""
    import jax
    import refsim

    traced = refsim.pmap(lambda v: jax.lax.pmean(v, "i", axis_index_groups=groups), axis_name="i")
    assert np.asarray(traced(np.arange(4.0, dtype=np.float32))).tolist() == want


def test_pargmax_pargmin():
    x = np.array([[3, 1], [7, 1], [7, 0], [2, 5]])
    assert C.pargmax(x, "i", mesh=M4).tolist() == [[1, 3]]
    assert C.pargmin(x, "i", mesh=M4).tolist() == [[3, 2]]
    assert C.pargmax(np.array([1.0, np.nan, 0, 0]), "i", mesh=M4).tolist() == [2**31 - 1]
    with pytest.raises(TypeError, match="single axis"):
        C.pargmax(x, ("i",), mesh=M4)


def test_positional_axes_from_vmap():
    x = np.arange(8).reshape(4, 2)
    from refsim.collectives import reductions
    assert reductions.psum(x, mesh=M4, axes=("i", 0), axis_index_groups=None).tolist() == [28]
    with pytest.raises(ValueError, match="named axes"):
        reductions.psum(x, mesh=M4, axes=("i", 0), axis_index_groups=[[0, 1], [2, 3]])


# ---- all_gather / psum_scatter ----------------------------------------------------------------

def test_all_gather_docstring_examples():
    assert C.all_gather(np.arange(4), "i", mesh=M4).tolist() == [[0, 1, 2, 3]]
    x = np.arange(16).reshape(4, 4)
    got = C.all_gather(x, "i", axis_index_groups=[[0, 2], [3, 1]], mesh=M4)
    a, b = [[0, 1, 2, 3], [8, 9, 10, 11]], [[12, 13, 14, 15], [4, 5, 6, 7]]
    assert got.tolist() == [a, b, a, b]


def test_all_gather_axes_tiled_negative_and_multi_axis():
    x = np.arange(8).reshape(2, 4, 1)  # device (x, y) holds [4x + y]
    assert C.all_gather(x, "y", axis=0, tiled=True, mesh=M24).tolist() == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]
    assert C.all_gather(x, "y", axis=-1, mesh=M24).shape == (2, 1, 1, 4)
    assert C.all_gather(x, ("y", "x"), tiled=True, mesh=M24).ravel().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert C.all_gather(x, ("x", "y"), tiled=True, mesh=M24).ravel().tolist() == list(range(8))
    with pytest.raises(ValueError, match="out of bounds"):
        C.all_gather(x, "y", axis=2, mesh=M24)


def test_psum_scatter_docstring_examples():
    x = np.arange(16).reshape(4, 4)
    assert C.psum_scatter(x, "i", mesh=M4).tolist() == [24, 28, 32, 36]
    assert C.psum_scatter(x, "i", tiled=True, mesh=M4).tolist() == [[24], [28], [32], [36]]
    got = C.psum_scatter(x, "i", axis_index_groups=[[0, 2], [3, 1]], tiled=True, mesh=M4)
    assert got.tolist() == [[8, 10], [20, 22], [12, 14], [16, 18]]
    got = C.psum_scatter(np.arange(16).reshape(4, 2, 2), "i", scatter_dimension=-1,
                         axis_index_groups=[[0, 1], [2, 3]], mesh=M4)
    assert got.tolist() == [[4, 8], [6, 10], [20, 24], [22, 26]]


def test_psum_scatter_indivisible_raises():
    with pytest.raises(ValueError, match="must be divisible by shard_count 4"):
        C.psum_scatter(np.zeros((4, 6)), "i", tiled=True, mesh=M4)
    with pytest.raises(ValueError, match="must match shard count 4"):
        C.psum_scatter(np.zeros((4, 8)), "i", mesh=M4)


# ---- all_to_all -------------------------------------------------------------------------------

def test_all_to_all_untiled_and_tiled():
    x = np.arange(16).reshape(4, 4)  # device i holds [4i .. 4i+3]
    assert C.all_to_all(x, "i", 0, 0, mesh=M4).tolist() == x.T.tolist()
    y = np.arange(32).reshape(4, 8)
    got = C.all_to_all(y, "i", 0, 0, tiled=True, mesh=M4)
    assert got[1].tolist() == [2, 3, 10, 11, 18, 19, 26, 27]
    z = np.arange(8).reshape(2, 2, 2)  # 2 devices, local (2, 2)
    m2 = Mesh((2,), ("i",))
    # split rows, concat columns: device 0 gets row 0 of each sender side by side
    assert C.all_to_all(z, "i", 0, 1, tiled=True, mesh=m2).tolist() == [[[0, 1, 4, 5]], [[2, 3, 6, 7]]]
    assert C.all_to_all(z, "i", 1, 0, mesh=m2).shape == (2, 2, 2)
    assert C.pswapaxes(x, "i", 0, mesh=M4).tolist() == x.T.tolist()


def test_all_to_all_bad_sizes():
    with pytest.raises(ValueError, match="has to be divisible"):
        C.all_to_all(np.zeros((4, 6)), "i", 0, 0, tiled=True, mesh=M4)
    with pytest.raises(ValueError, match="requires the size of the mapped axis"):
        C.all_to_all(np.zeros((4, 3)), "i", 0, 0, mesh=M4)


# ---- ppermute, pshuffle, pbroadcast, axis_index -----------------------------------------------

def test_ppermute_partial_fixed_points_cycles_multi_axis():
    x = np.array([10, 20, 30, 40])
    assert C.ppermute(x, "i", [(0, 1), (1, 0)], mesh=M4).tolist() == [20, 10, 0, 0]
    assert C.ppermute(x, "i", [(2, 2)], mesh=M4).tolist() == [0, 0, 30, 0]
    assert C.ppermute(x, "i", ((i, i) for i in range(4)), mesh=M4).tolist() == [10, 20, 30, 40]
    assert C.ppermute(x, "i", [(0, 1), (1, 0), (2, 3), (3, 2)], mesh=M4).tolist() == [20, 10, 40, 30]
    v = np.arange(8).reshape(2, 4)  # ('y', 'x') index of (x, y) is 2y + x
    # (y, x) linear index 1 is device (x=1, y=0); index 2 is device (x=0, y=1)
    got = C.ppermute(v, ("y", "x"), [(0, 1), (1, 2)], mesh=M24)
    assert got.tolist() == [[0, 4, 0, 0], [0, 0, 0, 0]]
    got = C.ppermute(v, ("y", "x"), [(1, 0)], mesh=M24)
    assert got.tolist() == [[4, 0, 0, 0], [0, 0, 0, 0]]


def test_ppermute_and_pshuffle_errors():
    with pytest.raises(ValueError, match="sources and destinations must be unique"):
        C.ppermute(np.arange(4), "i", [(0, 1), (0, 2)], mesh=M4)
    with pytest.raises(ValueError, match=r"unique, got \(\(0, 1\), \(2, 1\)\)"):
        C.ppermute(np.arange(4), "i", [(0, 1), (2, 1)], mesh=M4)
    with pytest.raises(IndexError, match="index 4"):
        C.ppermute(np.arange(4), "i", [(0, 4)], mesh=M4)
    with pytest.raises(ValueError, match="does not represent a permutation"):
        C.pshuffle(np.arange(4), "i", [0, 0, 1, 2], mesh=M4)
    assert C.pshuffle(np.array([10, 20, 30, 40]), "i", [1, 2, 3, 0], mesh=M4).tolist() == [20, 30, 40, 10]


def test_pbroadcast_and_errors():
    x = np.arange(8).reshape(2, 4)
    assert C.pbroadcast(x, "y", 2, mesh=M24).tolist() == [[2], [6]]
    assert C.pbroadcast(x, ("x", "y"), 5, mesh=M24).tolist() == [[5]]
    with pytest.raises(IndexError, match="source=4 is out of range"):
        C.pbroadcast(x, "y", 4, mesh=M24)
    with pytest.raises(IndexError, match="source=-1"):
        C.pbroadcast(x, "y", -1, mesh=M24)


def test_axis_index_and_size():
    m = Mesh((4, 2), ("i", "j"))
    assert C.axis_index(("i", "j"), mesh=m).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert C.axis_index("i", mesh=m).tolist() == [[0], [1], [2], [3]]
    assert C.axis_index(("j", "i"), mesh=m).tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert C.axis_index("i", mesh=m).dtype == np.int32
    assert C.axis_size(("i", "j"), mesh=m) == 8 and C.axis_size("j", mesh=AbstractMesh((3, 5), ("a", "j"))) == 5


def test_sizes_three_and_five_and_size_one_axis():
    m = Mesh((3, 1, 5), ("a", "b", "c"))
    x = np.arange(15).reshape(3, 1, 5)
    assert C.psum(x, ("c", "a"), mesh=m).tolist() == [[[105]]]
    assert C.psum(x, "b", mesh=m).tolist() == x.tolist()
    assert C.all_gather(x, "b", mesh=m).shape == (3, 1, 5, 1)
    assert C.ppermute(x, "c", [(4, 0)], mesh=m)[:, 0, 0].tolist() == [4, 9, 14]


# ---- ragged_all_to_all ------------------------------------------------------------------------

def test_ragged_all_to_all_docstring_example_and_untouched_rows():
    m = Mesh((2,), ("i",))
    got = C.ragged_all_to_all(np.array([[1, 2, 2], [3, 4, 0]]), np.full((2, 4), -1),
                              np.array([[0, 1], [0, 1]]), np.array([[1, 2], [1, 1]]),
                              np.array([[0, 0], [1, 2]]), np.array([[1, 1], [2, 1]]),
                              axis_name="i", mesh=m)
    assert got.tolist() == [[1, 3, -1, -1], [2, 2, 4, -1]]


def test_ragged_single_device_groups_and_errors():
    m = Mesh((2,), ("i",))
    got = C.ragged_all_to_all(np.array([[1, 2], [3, 4]]), np.zeros((2, 3), int),
                              np.array([[0], [1]]), np.array([[2], [1]]), np.array([[1], [0]]),
                              np.array([[2], [1]]), axis_name="i", axis_index_groups=[[0], [1]],
                              mesh=m)
    assert got.tolist() == [[0, 1, 2], [4, 0, 0]]
    with pytest.raises(ValueError, match="recv_sizes does not match"):
        C.ragged_all_to_all(np.zeros((2, 2)), np.zeros((2, 3)), np.zeros((2, 1), int),
                            np.ones((2, 1), int), np.zeros((2, 1), int), np.full((2, 1), 2),
                            axis_name="i", axis_index_groups=[[0], [1]], mesh=m)
    with pytest.raises(ValueError, match="integer type"):
        C.ragged_all_to_all(np.zeros((2, 2)), np.zeros((2, 3)), np.zeros((2, 1)),
                            np.ones((2, 1), int), np.zeros((2, 1), int), np.ones((2, 1), int),
                            axis_name="i", mesh=m)


# ---- p2p, async, casts ------------------------------------------------------------------------

def test_psend_precv_equals_ppermute():
    x = np.arange(8.0).reshape(4, 2)
    perm = [(0, 2), (1, 3)]
    tok = C.psend(x, "i", perm, mesh=M4)
    out = C.precv(tok, np.zeros(2), "i", perm, mesh=M4)
    assert np.array_equal(out, C.ppermute(x, "i", perm, mesh=M4))
    with pytest.raises(ValueError, match="do not match the psend"):
        C.precv(tok, np.zeros(2), "i", [(0, 1)], mesh=M4)


def test_async_pairs_equal_sync():
    x = np.arange(16.0).reshape(4, 4)
    kw = dict(mesh=M4)
    assert np.array_equal(C.psum_done(C.psum_start(x, "i", **kw)), C.psum(x, "i", **kw))
    assert np.array_equal(C.all_gather_done(C.all_gather_start(x, "i", axis=1, **kw)),
                          C.all_gather(x, "i", axis=1, **kw))
    assert np.array_equal(C.psum_scatter_done(C.psum_scatter_start(x, "i", tiled=True, **kw)),
                          C.psum_scatter(x, "i", tiled=True, **kw))
    assert np.array_equal(C.all_to_all_done(C.all_to_all_start(x, "i", 0, 0, **kw)),
                          C.all_to_all(x, "i", 0, 0, **kw))
    assert np.array_equal(C.ppermute_done(C.ppermute_start(x, "i", [(0, 3)], **kw)),
                          C.ppermute(x, "i", [(0, 3)], **kw))
    assert np.array_equal(C.pbroadcast_done(C.pbroadcast_start(x, "i", 1, **kw)),
                          C.pbroadcast(x, "i", 1, **kw))
    with pytest.raises(TypeError, match="want a Future"):
        C.psum_done(x)


def test_pcast_rules():
    V, I = vma.Mat(varying={"x"}), vma.Mat()
    assert vma.pcast_type(I, "x", "varying") == ("pvary", V)
    assert vma.pcast_type(I, "x", "reduced")[0] == "preduced"
    assert vma.pcast_type(V, "x", "unreduced") == ("vary_unreduced_cast", vma.Mat(unreduced={"x"}))
    assert vma.pcast_type(vma.Mat(reduced={"x"}), "x", "varying")[0] == "reduced_vary_cast"
    for mat, to in [(V, "varying"), (V, "reduced"), (I, "unreduced"), (vma.Mat(unreduced={"x"}), "varying")]:
        with pytest.raises(ValueError, match="Unsupported pcast"):
            vma.pcast_type(mat, "x", to)
    with pytest.raises(ValueError, match="Allowed `to` values"):
        vma.pcast_type(I, "x", "bogus")
    with pytest.raises(ValueError, match="one of varying, unreduced"):
        vma.pcast_type(vma.Mat(varying={"x"}), ("x", "y"), "varying")
    with pytest.raises(ValueError, match="variant->invariant"):
        vma.psum_invariant_type(I, "x")
    assert vma.unreduced_psum_type(vma.Mat(unreduced={"x"}), "x") == I
    assert vma.all_gather_reduced_type(V, "x") == vma.Mat(reduced={"x"})
    with pytest.raises(ValueError, match="device-varying"):
        vma.collective_type(I, "x", "all_gather")
    x = np.arange(4.0)
    assert C.pcast(x, "i", to="unreduced", mesh=M4) is x
    with pytest.raises(ValueError, match="Unsupported pcast from=varying"):
        C.pcast(x, "i", to="varying", mesh=M4)


# ---- interpreter rules ------------------------------------------------------------------------

def test_rules_take_params_as_jax_binds_them():
    ctx = Context(nm=2, mesh=M24)
    import refsim.interpreter.rules.collectives  # noqa: F401  (registers the rules)
    x = np.arange(8.0).reshape(2, 4, 1)
    assert lookup("psum")(ctx, x, axes=("y",), axis_index_groups=None).ravel().tolist() == [6, 22]
    assert lookup("psum_invariant")(ctx, x, axes=("y", "x")).ravel().tolist() == [28]
    assert lookup("all_to_all")(ctx, np.ones((2, 4, 4)), split_axis=0, concat_axis=0,
                                axis_name="y", axis_index_groups=None, tiled=True).shape == (2, 4, 4)
    assert lookup("axis_index")(ctx, axis_name="y").ravel().tolist() == [0, 1, 2, 3]
    assert lookup("vary_unreduced_cast_p")(ctx, x, axes=("x",)) is x
    fut = lookup("ppermute_start")(ctx, x, axis_name=("y",), perm=((0, 1),))
    assert np.array_equal(lookup("ppermute_done")(ctx, fut),
                          lookup("ppermute")(ctx, x, axis_name=("y",), perm=((0, 1),)))
    with pytest.raises(NameError, match="manual mesh context"):
        lookup("psum")(Context(), x, axes=("y",), axis_index_groups=None)


def test_sum_of_negative_zeros_is_negative_zero():
    """StableHLO all_reduce: the operands are the schedule's only leaves (no +0 identity), and
    IEEE 754 gives -0 + -0 = -0; one +0 operand makes the sum +0. Complex: part by part."""
    import numpy as np

    import jax

    import refsim
    from refsim import P
    from refsim.collectives.reductions import ordered_reduce

    got = ordered_reduce(np.add, np.array([[-0.0, -0.0, 0.0, -0.0], [-0.0, 0.0, -0.0, -0.0]], np.float32))
    assert np.signbit(got).tolist() == [True, False, False, True] and not got.any()
    one = ordered_reduce(np.add, np.array([[-0.0, 0.0]], np.float64))       # a one-member group
    assert np.signbit(one).tolist() == [True, False]
    bf = ordered_reduce(np.add, np.array([[-0.0, 0.0], [-0.0, -0.0]], ml_dtypes.bfloat16))
    assert np.signbit(bf.astype(np.float32)).tolist() == [True, False]
    z = ordered_reduce(np.add, np.array([[complex(-0.0, -0.0)], [complex(-0.0, 0.0)]], np.complex64))
    assert np.signbit(z.real).tolist() == [True] and np.signbit(z.imag).tolist() == [False]
    mesh = refsim.Mesh((2,), ("x",))
    out = refsim.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())(
        np.array([-0.0, -0.0], np.float32))
    assert np.signbit(np.asarray(out)).all()
