"""Shardy meshes and shardings in a module, and moving values into and out of manual regions.

`sdy.manual_computation` hands each device the block of its operands that the in_shardings'
manual axes select and rebuilds global values from the blocks by the out_shardings. Both
moves are one fancy-index call over all devices (no loop over devices): device p reads the
block whose index along each dimension is its coordinate (row-major over the axes that shard
that dimension, major to minor), as `NamedSharding` lays out blocks.
"""
from __future__ import annotations

import re

import numpy as np

from refsim.layouts.mesh import Mesh

_AXIS = re.compile(r'"((?:[^"\\]|\\.)*)"\s*=\s*(\d+)')


def parse_mesh(text: str) -> Mesh:
    """`<["x"=2, "y"=4], device_ids=[...]>` (the body of `sdy.mesh` / `#sdy.mesh<...>`) as a refsim
    Mesh whose device ids are partition ids (iota when the mesh lists none)."""
    axes_part = text.split("device_ids", 1)[0]
    axes = [(n, int(s)) for n, s in _AXIS.findall(axes_part)]
    names = tuple(n for n, _ in axes)
    sizes = tuple(s for _, s in axes)
    m = re.search(r"device_ids\s*=\s*\[([^\]]*)\]", text)
    ids = None
    if m:
        ids = np.array([int(v) for v in m.group(1).split(",") if v.strip()], dtype=np.int64)
        ids = ids.reshape(sizes) if ids.size == int(np.prod(sizes, dtype=np.int64)) else None
    if not names:
        return Mesh((1,), ("_maximal",))
    return Mesh(sizes, names, device_ids=ids)


def _top_level_groups(text: str, open_: str, close: str) -> list[str]:
    out, depth, start = [], 0, None
    for i, ch in enumerate(text):
        if ch == open_:
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                out.append(text[start:i])
    return out


def parse_sharding(text: str, meshes: dict) -> tuple[Mesh, list[list[str]]]:
    """One `<@mesh, [{"x"}, {}]>` (or inline `mesh<...>`) as (mesh, axes of each dimension)."""
    inline = re.search(r"mesh<(\[.*?\](?:,\s*device_ids=\[[^\]]*\])?)>", text)
    if inline:
        mesh = parse_mesh(inline.group(1))
        rest = text[inline.end():]
    else:
        m = re.search(r"@([\w.$-]+)", text)
        if not m or m.group(1) not in meshes:
            raise ValueError(f"refsim.stablehlo: sharding {text!r} names no sdy.mesh of the module "
                             f"(meshes: {sorted(meshes)}).")
        mesh = parse_mesh(meshes[m.group(1)])
        rest = text[m.end():]
    dims_text = _top_level_groups(rest, "[", "]")
    dims = [] if not dims_text else [re.findall(r'"((?:[^"\\]|\\.)*)"', d) for d in _top_level_groups(dims_text[0], "{", "}")]
    return mesh, dims


def parse_per_value(text: str, meshes: dict) -> list:
    """`#sdy.sharding_per_value<[<@mesh, [...]>, ...]>` as a list of (mesh, dims)."""
    inner = text[text.index("[") + 1:text.rindex("]")] if "[" in text else ""
    return [parse_sharding("<" + s + ">", meshes) for s in _top_level_groups(inner, "<", ">")]


def parse_axes(text) -> list[str]:
    """`#sdy<manual_axes{"x", "y"}>` (or a list of names) as the list of names."""
    if isinstance(text, (list, tuple)):
        return [str(t) for t in text]
    return re.findall(r'"((?:[^"\\]|\\.)*)"', text)


def _coords(mesh: Mesh) -> tuple[np.ndarray, ...]:
    """Mesh coordinates of every partition id 0..N-1 (one array per mesh axis)."""
    ids = np.asarray(mesh.device_ids).reshape(-1)
    pos = np.empty(ids.size, dtype=np.int64)
    pos[ids] = np.arange(ids.size)
    return np.unravel_index(pos, mesh.axis_sizes)


def _dim_axes(mesh: Mesh, dims, manual) -> list[list[int]]:
    return [[mesh.axis_names.index(a) for a in axes if a in manual] for axes in dims]


def _block_index(coords, mesh: Mesh, axes: list[int]) -> np.ndarray:
    b = np.zeros_like(coords[0])
    for k in axes:
        b = b * mesh.axis_sizes[k] + coords[k]
    return b


def split(x: np.ndarray, mesh: Mesh, dims, manual) -> np.ndarray:
    """Each device's block of stacked value `x` (leading device dim N or 1, then the global
    shape) along the `manual` axes of `dims`; returns (N, *block) (x itself if nothing splits)."""
    axes = _dim_axes(mesh, dims, manual)
    if not any(axes):
        return x
    n = mesh.size
    coords = _coords(mesh)
    g = x.shape[1:]
    total = 1 + len(g)
    idx = [(np.arange(n) if x.shape[0] == n else np.zeros(n, np.int64)).reshape((n,) + (1,) * len(g))]
    out_shape = []
    for d, ks in enumerate(axes):
        parts = int(np.prod([mesh.axis_sizes[k] for k in ks], dtype=np.int64))
        if g[d] % parts:
            raise ValueError(f"refsim.stablehlo: dimension {d} of size {g[d]} is not divisible by the "
                             f"{parts} blocks its sharding asks for.")
        blk = g[d] // parts
        out_shape.append(blk)
        shape = [1] * total
        shape[0], shape[1 + d] = n, blk
        start = _block_index(coords, mesh, ks) * blk
        idx.append((start[:, None] + np.arange(blk)[None, :]).reshape(shape))
    return x[tuple(idx)]


def join(y: np.ndarray, mesh: Mesh, dims, manual) -> np.ndarray:
    """Inverse of `split`: device p's global value takes each block from the device with p's own
    coordinates except along the axes that shard that block's dimensions (an axis the sharding
    does not name keeps p's own block, as the partitioned program does)."""
    axes = _dim_axes(mesh, dims, manual)
    if not any(axes):
        return y
    n = mesh.size
    local = y.shape[1:]
    coords = list(_coords(mesh))
    nd = len(local)
    gshape = []
    # q[p, b_0, ..., b_{nd-1}]: the device holding block (b_d) for device p
    full = [c.reshape((n,) + (1,) * nd) for c in coords]
    for d, ks in enumerate(axes):
        parts = int(np.prod([mesh.axis_sizes[k] for k in ks], dtype=np.int64))
        gshape.append(local[d] * parts)
        b = np.arange(parts).reshape((1,) + tuple(parts if i == d else 1 for i in range(nd)))
        stride = parts
        for k in ks:
            stride //= mesh.axis_sizes[k]
            full[k] = np.broadcast_to((b // stride) % mesh.axis_sizes[k], b.shape)
    parts_shape = (n,) + tuple(g // l for g, l in zip(gshape, local))
    full = [np.broadcast_to(f, parts_shape) for f in full]
    q = np.asarray(mesh.device_ids).reshape(mesh.axis_sizes)[tuple(full)]  # (n, parts_0, ...)
    if y.shape[0] == 1:
        q = np.zeros_like(q)
    sel = [np.arange(n).reshape((n,) + (1,) * nd)]
    within = []
    for d in range(nd):
        gi = np.arange(gshape[d])
        shape = [1] * (1 + nd)
        shape[1 + d] = gshape[d]
        sel.append((gi // local[d]).reshape(shape))
        within.append((gi % local[d]).reshape(shape))
    return y[(q[tuple(sel)], *within)]
