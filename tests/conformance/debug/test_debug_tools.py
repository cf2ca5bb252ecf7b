"""ULP/abs errors, differing ranges, device pictures, refsim intermediates, reproducer loading, CLI."""
import json
import os
import textwrap

import jax
import numpy as np
import pytest

import refsim
from conformance.debug import cli, loader, picture
from conformance.debug.diff import DeviceDiff, abs_error, differing_ranges, ulp_error
from refsim import Mesh, PartitionSpec as P
from refsim import intermediates as I


# -- errors -----------------------------------------------------------------------------------
def test_ulp_error_hand_values():
    one = np.float32(1.0)
    assert ulp_error(one, np.nextafter(one, np.float32(2))) == 1
    assert ulp_error(np.float32(2.0), one) == 2 ** 23  # one binade of float32
    assert ulp_error(np.float32(0.0), np.float32(-0.0)) == 0
    assert ulp_error(np.float32(-1.0), np.nextafter(np.float32(-1.0), np.float32(-2))) == 1
    assert ulp_error(np.float32("nan"), np.float32("nan")) == 0
    assert ulp_error(np.float32("nan"), one) == np.inf
    assert ulp_error(np.int32(3), np.int32(7)) == 4
    assert abs_error(np.float32(1.5), np.float32(-0.5)) == 2.0
    assert abs_error(np.float32("inf"), np.float32("inf")) == 0


def test_differing_ranges_are_boxes():
    m = np.zeros((4, 4), bool)
    m[1:3, 0:2] = True
    assert differing_ranges(m) == ["[1:3, 0:2]"]
    assert differing_ranges(np.array([False, True, True, False, True])) == ["[1:3]", "[4]"]
    m = np.zeros((3, 3), bool)
    m[0, 0] = m[2, 1:3] = True
    assert differing_ranges(m) == ["[0, 0]", "[2, 1:3]"]
    assert differing_ranges(np.array(True)) == ["[]"]


# -- pictures -----------------------------------------------------------------------------------
MESH = Mesh((2, 2), ("x", "y"), device_ids=np.array([[2, 0], [3, 1]]))


class _Report:
    name = "g"
    devices = {d: DeviceDiff(d, None, (), np.zeros(2), np.zeros(2), float(u), float(a), int(u > 0))
               for d, u, a in [(0, 0, 0), (1, 4, 0.5), (2, 0, 0), (3, 1e9, 8)]}


def test_device_errors_and_text_grid():
    assert picture.device_errors(_Report, "ulp") == {0: 0, 1: 4, 2: 0, 3: 1e9}
    assert picture.device_errors(_Report, "abs")[3] == 8
    text = picture.render(MESH, _Report, format="text")
    assert "max ULP of g" in text and "dev 3" in text and "1e+09" in text
    with pytest.raises(ValueError, match="metric='rel'"):
        picture.device_errors(_Report, "rel")


def test_svg_and_html_without_matplotlib():
    svg = picture.render(MESH, _Report, metric="abs", format="svg")
    assert svg.startswith("<svg") and 'data-device="3" data-value="8"' in svg
    html = picture.render(MESH, _Report, format="html")
    assert html.startswith("<!DOCTYPE html>") and "max ULP of g" in html


def test_png_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    out = picture.to_png(MESH, _Report, tmp_path / "g.png")
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# -- intermediates ---------------------------------------------------------------------------------
def _prog(a):
    b = a * 2.0
    c = jax.lax.ppermute(b, "y", [(0, 1), (1, 0)])
    return jax.lax.psum(c, "x")


def test_shard_map_intermediates_one_file_per_equation(tmp_path):
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    d = tmp_path / "dump"
    out = refsim.shard_map(_prog, mesh=MESH, in_specs=P("x", "y"), out_specs=P(None, "y"),
                           intermediates=str(d))(a)
    assert out.info["intermediates"] == str(d)
    recs = I.load(d)
    prims = [r["primitive"] for r in recs]
    # one file per equation of the traced body (jax 0.12 adds a convert_element_type of the literal)
    from conformance.debug import trace

    region, _ = trace(_prog, (a,), mesh=MESH, in_specs=P("x", "y"), out_specs=P(None, "y"))
    assert prims == [e.primitive.name for e in region.jaxpr.eqns]
    k = prims.index("ppermute")
    assert json.load(open(d / "index.json"))["files"][k] == f"{k:06d}_ppermute.npz"
    perm, summed = recs[k], recs[-1]
    assert perm["mesh"]["device_ids"] == [[2, 0], [3, 1]]
    assert perm["outputs"][0]["mesh_dims"] == 2 and "test_debug_tools.py" in perm["source"]
    # device 2 sits at (x=0, y=0) and receives y=1's block: 2 * a[0:2, 2:4]
    np.testing.assert_array_equal(I.device_value(perm, 0, 2), [[4.0, 6.0], [12.0, 14.0]])
    # after psum over x, device 0 (x=0, y=1) holds (a[0:2, 0:2] + a[2:4, 0:2]) * 2
    np.testing.assert_array_equal(I.device_value(summed, 0, 0), [[16.0, 20.0], [32.0, 36.0]])


def test_jit_intermediates_keep_bfloat16(tmp_path):
    out = refsim.jit(lambda x: x.astype(jax.numpy.bfloat16) * 2, intermediates=True)(np.arange(3.0))
    recs = I.load(out.info["intermediates"])
    assert recs[0]["outputs_data"][0].dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(recs[-1]["outputs_data"][0].astype(np.float32), [0, 2, 4])


def test_intermediates_bad_arguments(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        refsim.jit(lambda x: x + 1, intermediates=str(tmp_path))(np.arange(3.0))
    with pytest.raises(TypeError, match="intermediates=5"):
        refsim.jit(lambda x: x + 1, intermediates=5)(np.arange(3.0))
    with pytest.raises(ValueError, match="has no index.json"):
        I.load(tmp_path)


# -- reproducers and the CLI ------------------------------------------------------------------------
REPRO = textwrap.dedent('''
    # conformance reproducer v1: ring
    import numpy as np, jax
    from jax.sharding import PartitionSpec as P
    MESH_SHAPE = (2, 4)
    AXIS_NAMES = ('x', 'y')
    DEVICE_IDS = [[3, 1, 0, 2], [7, 6, 5, 4]]
    KIND = "shard_map"
    IN_SPECS = (P('x', 'y'),)
    OUT_SPECS = P('x', 'y')
    CHECK_VMA = True
    def program(a):
        b = a + 1.0
        return jax.lax.ppermute(b, 'y', [(0, 1), (1, 2), (2, 3), (3, 0)])
    def inputs(): return (np.arange(32, dtype=np.float32).reshape(4, 8),)
    TOLERANCE = "exact"
    GLOBAL = {"KIND": "jit", "MESH_SHAPE": (8,), "AXIS_NAMES": ("x",), "IN_SHARDINGS": (P(None, 'x'),),
              "OUT_SHARDINGS": P(None, 'x'), "program": lambda a: a * 3.0, "inputs": inputs}
    def MAPPED():
        return {"KIND": "pmap", "AXIS_NAME": "i", "IN_AXES": (0,), "OUT_AXES": 0, "DEVICE_IDS": [1, 0, 3, 2],
                "program": lambda a: jax.lax.psum(a, 'i'), "inputs": lambda: (np.arange(8.0).reshape(4, 2),)}
''')


@pytest.fixture
def repro(tmp_path):
    path = tmp_path / "repro.py"
    path.write_text(REPRO)
    return str(path)


def test_loader_reads_module_named_dict_and_function(repro):
    case = loader.load(repro)
    assert case.kind == "shard_map" and case.mesh.device_ids.tolist() == [[3, 1, 0, 2], [7, 6, 5, 4]]
    assert case.in_specs == (P("x", "y"),) and case.out_specs == P("x", "y")
    assert case.bisect().ok
    glob = loader.load(repro + ":GLOBAL")
    assert glob.kind == "jit" and glob.in_shardings[0].spec == P(None, "x")
    assert glob.bisect().ok
    mapped = loader.load(repro + ":MAPPED")
    res = mapped.bisect()
    assert res.ok and res.region.mesh.device_ids.tolist() == [1, 0, 3, 2]


def test_loader_errors_name_the_problem(repro, tmp_path):
    assert loader.split_target("C:/r/x.py:CASE") == ("C:/r/x.py", "CASE")
    with pytest.raises(ValueError, match="has no case 'NOPE'"):
        loader.load(repro + ":NOPE")
    with pytest.raises(ValueError, match="does not exist"):
        loader.load(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="has no MESH_SHAPE"):
        loader.from_fields({"KIND": "jit", "program": abs, "inputs": ()})
    with pytest.raises(ValueError, match="KIND='vmap'"):
        loader.from_fields({"KIND": "vmap", "program": abs, "inputs": ()})


def test_cli_match_and_planted_divergence(repro, tmp_path, capsys):
    assert cli.main([repro]) == 0
    assert "MATCH" in capsys.readouterr().out
    html, svg = tmp_path / "r.html", tmp_path / "r.svg"
    code = cli.main([repro, "--runner", "conformance.faults.jaxpr:reverse_first_ppermute",
                     "--html", str(html), "--svg", str(svg), "--intermediates", str(tmp_path / "dump")])
    out = capsys.readouterr().out
    assert code == 1
    prims = [r["primitive"] for r in I.load(tmp_path / "dump")]
    assert prims[-1] == "ppermute"  # the dump has the body's equations, ppermute last
    assert f"first diverging equation is #{len(prims) - 1} " in out and "primitive: ppermute" in out
    assert "<svg" in html.read_text() and svg.read_text().startswith("<svg")


def test_cli_usage_errors(repro, capsys):
    assert cli.main([repro + ":NOPE"]) == 2
    assert "has no case 'NOPE'" in capsys.readouterr().err
    assert cli.main([repro, "--runner", "nodots"]) == 2
