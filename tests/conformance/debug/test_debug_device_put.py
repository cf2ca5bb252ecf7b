"""device_put reproducers (written for reshard_device_order cases): loaded, and compared device by device.

A device_put has no equations, so "bisect" reports the movement itself. Expected blocks are
worked out by hand from the meshes' device ids below.
"""
import numpy as np
import pytest

import xla_backend
from conformance.cases import Program
from conformance.debug import cli, loader
from refsim import Array, Mesh, NamedSharding, PartitionSpec as P, Shard

SRC = Mesh((2, 4), ("x", "y"))                                        # ids 0..7 row-major
DST = Mesh((2, 4), ("x", "y"), device_ids=np.arange(8)[::-1].reshape(2, 4))   # [[7,6,5,4],[3,2,1,0]]
X = np.arange(32, dtype=np.float32).reshape(4, 8)


@pytest.fixture
def repro(tmp_path):
    case = Program(family="reshard_device_order", source="def f(a):\n    return a\n", entry="device_put",
                   mesh=SRC, args=(X,), in_shardings=(NamedSharding(SRC, P("x", None)),),
                   out_shardings=NamedSharding(DST, P("x", "y")), labels=(("to", "reversed"),))
    path = tmp_path / "reshard.py"
    path.write_text(case.repro())
    return str(path)


def test_loader_reads_a_device_put_reproducer(repro):
    case = loader.load(repro)
    assert case.kind == "device_put" and len(case.inputs) == 1
    assert case.in_shardings[0].spec == P("x", None) and case.in_shardings[0].mesh.device_ids.tolist() == [
        [0, 1, 2, 3], [4, 5, 6, 7]]
    assert case.out_shardings.spec == P("x", "y")
    assert case.out_shardings.mesh.device_ids.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    with pytest.raises(ValueError, match="device_put case: one data movement with no equations"):
        case.bisect_kwargs()


def test_agreeing_movement_is_reported_per_device(repro):
    res = loader.load(repro).bisect()
    assert res.ok, res.report()
    assert res.report().startswith("MATCH: refsim and XLA agree on every device. The program is one data "
                                   "movement, device_put of float32[4, 8]")
    assert "it has no equations to bisect" in res.report()
    # device 7 sits at position (0, 0) of the reversed mesh: rows 0:2, columns 0:2; device 0 at (1, 3)
    assert res.output.devices[7].actual.tolist() == [[0, 1], [8, 9]]
    assert res.output.devices[0].actual.tolist() == [[22, 23], [30, 31]]
    assert sorted(res.output.devices) == list(range(8))


def _ignores_device_order(x, source, target):
    """A broken transfer: the target spec over the source's device order."""
    return xla_backend.device_put(xla_backend.device_put(x, source), NamedSharding(source.mesh, target.spec))


def _corrupts_device_5(x, source, target):
    good = xla_backend.device_put(xla_backend.device_put(x, source), target)
    shards = [Shard(s.device_id, s.index, s.data + 1 if s.device_id == 5 else s.data) for s in good.shards]
    return Array(good.shape, good.dtype, good.sharding, shards)


def test_misplaced_blocks_are_named_by_device(repro):
    res = loader.load(repro).bisect(runner=_ignores_device_order)
    assert not res.ok and res.output.matched            # the data sit at XLA's own indices ...
    assert sorted(res.misplaced) == list(range(8))     # ... but no device holds refsim's block
    text = res.report()
    assert text.startswith("MISMATCH: the program is one data movement")
    # device 7 at (1, 3) of the row-major source mesh holds rows 2:4, columns 6:8
    assert "device 7: XLA holds block [2:4, 6:8], refsim places [0:2, 0:2] there" in text


def test_corrupted_device_data_is_found(repro):
    res = loader.load(repro).bisect(runner=_corrupts_device_5)
    assert not res.ok and not res.misplaced and res.output.differing == [5]
    # device 5 at (0, 2) of the reversed mesh: rows 0:2, columns 4:6 = [[4, 5], [12, 13]]
    assert "device 5: 4 of 4 elements differ at [0:2, 0:2]" in res.report()
    assert "element [0, 0]: refsim 4.0, xla 5.0" in res.report()


def test_cli_compares_a_device_put_case(repro, tmp_path, capsys):
    assert cli.main([repro, "--intermediates", str(tmp_path / "dump")]) == 0
    out = capsys.readouterr().out
    assert "(device_put, 1 input(s))" in out and "MATCH" in out
    assert "no intermediates: a device_put case is one data movement with no equations" in out


def test_device_put_fields_are_checked():
    base = {"KIND": "device_put", "MESH_SHAPE": (2,), "AXIS_NAMES": ("x",), "program": abs,
            "IN_SHARDINGS": (P("x"),), "OUT_SHARDINGS": P("x"), "inputs": lambda: (np.zeros(2), np.zeros(2))}
    with pytest.raises(ValueError, match="a device_put case moves one array; inputs\\(\\) returned 2"):
        loader.from_fields(base)
    same = loader.from_fields(dict(base, inputs=lambda: (np.zeros(2),)))
    assert same.out_shardings.mesh.device_ids.tolist() == [0, 1]   # no OUT_DEVICE_IDS: the same devices
