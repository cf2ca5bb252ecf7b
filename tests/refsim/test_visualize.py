"""Layout pictures: text equal to jax.debug.visualize_sharding, block labels hand-computed, SVG/HTML well formed."""
import contextlib
import io
import re
import xml.etree.ElementTree as ET

import jax
import numpy as np
import pytest
import rich.console
from jax.sharding import NamedSharding as JNS, PartitionSpec as JP

import refsim
from refsim import Mesh, NamedSharding, P
from refsim.layouts import PmapSharding
from refsim.visualize import render_device_grid, to_html, to_svg, to_text

IDS = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])
MESH = Mesh((2, 4), ("x", "y"), device_ids=IDS)


@pytest.mark.parametrize("spec,shape", [
    (("y", None), (8, 3)), (("x", "y"), (8, 8)), (("y",), (8,)), ((), (8,)), ((None, "x"), (8, 8)), (("y", "x"), (8, 4)),
])
def test_text_equals_jax_visualize_sharding(spec, shape):
    """Without colour, refsim's text is JAX's (labelled "CPU <ids>") for layouts that fit the console."""
    jmesh = jax.sharding.Mesh(np.array(jax.devices())[IDS], ("x", "y"))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jax.debug.visualize_sharding(shape, JNS(jmesh, JP(*spec)))
    assert to_text(NamedSharding(MESH, P(*spec)), shape, device_kind="CPU") == buf.getvalue()


def labels_in_order(text):
    out = []
    for line in text.splitlines():
        out.extend(cell.strip() for cell in line.strip("│┌┐└┘├┤").split("│") if cell.strip().startswith("dev"))
    return out


def test_labels_hand_computed():
    # P('y') over 8 elements: blocks follow the y axis; each block's replicas are the two x rows
    assert labels_in_order(to_text(NamedSharding(MESH, P("y")), (8,))) == [
        "dev 3,7", "dev 1,6", "dev 0,5", "dev 2,4"]
    # P('x', None): row block 0 on mesh row x=0 (ids 3,1,0,2), row block 1 on x=1
    assert labels_in_order(to_text(NamedSharding(MESH, P("x", None)), (4, 4))) == ["dev 0,1,2,3", "dev 4,5,6,7"]
    # P(None, ('y', 'x')): 8 column blocks, y major: (y0,x0)=3, (y0,x1)=7, (y1,x0)=1, ...
    assert labels_in_order(to_text(NamedSharding(MESH, P(None, ("y", "x"))), (2, 8), max_width=120)) == [
        "dev 3", "dev 7", "dev 1", "dev 6", "dev 0", "dev 5", "dev 2", "dev 4"]


def test_pmap_and_rank_0_and_rank_3():
    ps = PmapSharding.default((4, 3), 0, [3, 2, 1, 0])
    assert labels_in_order(to_text(ps, (4, 3))) == ["dev 3", "dev 2", "dev 1", "dev 0"]
    assert labels_in_order(to_text(NamedSharding(Mesh((2,), ("x",)), P()), ())) == ["dev 0,1"]
    text = to_text(NamedSharding(MESH, P("x", None, "y")), (4, 2, 8))
    assert "[0:2, :, :]" in text and "[2:4, :, :]" in text
    assert labels_in_order(text) == ["dev 3", "dev 1", "dev 0", "dev 2", "dev 7", "dev 6", "dev 5", "dev 4"]


def test_visualize_prints_and_takes_an_array():
    arr = refsim.device_put(np.zeros((8, 8)), NamedSharding(MESH, P("x", "y")))
    console = rich.console.Console(file=io.StringIO(), record=True, width=80, color_system="truecolor",
                                   force_terminal=True)
    refsim.visualize(arr, console=console)
    text = console.export_text(styles=False, clear=False)
    assert [w for w in text.split() if w.isdigit()] == ["3", "1", "0", "2", "7", "6", "5", "4"]
    assert "│" not in text  # coloured blocks instead of box lines
    backgrounds = set(re.findall(r"background-color: (#[0-9a-f]{6})", console.export_html()))
    assert len(backgrounds) >= 8  # one colour per block


def test_svg_blocks_and_extents():
    svg = to_svg(NamedSharding(MESH, P("y", "x")), (8, 4))
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    blocks = [(g.get("data-rows"), g.get("data-cols"), g.get("data-devices")) for g in root.iter(ns + "g")]
    # rows cut by y (ids along y at x=0: 3,1,0,2 / x=1: 7,6,5,4), columns by x
    assert blocks == [
        ("0:2", "0:2", "3"), ("0:2", "2:4", "7"), ("2:4", "0:2", "1"), ("2:4", "2:4", "6"),
        ("4:6", "0:2", "0"), ("4:6", "2:4", "5"), ("6:8", "0:2", "2"), ("6:8", "2:4", "4")]
    texts = [t.text for t in root.iter(ns + "text")]
    assert "dev 7" in texts


def test_html_is_a_standalone_page():
    page = to_html(PmapSharding.default((2, 2), 1, [5, 4]), (2, 2))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<svg" in page and "<td>5</td><td>(slice(None, None, None), 0)</td>" in page


def test_device_grid_text_svg_html():
    values = np.array([[0, 0, 3, 0], [0, 1, 0, np.nan]])
    text = render_device_grid(MESH, values, "mismatches", format="text")
    assert "mismatches" in text and "x=1" in text and "y=3" in text
    rows = [line for line in text.splitlines() if "dev" in line]
    assert [c.strip() for c in rows[0].split("│")[2:-1]] == ["dev 3", "dev 1", "dev 0", "dev 2"]
    svg = render_device_grid(MESH, values, "mismatches", format="svg")
    root = ET.fromstring(svg)
    cells = {g.get("data-device"): g.get("data-value") for g in root.iter("{http://www.w3.org/2000/svg}g")}
    assert cells == {"3": "0", "1": "0", "0": "3", "2": "0", "7": "0", "6": "1", "5": "0", "4": "-"}
    fills = {g.get("data-device"): g[0].get("fill") for g in root.iter("{http://www.w3.org/2000/svg}g")}
    assert fills["0"] == "#D73027" and fills["3"] == "#1A9850" and fills["4"] == "#BDBDBD"
    assert render_device_grid(MESH, {0: 2.5}, format="html").startswith("<!DOCTYPE html>")
    console = rich.console.Console(record=True, width=100)
    assert render_device_grid(MESH, values, "t", console=console) is None
    assert "dev 5" in console.export_text()


def test_device_grid_errors():
    with pytest.raises(ValueError, match="not in the mesh"):
        render_device_grid(MESH, {9: 1.0})
    with pytest.raises(ValueError, match=r"does not broadcast to the mesh shape \(2, 4\)"):
        render_device_grid(MESH, np.zeros(3))
    with pytest.raises(ValueError, match="format='png'"):
        render_device_grid(MESH, np.zeros((2, 4)), format="png")
    with pytest.raises(TypeError, match="shape is required"):
        refsim.visualize(NamedSharding(MESH, P()))
