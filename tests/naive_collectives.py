"""Deliberately naive per-device reference collectives, written from the docstrings.

Every function loops over devices one by one (itertools.product over the mesh),
finds each device's group from first principles (its linear index over the named
axes in the given order, the other coordinates equal), and computes what the
docstring says with plain Python loops. It shares no code with refsim.collectives.
Inputs are stacked arrays; outputs are stacked arrays with full mesh dims.
"""
from __future__ import annotations

import itertools

import numpy as np


def _full(x, sizes):
    x = np.asarray(x)
    return np.broadcast_to(x, tuple(sizes) + x.shape[len(sizes):])


def _coords(sizes):
    return list(itertools.product(*[range(s) for s in sizes]))


def _lin(pos, names, all_names, sizes):
    idx = 0
    for n in names:
        a = all_names.index(n)
        idx = idx * sizes[a] + pos[a]
    return idx


def _members(pos, names, all_names, sizes, groups):
    """Devices in `pos`'s group, in group order."""
    k = 1
    for n in names:
        k *= sizes[all_names.index(n)]
    if groups is None:
        groups = [list(range(k))]
    me = _lin(pos, names, all_names, sizes)
    mine = next(g for g in groups if me in g)
    out = []
    for want in mine:
        for q in _coords(sizes):
            same_other = all(q[a] == pos[a] for a in range(len(sizes))
                             if all_names[a] not in names)
            if same_other and _lin(q, names, all_names, sizes) == want:
                out.append(q)
    return out, mine.index(me)


def _names(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def reduce(x, mesh, axis_name, op, groups=None):
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    x = _full(x, sizes)
    names = _names(axis_name)
    out = np.empty(x.shape, x.dtype)
    for pos in _coords(sizes):
        mem, _ = _members(pos, names, all_names, sizes, groups)
        acc = np.array(x[mem[0]], copy=True)
        for q in mem[1:]:
            if op == "sum":
                np.add(acc, x[q], out=acc, dtype=x.dtype, casting="unsafe")
            elif op == "max":
                acc = np.array(np.maximum(acc, x[q]))
            else:
                acc = np.array(np.minimum(acc, x[q]))
        out[pos] = acc
    return out


def all_gather(x, mesh, axis_name, axis, tiled, groups=None):
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    x = _full(x, sizes)
    names = _names(axis_name)
    res = {}
    for pos in _coords(sizes):
        mem, _ = _members(pos, names, all_names, sizes, groups)
        parts = [x[q] for q in mem]
        res[pos] = np.concatenate(parts, axis=axis) if tiled else np.stack(parts, axis=axis)
    return _assemble(res, sizes)


def reduce_scatter(x, mesh, axis_name, dim, tiled, groups=None):
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    total = reduce(x, mesh, axis_name, "sum", groups)
    names = _names(axis_name)
    res = {}
    for pos in _coords(sizes):
        mem, j = _members(pos, names, all_names, sizes, groups)
        blocks = np.split(total[pos], len(mem), axis=dim)
        res[pos] = blocks[j] if tiled else np.squeeze(blocks[j], axis=dim)
    return _assemble(res, sizes)


def all_to_all(x, mesh, axis_name, split_axis, concat_axis, groups=None):
    """Primitive semantics: block i of sender j goes to member i, concatenated by sender."""
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    x = _full(x, sizes)
    names = _names(axis_name)
    res = {}
    for pos in _coords(sizes):
        mem, i = _members(pos, names, all_names, sizes, groups)
        recv = [np.split(x[q], len(mem), axis=split_axis)[i] for q in mem]
        res[pos] = np.concatenate(recv, axis=concat_axis)
    return _assemble(res, sizes)


def ppermute(x, mesh, axis_name, perm):
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    x = _full(x, sizes)
    names = _names(axis_name)
    out = np.zeros(x.shape, x.dtype)
    for pos in _coords(sizes):
        me = _lin(pos, names, all_names, sizes)
        for src, dst in perm:
            if dst == me:
                for q in _coords(sizes):
                    same = all(q[a] == pos[a] for a in range(len(sizes))
                               if all_names[a] not in names)
                    if same and _lin(q, names, all_names, sizes) == src:
                        out[pos] = x[q]
    return out


def pbroadcast(x, mesh, axis_name, source):
    perm_all = None
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    x = _full(x, sizes)
    names = _names(axis_name)
    out = np.empty(x.shape, x.dtype)
    for pos in _coords(sizes):
        mem, _ = _members(pos, names, all_names, sizes, perm_all)
        out[pos] = x[mem[source]]
    return out


def axis_index(mesh, axis_name):
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    out = np.empty(tuple(sizes), np.int32)
    for pos in _coords(sizes):
        out[pos] = _lin(pos, _names(axis_name), all_names, sizes)
    return out


def ragged_all_to_all(operand, output, in_off, send, out_off, recv, mesh, axis_name, groups=None):
    sizes, all_names = mesh.axis_sizes, mesh.axis_names
    operand, in_off, send, out_off = (_full(a, sizes) for a in (operand, in_off, send, out_off))
    out = np.array(_full(output, sizes))
    names = _names(axis_name)
    for pos in _coords(sizes):  # pos is the sender
        mem, _ = _members(pos, names, all_names, sizes, groups)
        n = in_off.shape[-1]
        spd = n // len(mem)
        for i in range(n):
            dst = mem[i // spd]
            s = int(send[pos][i])
            rows = operand[pos][int(in_off[pos][i]):int(in_off[pos][i]) + s]
            out[dst][int(out_off[pos][i]):int(out_off[pos][i]) + s] = rows
    return out


def _assemble(res, sizes):
    first = next(iter(res.values()))
    out = np.empty(tuple(sizes) + first.shape, first.dtype)
    for pos, v in res.items():
        out[pos] = v
    return out
