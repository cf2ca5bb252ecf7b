"""Pictures of layouts for people: terminal grids (rich), SVG and HTML.

`visualize(sharding, shape)` draws the array as a grid of blocks, each labelled
with the ids of the devices holding it, with the geometry of
`jax.debug.visualize_sharding` (block widths and heights proportional to the
block sizes). Rank 1 and 2 are drawn as one grid; rank 0 as one block; rank >= 3
as one 2-D grid of the last two dimensions per distinct block of the leading
dimensions, each titled with its leading index ranges.
`render_device_grid(mesh, values, title)` colours each device of a mesh by a
per-device number (for example the count of mismatching elements).
"""
from __future__ import annotations

import html
import io
from typing import Any

import numpy as np

# tab20b, the colour map jax.debug.visualize_sharding uses when matplotlib is present
_PALETTE = (
    "#393B79", "#5254A3", "#6B6ECF", "#9C9EDE", "#637939", "#8CA252", "#B5CF6B", "#CEDB9C",
    "#8C6D31", "#BD9E39", "#E7BA52", "#E7CB94", "#843C39", "#AD494A", "#D6616B", "#E7969C",
    "#7B4173", "#A55194", "#CE6DBD", "#DE9ED6",
)


def _text_color(bg: str) -> str:
    r, g, b = (int(bg[i:i + 2], 16) for i in (1, 3, 5))
    return "#000000" if r * 0.299 + g * 0.587 + b * 0.114 > 186 else "#ffffff"


def _block_colors(n: int) -> list[str]:
    """n colours spread over the palette, neighbours far apart (as JAX steps through its map)."""
    values = np.linspace(0, 1, n) if n > 1 else np.zeros(1)
    out, idx = [], 0
    for _ in range(n):
        out.append(_PALETTE[min(int(values[idx] * len(_PALETTE)), len(_PALETTE) - 1)])
        idx = (idx + n // 2 + (n % 2 == 0)) % n
    return out


# -- layout analysis -------------------------------------------------------------

def _ranges(index: tuple, shape: tuple) -> tuple:
    """(start, stop) per dimension; an int index (pmap's Unstacked) is the range [i, i+1)."""
    out = []
    for i, n in zip(index, shape):
        if isinstance(i, slice):
            start, stop, _ = i.indices(n)
            out.append((start, stop))
        else:
            out.append((int(i), int(i) + 1))
    return tuple(out)


class _Grid:
    """The 2-D block grid of one panel: row/col bounds and the device ids of each block."""

    def __init__(self, title: str, rows: list, cols: list, devices: dict):
        self.title, self.rows, self.cols, self.devices = title, rows, cols, devices


def _panels(sharding, shape) -> list[_Grid]:
    shape = tuple(int(d) for d in shape)
    index_map = sharding.devices_indices_map(shape)
    if len(shape) == 0:
        return [_Grid("", [(0, 1)], [(0, 1)], {(0, 0): sorted(index_map)})]
    view = shape if len(shape) >= 2 else (1,) + shape
    lead_nd = len(view) - 2
    by_panel: dict[tuple, dict] = {}
    for dev, index in index_map.items():
        r = _ranges(index, shape)
        r = r if len(shape) >= 2 else ((0, 1),) + r
        by_panel.setdefault(r[:lead_nd], {}).setdefault(r[lead_nd:], []).append(dev)
    panels = []
    for lead in sorted(by_panel):
        blocks = by_panel[lead]
        rows = sorted({b[0] for b in blocks})
        cols = sorted({b[1] for b in blocks})
        devs = {(rows.index(b[0]), cols.index(b[1])): sorted(d) for b, d in blocks.items()}
        title = ""
        if lead_nd:
            title = "[" + ", ".join(f"{a}:{b}" for a, b in lead) + ", :, :]"
        panels.append(_Grid(title, rows, cols, devs))
    return panels


def _label(device_kind: str, ids) -> str:
    body = ",".join(str(i) for i in ids)
    return f"{device_kind} {body}" if device_kind else body


def _resolve(sharding, shape):
    if shape is None:
        if hasattr(sharding, "sharding") and hasattr(sharding, "shape"):  # an Array
            return sharding.sharding, tuple(sharding.shape)
        raise TypeError("visualize(sharding, shape): shape is required unless the first argument is an Array.")
    return sharding, tuple(int(d) for d in shape)


# -- terminal (rich) ---------------------------------------------------------------

def _rich_tables(sharding, shape, *, use_color, scale, min_width, max_width, device_kind):
    import rich.align
    import rich.box
    import rich.padding
    import rich.style
    import rich.table
    import rich.text

    panels = _panels(sharding, shape)
    nrow_total = shape[-2] if len(shape) >= 2 else 1
    ncol_total = shape[-1] if len(shape) >= 1 else 1
    base_height = int(10 * scale)
    aspect = (shape[-1] / shape[-2]) if len(shape) >= 2 else (1 / max(ncol_total, 1))
    base_width = int(base_height * aspect)
    out = []
    for panel in panels:
        colors = iter(_block_colors(len(panel.rows) * len(panel.cols)))
        table = rich.table.Table(show_header=False, show_lines=not use_color, padding=0, pad_edge=False,
                                 highlight=not use_color, box=None if use_color else rich.box.SQUARE)
        fit = (max_width - len(panel.cols) - 1) // max(len(panel.cols), 1)
        for i, (r0, r1) in enumerate(panel.rows):
            cells = []
            for j, (c0, c1) in enumerate(panel.cols):
                entry = _label(device_kind, panel.devices.get((i, j), []))
                width = int((c1 - c0) / max(ncol_total, 1) * base_width * 2.5)
                width = min(max(width, min_width), max_width)
                if width > fit:
                    # JAX lets a wide grid overflow the console and rich then truncates the labels;
                    # refsim narrows the blocks so every label stays readable
                    width = min(width, max(fit, len(entry) + 2))
                height = int((r1 - r0) / max(nrow_total, 1) * base_height) if len(shape) >= 2 else 1
                left, rem = divmod(width - len(entry) - 2, 2)
                right = left + rem
                top, rem = divmod(height - 2, 2)
                bottom = top + rem
                style = rich.style.Style()
                if use_color:
                    bg = next(colors)
                    style = rich.style.Style(bgcolor=bg, color=_text_color(bg))
                    top, bottom, left, right = top + 1, bottom + 1, left + 1, right + 1
                pad = (max(top, 0), max(right, 0), max(bottom, 0), max(left, 0))
                cells.append(rich.padding.Padding(rich.align.Align(entry, "center", vertical="middle"), pad,
                                                  style=style))
            table.add_row(*cells)
        out.append((panel.title, table))
    return out


def visualize(sharding, shape=None, *, use_color: bool = True, scale: float = 1.0, min_width: int = 9,
              max_width: int = 80, device_kind: str = "dev", console=None) -> None:
    """Print the layout of an array of `shape` under `sharding` as a grid, as `jax.debug.visualize_sharding`.

    Each block is labelled `"{device_kind} {ids}"` with the ids of the devices
    holding it (device_kind="CPU" reproduces JAX's text). `sharding` may be a
    refsim Array, then `shape` is its shape. Prints to `console` (a rich
    Console) or stdout.
    """
    import rich.console

    sharding, shape = _resolve(sharding, shape)
    console = console or rich.console.Console(width=max_width)
    use_color = use_color and console.color_system is not None
    for title, table in _rich_tables(sharding, shape, use_color=use_color, scale=scale, min_width=min_width,
                                     max_width=max_width, device_kind=device_kind):
        if title:
            console.print(title)
        console.print(table, end="\n\n")


def to_text(sharding, shape=None, *, scale: float = 1.0, min_width: int = 9, max_width: int = 80,
            device_kind: str = "dev") -> str:
    """The uncoloured text `visualize` prints (box lines between blocks), as a string."""
    import rich.console

    buf = io.StringIO()
    console = rich.console.Console(file=buf, width=max_width, color_system=None, force_terminal=False)
    visualize(sharding, shape, use_color=False, scale=scale, min_width=min_width, max_width=max_width,
              device_kind=device_kind, console=console)
    return buf.getvalue()


# -- SVG / HTML ----------------------------------------------------------------------

def _svg_text(x, y, text, *, size=13, color="#000000", anchor="middle", weight="normal"):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-family="monospace" font-size="{size}" fill="{color}" '
            f'text-anchor="{anchor}" dominant-baseline="middle" font-weight="{weight}">{html.escape(text)}</text>')


def to_svg(sharding, shape=None, *, width: int = 480, device_kind: str = "dev", title: str | None = None) -> str:
    """A standalone SVG of the layout: one rectangle per block, sized by its extent, labelled with its devices.

    Each block is an `<g class="block" data-devices="0,4" data-rows="a:b" data-cols="c:d">` group.
    """
    sharding, shape = _resolve(sharding, shape)
    title = f"shape {shape}  {sharding!r}" if title is None else title
    panels = _panels(sharding, shape)
    nrows = shape[-2] if len(shape) >= 2 else 1
    ncols = shape[-1] if len(shape) >= 1 else 1
    grid_h = 48 if len(shape) < 2 else int(min(max(width * nrows / max(ncols, 1), 48), 2 * width))
    caption_h, panel_gap = 24, 28
    parts, y = [], caption_h
    for panel in panels:
        if panel.title:
            parts.append(_svg_text(4, y + 10, panel.title, size=12, anchor="start"))
            y += 20
        colors = iter(_block_colors(len(panel.rows) * len(panel.cols)))
        for i, (r0, r1) in enumerate(panel.rows):
            for j, (c0, c1) in enumerate(panel.cols):
                ids = panel.devices.get((i, j), [])
                bg = next(colors)
                x0, x1 = width * c0 / ncols, width * c1 / ncols
                y0 = y + (grid_h * r0 / nrows if len(shape) >= 2 else 0)
                y1 = y + (grid_h * r1 / nrows if len(shape) >= 2 else grid_h)
                ids_s = ",".join(map(str, ids))
                parts.append(
                    f'<g class="block" data-devices="{ids_s}" data-rows="{r0}:{r1}" data-cols="{c0}:{c1}">'
                    f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" '
                    f'fill="{bg}" stroke="#ffffff" stroke-width="2"/>'
                    + _svg_text((x0 + x1) / 2, (y0 + y1) / 2, _label(device_kind, ids), color=_text_color(bg))
                    + "</g>"
                )
        y += grid_h + panel_gap
    total_h = y - panel_gap + 4
    head = _svg_text(4, 12, title, size=12, anchor="start")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h:.0f}" '
            f'viewBox="0 0 {width} {total_h:.0f}"><title>{html.escape(title)}</title>{head}'
            + "".join(parts) + "</svg>")


def _html_page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title)
            + "</title><style>body{font-family:sans-serif} table{border-collapse:collapse} "
            "td,th{border:1px solid #999;padding:2px 6px;font-family:monospace}</style></head><body>\n"
            + body + "\n</body></html>\n")


def to_html(sharding, shape=None, *, width: int = 480, device_kind: str = "dev") -> str:
    """A standalone HTML page: the SVG picture and a table of each device's index."""
    sharding, shape = _resolve(sharding, shape)
    title = f"shape {shape}  {sharding!r}"
    rows = "".join(
        f"<tr><td>{dev}</td><td>{html.escape(repr(idx))}</td></tr>"
        for dev, idx in sharding.devices_indices_map(shape).items()
    )
    body = (f"<h3>{html.escape(title)}</h3>\n" + to_svg(sharding, shape, width=width, device_kind=device_kind)
            + f"\n<table><tr><th>device</th><th>index</th></tr>{rows}</table>")
    return _html_page(title, body)


# -- per-device values on a mesh ----------------------------------------------------

_SCALE = ("#1A9850", "#FEE08B", "#D73027")  # low (green) .. high (red)
_MISSING = "#BDBDBD"


def _scale_color(t: float) -> str:
    """Green -> yellow -> red for t in [0, 1]."""
    seg = 0 if t <= 0.5 else 1
    u = t * 2 - seg
    a, b = _SCALE[seg], _SCALE[seg + 1]
    rgb = [round(int(a[k:k + 2], 16) * (1 - u) + int(b[k:k + 2], 16) * u) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02X}" for c in rgb)


def _device_values(mesh, values) -> np.ndarray:
    """float array of mesh shape from a {device_id: value} dict or an array (size-1 dims broadcast)."""
    if isinstance(values, dict):
        unknown = set(values) - set(mesh.device_set)
        if unknown:
            raise ValueError(f"values names devices {sorted(unknown)} that are not in the mesh {mesh!r}.")
        lookup = np.vectorize(lambda d: float(values.get(int(d), np.nan)), otypes=[float])
        return lookup(mesh.device_ids)
    arr = np.asarray(values, dtype=float)
    try:
        return np.broadcast_to(arr, mesh.axis_sizes)
    except ValueError:
        raise ValueError(
            f"values has shape {arr.shape}, which does not broadcast to the mesh shape {mesh.axis_sizes}; "
            "pass one value per device (mesh shape) or a {device_id: value} dict."
        ) from None


def _mesh_rows(mesh):
    """(row labels, rows of mesh positions): the last axis is the columns, leading axes flattened to rows."""
    sizes = mesh.axis_sizes
    lead = sizes[:-1]
    labels, rows = [], []
    for pos in np.ndindex(*lead) if lead else [()]:
        labels.append(",".join(f"{a}={p}" for a, p in zip(mesh.axis_names, pos)))
        rows.append([pos + (k,) for k in range(sizes[-1])])
    return labels, rows


def render_device_grid(mesh, values, title: str = "", *, format: str = "terminal", console=None,
                       fmt: str = "{:g}") -> Any:
    """Draw `mesh`'s devices as a grid coloured by a per-device number, low green to high red.

    Columns are the last mesh axis; the leading axes are flattened into rows,
    each labelled with its coordinates. Each cell shows the device id and its
    value (missing/NaN: grey). `values`: an array of the mesh shape or a
    {device_id: value} dict. format: "terminal" prints with rich (returns None),
    "text" returns uncoloured text, "svg" and "html" return standalone markup.
    """
    if format not in ("terminal", "text", "svg", "html"):
        raise ValueError(f"format={format!r}; use 'terminal', 'text', 'svg' or 'html'.")
    vals = _device_values(mesh, values)
    finite = vals[np.isfinite(vals)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)

    def color(v):
        if not np.isfinite(v):
            return _MISSING
        return _scale_color(0.0 if hi == lo else (v - lo) / (hi - lo))

    labels, rows = _mesh_rows(mesh)
    last = mesh.axis_names[-1]
    if format in ("svg", "html"):
        cw, ch, lw, top = 72, 44, 90 if mesh.ndim > 1 else 0, 44
        w, h = lw + cw * mesh.axis_sizes[-1] + 4, top + ch * len(rows) + 4
        parts = [_svg_text(4, 12, title, size=13, anchor="start", weight="bold")]
        for k in range(mesh.axis_sizes[-1]):
            parts.append(_svg_text(lw + cw * (k + 0.5), top - 10, f"{last}={k}", size=11))
        for r, (label, row) in enumerate(zip(labels, rows)):
            if label:
                parts.append(_svg_text(4, top + ch * (r + 0.5), label, size=11, anchor="start"))
            for k, pos in enumerate(row):
                v, dev, bg = vals[pos], int(mesh.device_ids[pos]), color(vals[pos])
                x0, y0 = lw + cw * k, top + ch * r
                shown = fmt.format(v) if np.isfinite(v) else "-"
                parts.append(
                    f'<g class="device" data-device="{dev}" data-value="{shown}"><rect x="{x0}" y="{y0}" '
                    f'width="{cw}" height="{ch}" fill="{bg}" stroke="#ffffff" stroke-width="2"/>'
                    + _svg_text(x0 + cw / 2, y0 + ch / 2 - 8, f"dev {dev}", size=11, color=_text_color(bg))
                    + _svg_text(x0 + cw / 2, y0 + ch / 2 + 9, shown, size=12, color=_text_color(bg))
                    + "</g>"
                )
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
               f"<title>{html.escape(title)}</title>" + "".join(parts) + "</svg>")
        return svg if format == "svg" else _html_page(title or "device grid", svg)

    import rich.console
    import rich.table
    import rich.text

    plain = format == "text"
    table = rich.table.Table(title=title or None, show_lines=True, box=None if not plain else None)
    if plain:
        import rich.box

        table.box = rich.box.SQUARE
    if mesh.ndim > 1:
        table.add_column("")
    for k in range(mesh.axis_sizes[-1]):
        table.add_column(f"{last}={k}", justify="center")
    for label, row in zip(labels, rows):
        cells = []
        for pos in row:
            v, dev = vals[pos], int(mesh.device_ids[pos])
            shown = fmt.format(v) if np.isfinite(v) else "-"
            style = None if plain else f"{_text_color(color(v))} on {color(v)}"
            cells.append(rich.text.Text(f"dev {dev}\n{shown}", style=style or "", justify="center"))
        table.add_row(*(([label] if mesh.ndim > 1 else []) + cells))
    if plain:
        buf = io.StringIO()
        rich.console.Console(file=buf, width=200, color_system=None, force_terminal=False).print(table)
        return buf.getvalue()
    (console or rich.console.Console()).print(table)
    return None


# `refsim.visualize` is this function once refsim is imported (the package re-exports it over the
# module's name), so its companions are reachable from it too: refsim.visualize.to_svg(...) works
# whichever of the two a caller holds.
visualize.to_text = to_text
visualize.to_svg = to_svg
visualize.to_html = to_html
visualize.render_device_grid = render_device_grid
