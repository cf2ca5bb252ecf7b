"""Shardy (`sdy` dialect) text for meshes and NamedShardings.

`#sdy.sharding<@mesh, [{"x"}, {}]>` lists, per array dimension, the mesh axes
that shard it (major to minor); `{}` is a closed replicated dimension, `{?}` an
open one the partitioner may still shard, and `{"x", ?}` is sharded by "x" and
open to more axes. `replicated={...}` / `unreduced={...}` name axes, in mesh
order. This is the text JAX's `NamedSharding._to_sdy_sharding(ndim).build()`
prints (and what `jax.jit(...).lower(...).as_text()` shows with `@mesh`).
"""
from __future__ import annotations

import numpy as np

from refsim.layouts.partition_spec import UNCONSTRAINED


def _quote(name: str) -> str:
    """A string literal as MLIR prints it (`llvm::printEscapedString`), so names match JAX's text.

    Each UTF-8 byte that is printable ASCII stays as is, except `"` and `\\`; a backslash is
    doubled; every other byte (`"`, newline, tab, non-ASCII) is `\\` and two uppercase hex digits.
    """
    out = []
    for b in str(name).encode("utf-8"):
        if b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F and b != 0x22:
            out.append(chr(b))
        else:
            out.append("\\%02X" % b)
    return '"' + "".join(out) + '"'


def _axes_list(axes) -> str:
    return "{" + ", ".join(_quote(a) for a in axes) + "}"


def mesh_body(mesh, *, device_ids: bool = True) -> str:
    """`<["x"=2, "y"=4]>`, with `, device_ids=[...]` when the mesh's ids are not 0..n-1 in order.

    Shardy omits device_ids for the iota order, as its printer does. JAX's own
    lowering never writes them for a `Mesh` (the order travels in the device
    assignment); pass `device_ids=False` for that form.
    """
    axes = ", ".join(f"{_quote(n)}={s}" for n, s in zip(mesh.axis_names, mesh.axis_sizes))
    ids = getattr(mesh, "device_ids", None)
    tail = ""
    if device_ids and ids is not None and not np.array_equal(ids.ravel(), np.arange(ids.size)):
        tail = ", device_ids=[" + ", ".join(str(int(i)) for i in ids.ravel()) + "]"
    return f"<[{axes}]{tail}>"


def mesh_to_shardy(mesh, *, device_ids: bool = True) -> str:
    """The mesh attribute text, e.g. `#sdy.mesh<["x"=2, "y"=4]>`."""
    return "#sdy.mesh" + mesh_body(mesh, device_ids=device_ids)


def mesh_op(mesh, name: str = "mesh", *, device_ids: bool = True) -> str:
    """The module-level mesh definition, e.g. `sdy.mesh @mesh = <["x"=2, "y"=4]>`."""
    return f"sdy.mesh @{name} = " + mesh_body(mesh, device_ids=device_ids)


def named_to_shardy(sharding, ndim: int | None = None, *, mesh_name: str | None = "mesh",
                    open_dims: bool = False, modify_wrt_axis_types: bool = False) -> str:
    """`#sdy.sharding<@mesh, [...]>` for a NamedSharding of rank `ndim` (default: the spec's length).

    Follows JAX's `named_sharding_to_sdy_sharding`: `UNCONSTRAINED` dims are open,
    `spec.unreduced` becomes `unreduced={...}` (`reduced` is not printed).
    `open_dims=True` opens every dimension. `modify_wrt_axis_types=True` is JAX's
    flag of that name: if any mesh axis is Auto, every dim is opened and unused
    Explicit axes are listed as `replicated={...}`. `mesh_name=None` writes the
    mesh inline (`mesh<[...]>`), as JAX's unlowered attribute prints.
    """
    spec = sharding.spec
    if ndim is None:
        ndim = len(spec)
    if len(spec) > ndim:
        raise ValueError(
            f"Sharding {sharding!r} is only valid for values of rank at least {len(spec)}, but "
            f"to_shardy was called with ndim={ndim}; pass the array's rank."
        )
    mesh = sharding.mesh
    dims = []
    for d in range(ndim):
        entry = spec[d] if d < len(spec) else None
        axes = spec.axes_of(d)
        dims.append([axes, entry is UNCONSTRAINED or open_dims])
    replicated: tuple = ()
    if modify_wrt_axis_types and any(t.name == "Auto" for t in mesh.axis_types):
        for dim in dims:
            dim[1] = True
        used = set(spec.used_axes()) | set(spec.unreduced) | set(spec.reduced)
        replicated = tuple(n for n, t in zip(mesh.axis_names, mesh.axis_types)
                           if t.name == "Explicit" and n not in used)
    parts = []
    for axes, is_open in dims:
        inner = ", ".join(_quote(a) for a in axes)
        if is_open:
            inner = inner + ", ?" if inner else "?"
        parts.append("{" + inner + "}")
    head = f"@{mesh_name}" if mesh_name is not None else "mesh" + mesh_body(mesh, device_ids=False)
    text = f"#sdy.sharding<{head}, [{', '.join(parts)}]"
    if replicated:
        text += ", replicated=" + _axes_list(replicated)
    unreduced = tuple(n for n in mesh.axis_names if n in spec.unreduced)
    if unreduced:
        text += ", unreduced=" + _axes_list(unreduced)
    return text + ">"
