"""The pictures of report.html: layout tiles and the per-device mismatch grid, as inline SVG.

`layout_svg(entry, colours)` draws a `conformance.report.failure.layout_entry` record: one
rectangle per block, its sides proportional to the block's extent (the geometry of
`jax.debug.visualize_sharding`), at a scale set by the array's size and its labels (about 24 px
per element, at most 360 x 180 px a panel), so a small array gets a small picture. A block's
colour is that of the devices that hold it (`DeviceSetColours`): the blocks of one layout always
differ, the same holders have the same colour in every picture of a failure, and a fully
replicated layout is one block in a colour of its own. Rank >= 3 is one panel per distinct
block of the leading dimensions.

`device_grid_svg(mesh, errors)` draws the mesh's devices (the last axis as columns, the leading
axes as rows) coloured by their count of mismatching elements: grey-green for none, orange to
dark red for some, so a device that disagrees never looks like one that agrees.

Both return markup with every piece of text escaped, and raise KeyError / TypeError /
ValueError on a record they cannot draw (the page says so instead).
"""
from __future__ import annotations

import colorsys
import html
import math

import numpy as np

__all__ = ["DeviceSetColours", "device_grid_svg", "id_ranges", "layout_svg"]

# Tableau's categorical colours, red left out (red is the mismatch grid's "wrong")
_PALETTE = ("#4E79A7", "#F28E2B", "#76B7B2", "#B07AA1", "#EDC948", "#9C755F", "#FF9DA7", "#59A14F",
            "#A0CBE8", "#FFBE7D", "#8CD17D", "#D4A6C8", "#BAB0AC", "#86BCB6", "#F1CE63", "#D37295")
_CHAR_W = 6.7          # px per character of 11 px monospace
_ELEM = 24.0           # px per element, before labels or the caps change it
_MAX_W, _MAX_H, _ROW_W = 360.0, 180.0, 760.0


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _text_colour(bg: str) -> str:
    r, g, b = (int(bg[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if r * 0.299 + g * 0.587 + b * 0.114 > 150 else "#ffffff"


def _text(x, y, text, *, size=11, colour="#000000", anchor="middle", weight="normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-family="monospace" font-size="{size}" fill="{colour}" '
            f'text-anchor="{anchor}" dominant-baseline="central" font-weight="{weight}">{_e(text)}</text>')


class DeviceSetColours:
    """A colour per set of device ids, given in order of first use: the palette, then golden-angle hues.

    One instance per failure, so its pictures share colours and the result depends only on the
    failure's layouts (in their order).
    """

    def __init__(self):
        self._by: dict[tuple, str] = {}

    def __call__(self, devices) -> str:
        key = tuple(sorted(int(d) for d in devices))
        if key not in self._by:
            n = len(self._by)
            colour = _PALETTE[n] if n < len(_PALETTE) else None
            used = set(self._by.values())
            while colour is None or colour in used:   # golden-angle hues, three lightnesses
                hue = (n * 0.381966 + 0.07) % 1.0
                r, g, b = colorsys.hls_to_rgb(hue, (0.62, 0.5, 0.74)[n % 3], 0.55)
                colour, n = "#" + "".join(f"{round(c * 255):02X}" for c in (r, g, b)), n + 1
            self._by[key] = colour
        return self._by[key]


def id_ranges(ids) -> str:
    """Device ids as short text: runs of consecutive ids as ``a-b`` (``0-3,6``)."""
    ids = sorted(int(i) for i in ids)
    parts, start = [], None
    for k, i in enumerate(ids):
        if start is None:
            start = i
        if k + 1 == len(ids) or ids[k + 1] != i + 1:
            parts.append(str(start) if i == start else f"{start}{',' if i == start + 1 else '-'}{i}")
            start = None
    return ",".join(parts)


# -- layouts ---------------------------------------------------------------------------
def _blocks(entry: dict) -> tuple[tuple, dict]:
    shape = tuple(int(d) for d in entry["shape"])
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    out: dict[tuple, list] = {}
    for dev, ranges in entry["blocks"].items():
        r = tuple((int(a), int(b)) for a, b in ranges)
        if len(r) != len(shape):
            raise ValueError(f"device {dev}'s block has {len(r)} ranges for a rank-{len(shape)} shape {shape}")
        out.setdefault(r, []).append(int(dev))
    if not out:
        raise ValueError("no device holds a block")
    return shape, out


def _panel_svg(blocks: dict, rows_n: int, cols_n: int, colours, x0: float, y0: float) -> tuple[list, float, float]:
    """One 2-D grid of blocks {((r0, r1), (c0, c1)): devices} at (x0, y0): its parts, width, height."""
    def label_w(devs):
        return len(id_ranges(devs)) * _CHAR_W + 8

    need_x = max(label_w(d) / max(c1 - c0, 1) for ((_, _), (c0, c1)), d in blocks.items())
    sx = min(max(_ELEM, need_x), _MAX_W / max(cols_n, 1))
    min_rows = min(max(r1 - r0, 1) for ((r0, r1), _) in blocks)
    sy = min(max(_ELEM, 18.0 / min_rows), _MAX_H / max(rows_n, 1))
    parts = []
    for ((r0, r1), (c0, c1)), devs in sorted(blocks.items()):
        bg = colours(devs)
        x, y, w, h = x0 + c0 * sx, y0 + r0 * sy, (c1 - c0) * sx, (r1 - r0) * sy
        text = id_ranges(devs)
        held = f"device{'s' if len(devs) > 1 else ''} {', '.join(map(str, sorted(devs)))}"
        tip = f"{held}: rows {r0}:{r1}, cols {c0}:{c1}"
        label = _text(x + w / 2, y + h / 2, text, colour=_text_colour(bg)) if (
            len(text) * _CHAR_W + 4 <= w and h >= 13) else ""
        parts.append(f'<g class="block" data-devices="{",".join(map(str, sorted(devs)))}" data-rows="{r0}:{r1}" '
                     f'data-cols="{c0}:{c1}"><title>{_e(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" '
                     f'width="{max(w, 1):.1f}" height="{max(h, 1):.1f}" fill="{bg}" stroke="#ffffff" '
                     f'stroke-width="1.5"/>{label}</g>')
    return parts, cols_n * sx, rows_n * sy


def layout_svg(entry: dict, colours=None) -> str:
    """The SVG of a `layout_entry` record (module docstring); `colours` a `DeviceSetColours`."""
    colours = DeviceSetColours() if colours is None else colours
    shape, blocks = _blocks(entry)
    nd = len(shape)
    lead_nd = max(nd - 2, 0)
    panels: dict[tuple, dict] = {}
    for r, devs in blocks.items():
        view = ((0, 1), (0, 1)) if nd == 0 else (((0, 1),) + r if nd == 1 else r[lead_nd:])
        panels.setdefault(r[:lead_nd], {})[view] = devs
    rows_n = shape[-2] if nd >= 2 else 1
    cols_n = shape[-1] if nd >= 1 else 1
    parts, x, y, row_h, width = [], 0.0, 0.0, 0.0, 0.0
    title_h = 16.0 if lead_nd else 0.0
    for lead in sorted(panels):
        p_parts, w, h = _panel_svg(panels[lead], max(rows_n, 1), max(cols_n, 1), colours, x, y + title_h)
        if x > 0 and x + w > _ROW_W:   # wrap: start a new row of panels
            x, y, row_h = 0.0, y + row_h + 8, 0.0
            p_parts, w, h = _panel_svg(panels[lead], max(rows_n, 1), max(cols_n, 1), colours, x, y + title_h)
        if lead_nd:
            p_parts.insert(0, _text(x, y + 7, "[" + ", ".join(f"{a}:{b}" for a, b in lead) + ", :, :]",
                                    anchor="start", colour="#444444"))
        parts += p_parts
        width, row_h = max(width, x + w), max(row_h, h + title_h)
        x += max(w, 60.0) + 12
    width, height = math.ceil(width) + 1, math.ceil(y + row_h) + 1
    title = f"{entry.get('label', '')}: shape {shape}"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="layout" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{_e(title)}</title>' + "".join(parts) + "</svg>")


# -- the per-device grid ---------------------------------------------------------------
_NONE_BG, _NONE_FG = "#E3EFE3", "#3A5A3A"
_LOW, _HIGH = (0xFD, 0xAE, 0x61), (0xB2, 0x18, 0x2B)


def _bad_colour(t: float) -> str:
    return "#" + "".join(f"{round(a + (b - a) * t):02X}" for a, b in zip(_LOW, _HIGH))


def device_grid_svg(mesh: dict, errors: dict) -> tuple[str, list[int]]:
    """The grid of `mesh` (a `mesh_entry` record) coloured by `errors` ({device id: mismatching
    elements}); also the ids in `errors` that are not in the mesh."""
    sizes = tuple(int(s) for s in mesh["axis_sizes"])
    names = tuple(str(a) for a in mesh["axis_names"])
    ids = np.asarray(mesh["device_ids"], dtype=np.int64)
    if len(names) != len(sizes) or ids.size != int(np.prod(sizes, dtype=np.int64)):
        raise ValueError(f"mesh of axis sizes {sizes} and names {names} with {ids.size} device ids")
    ids = ids.reshape(sizes) if sizes else ids.reshape(1)
    sizes, names = (sizes, names) if sizes else ((1,), ("",))
    counts = {int(d): float(v) for d, v in errors.items()}
    top = max([v for v in counts.values() if v > 0], default=0.0)
    lead = sizes[:-1]
    rows = list(np.ndindex(*lead)) if lead else [()]
    labels = [",".join(f"{a}={p}" for a, p in zip(names, pos)) for pos in rows]
    cw, ch, head = 58, 36, 18
    lw = max((len(t) for t in labels), default=0) * _CHAR_W + 10 if lead else 0
    w, h = math.ceil(lw + cw * sizes[-1]) + 2, head + ch * len(rows) + 2
    parts = [_text(lw + cw * (k + 0.5), head / 2, f"{names[-1]}={k}" if names[-1] else "", colour="#444444")
             for k in range(sizes[-1])]
    for r, (label, pos) in enumerate(zip(labels, rows)):
        if label:
            parts.append(_text(2, head + ch * (r + 0.5), label, anchor="start", colour="#444444"))
        for k in range(sizes[-1]):
            dev = int(ids[pos + (k,)])
            v = counts.get(dev, 0.0)
            bg, fg = (_NONE_BG, _NONE_FG) if v <= 0 else (_bad_colour(v / top if top else 1.0), None)
            fg = fg or _text_colour(bg)
            x, y = lw + cw * k, head + ch * r
            shown = f"{v:g}"
            parts.append(f'<g class="device" data-device="{dev}" data-value="{shown}"><title>device {dev}: '
                         f'{shown} mismatching element(s)</title><rect x="{x:.1f}" y="{y}" width="{cw}" height="{ch}" '
                         f'fill="{bg}" stroke="#ffffff" stroke-width="2"/>'
                         + _text(x + cw / 2, y + ch / 2 - 7, f"dev {dev}", size=10, colour=fg)
                         + _text(x + cw / 2, y + ch / 2 + 8, shown, colour=fg, weight="bold" if v > 0 else "normal")
                         + "</g>")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" class="grid" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
           f"<title>mismatching elements per device</title>" + "".join(parts) + "</svg>")
    outside = sorted(set(counts) - {int(d) for d in ids.ravel()})
    return svg, outside
