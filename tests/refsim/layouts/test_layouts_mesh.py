import numpy as np
import pytest

from refsim import AbstractMesh, AxisType, Mesh


def test_default_ids_row_major():
    m = Mesh((2, 4), ("x", "y"))
    assert m.shape == {"x": 2, "y": 4}
    assert list(m.shape) == ["x", "y"]
    assert m.size == 8
    np.testing.assert_array_equal(m.device_ids, [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_explicit_ids_any_order():
    ids = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])
    m = Mesh((2, 4), ("x", "y"), device_ids=ids)
    np.testing.assert_array_equal(m.device_ids, ids)
    assert m.device_position(5) == (1, 2)
    assert m.device_set == frozenset(range(8))


def test_size_one_axes_and_types():
    m = Mesh((1, 3, 1), ("a", "b", "c"), axis_types=(AxisType.Explicit, AxisType.Auto, AxisType.Manual))
    assert m.size == 3
    assert m.explicit_axes == ("a",) and m.manual_axes == ("c",)
    assert m.abstract_mesh == AbstractMesh((1, 3, 1), ("a", "b", "c"), (AxisType.Explicit, AxisType.Auto, AxisType.Manual))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(shape=(2, 2), axis_names=("x", "x")), ValueError, "more than once"),
        (dict(shape=(2, 2), axis_names=("x", "y"), device_ids=np.array([[0, 1], [1, 2]])), ValueError, "not unique"),
        (dict(shape=(2, 2), axis_names=("x", "y"), device_ids=np.arange(4)), ValueError, "shape"),
        (dict(shape=(2, 2), axis_names=("x",)), ValueError, "one axis name per mesh dimension"),
        (dict(shape=(2,), axis_names=(1,)), TypeError, "strings"),
    ],
)
def test_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Mesh(**kwargs)


def test_from_jax_takes_device_ids():
    import jax

    devs = np.array(jax.devices()[:8])[::-1].reshape(2, 4)
    jm = jax.sharding.Mesh(devs, ("x", "y"))
    m = Mesh.from_jax(jm)
    np.testing.assert_array_equal(m.device_ids, [[d.id for d in row] for row in devs])
    assert m.axis_names == ("x", "y")


def test_unbound_axis_is_nameerror():
    with pytest.raises(NameError, match="unbound axis name: 'z'"):
        Mesh((2,), ("x",)).axis_index("z")
