"""The page's pictures: layout tiles sized to the array and coloured by holders, the mismatch grid."""
import html.parser

import numpy as np
import pytest

from conformance.report.failure import layout_entry, mesh_entry
from conformance.report.pictures import DeviceSetColours, device_grid_svg, id_ranges, layout_svg
from refsim import Mesh, NamedSharding
from refsim import PartitionSpec as P

MESH = Mesh((2, 4), ("x", "y"), device_ids=np.array([[3, 1, 0, 2], [7, 6, 5, 4]]))


def _tags(svg):
    out = []

    class _P(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            out.append((tag, dict(attrs)))

    _P().feed(svg)
    return out


def _blocks(svg):
    """[(devices, fill)] of each block, in drawing order."""
    tags, out = _tags(svg), []
    for k, (t, a) in enumerate(tags):
        if t == "g" and a.get("class") == "block":
            out.append((a["data-devices"], next(b["fill"] for u, b in tags[k:] if u == "rect")))
    return out


def _size(svg):
    a = _tags(svg)[0][1]
    return float(a["width"]), float(a["height"])


def test_id_ranges():
    assert id_ranges([3, 0, 1, 2, 6]) == "0-3,6"
    assert id_ranges([0, 1, 4, 5, 6]) == "0,1,4-6"
    assert id_ranges([7]) == "7" and id_ranges([]) == ""


def test_colours_follow_the_holders_across_pictures():
    colours = DeviceSetColours()
    a = _blocks(layout_svg(layout_entry("in", NamedSharding(MESH, P("x", "y")), (8, 4)), colours))
    b = _blocks(layout_svg(layout_entry("out", NamedSharding(MESH, P(("y", "x"))), (8,)), colours))
    assert len({f for _, f in a}) == 8
    by_devices = dict(a)
    assert all(by_devices[d] == f for d, f in b)          # device d's block is d's colour in both
    repl = _blocks(layout_svg(layout_entry("r", NamedSharding(MESH, P()), (8, 4)), colours))
    assert len(repl) == 1 and repl[0][1] not in {f for _, f in a}


def test_colours_stay_distinct_past_the_palette():
    colours = DeviceSetColours()
    got = [colours([d]) for d in range(300)]
    assert len(set(got)) == 300 and colours([5]) == got[5] and colours((5,)) == got[5]


def test_tiles_are_small_for_small_arrays_and_capped_for_big_ones():
    small = _size(layout_svg(layout_entry("s", NamedSharding(MESH, P("y")), (4,))))
    mid = _size(layout_svg(layout_entry("m", NamedSharding(MESH, P("x", "y")), (8, 4))))
    big = _size(layout_svg(layout_entry("b", NamedSharding(MESH, P("x", "y")), (100000, 3000))))
    assert small[0] <= 130 and small[1] <= 30, small
    assert mid[0] < 130 and mid[1] <= 181, mid
    assert big[0] <= 361 and big[1] <= 181, big


def test_rank_3_draws_a_panel_per_leading_block_and_rank_0_one_block():
    svg = layout_svg(layout_entry("r3", NamedSharding(MESH, P("x", None, "y")), (2, 3, 4)))
    assert "[0:1, :, :]" in svg and "[1:2, :, :]" in svg and len(_blocks(svg)) == 8
    svg0 = layout_svg(layout_entry("r0", NamedSharding(MESH, P()), ()))
    assert _blocks(svg0)[0][0] == "0,1,2,3,4,5,6,7"


def test_labels_that_do_not_fit_leave_a_tooltip():
    svg = layout_svg(layout_entry("b", NamedSharding(MESH, P(None, ("x", "y"))), (2, 8)))
    assert "<title>device 3: rows 0:2, cols 0:1</title>" in svg


@pytest.mark.parametrize("bad", [{"shape": [4], "blocks": {"0": [[0, 4], [0, 1]]}},
                                 {"shape": [4], "blocks": {}}, {"shape": [4]}])
def test_a_record_that_cannot_be_drawn_raises(bad):
    with pytest.raises((KeyError, ValueError)):
        layout_svg(bad)


def test_grid_colours_a_device_that_disagrees_never_like_one_that_agrees():
    # every device off by the same count: the old scale (lowest = green) drew them all green
    svg, outside = device_grid_svg(mesh_entry(MESH), {str(d): 1 for d in range(8)})
    fills = {a["fill"] for t, a in _tags(svg) if t == "rect"}
    assert outside == [] and len(fills) == 1 and fills != {"#E3EFE3"}
    svg, outside = device_grid_svg(mesh_entry(MESH), {"6": 4, "2": 1, "9": 3})
    tags = _tags(svg)
    cells = {}
    for k, (t, a) in enumerate(tags):
        if t == "g" and a.get("class") == "device":
            cells[a["data-device"]] = (a["data-value"], next(b["fill"] for u, b in tags[k:] if u == "rect"))
    assert outside == [9] and cells["6"][0] == "4" and cells["3"] == ("0", "#E3EFE3")
    assert len({cells["6"][1], cells["2"][1], cells["3"][1]}) == 3
    assert "x=1" in svg and "y=3" in svg


def test_grid_rejects_a_mesh_whose_ids_do_not_fit():
    with pytest.raises(ValueError, match="device ids"):
        device_grid_svg({"axis_sizes": [2, 2], "axis_names": ["x", "y"], "device_ids": [0, 1, 2]}, {"0": 1})
