"""A Mesh whose device-id array cannot fit in memory is a ValueError naming its size (issue 28,
point 5: `Mesh((2**30,))` raised a raw MemoryError, or was killed by the kernel). Nothing here
allocates a large array: the available memory is pinned low instead."""
import numpy as np
import pytest

from refsim import AbstractMesh, Mesh, resources


def test_a_mesh_larger_than_memory_is_a_value_error_naming_its_size(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda: 1 << 30)  # 1 GiB free
    with pytest.raises(ValueError, match=r"Mesh shape=\(1073741824,\) has 1073741824 devices; its device ids "
                                         r"need 16 GiB .* more than the 1 GiB of memory available here; use "
                                         r"refsim.AbstractMesh"):
        Mesh((2**30,), ("x",))
    with pytest.raises(ValueError, match=r"Mesh shape=\(32768, 32768\) has 1073741824 devices"):
        Mesh((2**15, 2**15), ("x", "y"))
    assert AbstractMesh((2**30,), ("x",)).size == 2**30  # holds no ids: any size


def test_a_mesh_that_fits_is_built_as_before(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda: 16 * 64)  # exactly 64 devices' worth
    assert Mesh((8, 8), ("x", "y")).device_ids.ravel().tolist() == list(range(64))
    with pytest.raises(ValueError, match="has 65 devices"):
        Mesh((65,), ("x",))


def test_an_allocation_failure_is_a_value_error(monkeypatch):
    monkeypatch.setattr(resources, "available_memory", lambda: None)  # unknown: try, and fail cleanly

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(np, "arange", no_memory)
    with pytest.raises(ValueError, match=r"Mesh shape=\(4,\) has 4 devices, whose device ids \(32 B\) cannot be "
                                         "allocated here"):
        Mesh((4,), ("x",))


def test_given_device_ids_are_still_checked():
    with pytest.raises(ValueError, match="not unique"):
        Mesh((2,), ("x",), device_ids=np.array([1, 1]))
    with pytest.raises(ValueError, match="negative id -1"):
        Mesh((2,), ("x",), device_ids=np.array([0, -1]))
    assert Mesh((2,), ("x",), device_ids=[5, 3]).device_ids.tolist() == [5, 3]


def test_resources_report_this_machine():
    free = resources.available_memory()
    assert free is None or free > 0
    assert resources.usable_cores() >= 1
    assert [resources.format_bytes(n) for n in (100, 1536, 2**30, 2**63)] == ["100 B", "1.5 KiB", "1 GiB", "8 EiB"]
