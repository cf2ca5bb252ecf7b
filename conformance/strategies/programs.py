"""`programs()`: whole programs composing collectives with elementwise and structural ops,
control flow, autodiff, vmap, nested shard_map, jit with shardings and resharding.

Each family is a small builder that draws its parameters and returns the function's
source plus its local shapes; `programs` adds the mesh, layouts and exact-friendly data.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.cases import Program, spec_source
from conformance.strategies import _validate as v
from conformance.strategies.arrays import _np_dtype, arrays
from conformance.strategies.collectives import _axes_label, axis_index_groups, perm_kind, permutations
from conformance.strategies.specs import _check_mesh, partition_specs
from refsim import compat as _compat
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec, set_text

PROGRAM_DTYPES = ("float32", "int32", "bfloat16")


def _axes(draw, m: Mesh, *, permuting: bool = False) -> tuple:
    """A non-empty tuple of mesh axes in any order (in mesh order for a ppermute where the
    installed JAX requires it, see `_compat.ppermute_axes_must_follow_mesh_order`)."""
    k = draw(st.integers(1, m.ndim))
    axes = tuple(draw(st.permutations(m.axis_names))[:k])
    if permuting and _compat.ppermute_axes_must_follow_mesh_order():
        axes = tuple(sorted(axes, key=m.axis_names.index))
    return axes


def _size(m: Mesh, axes) -> int:
    return math.prod(m.axis_size(a) for a in axes)


def _ring(n: int) -> list:
    return [(i, (i + 1) % n) for i in range(n)]


# Each builder: (draw, mesh, dtype) -> dict(body=..., local=(...), out_rank=int, labels=[...],
# optional: outputs, entry, axis_names, in_specs, out_specs, in_shardings, out_shardings).
def _elementwise_psum(draw, m, dt):
    ax = _axes(draw, m)
    return dict(body=f"def f(a):\n    b = a * 2 + 1\n    return jax.lax.psum(jnp.maximum(b, a), {ax!r}) - a\n",
                local=(draw(st.integers(1, 3)), draw(st.integers(1, 3))), labels=[("axes", _axes_label(ax))])


def _structural_all_to_all(draw, m, dt):
    ax = _axes(draw, m)
    n = _size(m, ax)
    return dict(body=(f"def f(a):\n    b = jnp.concatenate([a, a[::-1]], axis=1).T\n"
                      f"    c = jax.lax.all_to_all(b, {ax!r}, 1, 0, tiled=True)\n"
                      f"    return jnp.flip(c, 0).reshape(c.shape[0], -1)\n"),
                local=(n, draw(st.integers(1, 2))), labels=[("axes", _axes_label(ax))])


# A family whose output adds a `reduce` sum in: StableHLO's reduce intersperses an implementation-defined
# number of +0 init values, so a zero sum of -0.0 operands may be -0.0 or +0.0 (XLA drops a reduce over a
# size-1 dimension and keeps -0.0, refsim adds one init: +0.0). Both conform, so such outputs are compared
# exactly except for a zero's sign.
_REDUCE_SUM_ZERO = "exact_unsigned_zero"


def _scan_ppermute(draw, m, dt):
    ax = _axes(draw, m, permuting=True)
    perm = draw(permutations(_size(m, ax), kinds=("cycles", "partial", "fixed_points", "identity")))
    length = draw(st.integers(1, 3))
    return dict(body=(f"def f(a):\n    def step(c, _):\n"
                      f"        c = jax.lax.ppermute(c, {ax!r}, perm={perm!r}) + c\n        return c, c.sum()\n"
                      f"    c, ys = jax.lax.scan(step, a, None, length={length})\n"
                      f"    return c + ys.sum()\n"),
                local=(draw(st.integers(1, 3)),),
                labels=[("axes", _axes_label(ax)), ("perm", perm_kind(perm, _size(m, ax))), ("length", length)],
                outputs=(_REDUCE_SUM_ZERO,))


def _while_pmax(draw, m, dt):
    ax = _axes(draw, m)
    k = draw(st.integers(0, 3))
    return dict(body=(f"def f(a):\n    return jax.lax.fori_loop(0, {k}, lambda i, c: jax.lax.pmax(c, {ax!r}) - c + 1, a)\n"),
                local=(draw(st.integers(1, 3)),), labels=[("axes", _axes_label(ax)), ("trips", k)])


def _cond_axis_index(draw, m, dt):
    # The predicate differs between devices, so the branches hold no collective (devices in
    # different branches would wait on each other forever); the collective follows the cond.
    ax = _axes(draw, m, permuting=True)
    n = _size(m, ax)
    return dict(body=(f"def f(a):\n    even = jax.lax.axis_index({ax!r}) % 2 == 0\n"
                      f"    b = jax.lax.cond(even, lambda c: c * 2, lambda c: c - 1, a)\n"
                      f"    return jax.lax.ppermute(b, {ax!r}, perm={_ring(n)!r})\n"),
                local=(draw(st.integers(1, 3)),), labels=[("axes", _axes_label(ax))])


def _switch_reductions(draw, m, dt):
    # The branch index is a psum over every mesh axis, so all devices take the same branch.
    ax = _axes(draw, m)
    every = tuple(m.axis_names)
    return dict(body=(f"def f(a):\n    i = jax.lax.psum(a.sum(), {every!r}).astype(jnp.int32) % 3\n"
                      f"    return jax.lax.switch(i, [lambda c: jax.lax.pmax(c, {ax!r}),\n"
                      f"                              lambda c: jax.lax.pmin(c, {ax!r}),\n"
                      f"                              lambda c: jax.lax.psum(-c, {ax!r})], a)\n"),
                local=(draw(st.integers(1, 3)),), labels=[("axes", _axes_label(ax))])


def _grad_psum(draw, m, dt):
    ax = _axes(draw, m)
    return dict(body=(f"def f(a):\n    return jax.grad(lambda b: (jax.lax.psum(b * b, {ax!r}) * b).sum())(a)\n"),
                local=(draw(st.integers(1, 3)),), labels=[("axes", _axes_label(ax))], floats_only=True)


def _grad_scan_ppermute(draw, m, dt):
    ax = _axes(draw, m, permuting=True)
    n = _size(m, ax)
    return dict(body=(f"def f(a):\n    def loss(b):\n"
                      f"        c, _ = jax.lax.scan(lambda c, _: (jax.lax.ppermute(c, {ax!r}, perm={_ring(n)!r}) * 2 + b, None), b, None, length=2)\n"
                      f"        return (c * c).sum()\n    return jax.grad(loss)(a)\n"),
                local=(draw(st.integers(1, 3)),), labels=[("axes", _axes_label(ax))], floats_only=True)


def _vmap_all_gather(draw, m, dt):
    ax = _axes(draw, m)
    tiled = draw(st.booleans())
    return dict(body=(f"def f(a):\n    g = jax.vmap(lambda r: jax.lax.all_gather(r, {ax!r}, tiled={tiled}))(a)\n"
                      f"    return g.reshape(a.shape[0], -1)\n"),
                local=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
                labels=[("axes", _axes_label(ax)), ("tiled", tiled)])


def _vmap_psum_scatter(draw, m, dt):
    ax = _axes(draw, m)
    n = _size(m, ax)
    return dict(body=(f"def f(a):\n    return jax.vmap(lambda r: jax.lax.psum_scatter(r, {ax!r}, tiled=True), in_axes=1, out_axes=1)(a)\n"),
                local=(n * draw(st.integers(1, 2)), draw(st.integers(1, 2))), labels=[("axes", _axes_label(ax))])


def _reduce_scatter_all_gather(draw, m, dt):
    ax = _axes(draw, m)
    n = _size(m, ax)
    return dict(body=(f"def f(a):\n    s = jax.lax.psum_scatter(a, {ax!r}, scatter_dimension=0, tiled=True)\n"
                      f"    return jax.lax.all_gather(s * 3, {ax!r}, axis=0, tiled=True) - jax.lax.psum(a, {ax!r})\n"),
                local=(n * draw(st.integers(1, 2)),), labels=[("axes", _axes_label(ax))])


def _axis_index_ppermute(draw, m, dt):
    ax = _axes(draw, m, permuting=True)
    perm = draw(permutations(_size(m, ax)))
    return dict(body=(f"def f(a):\n    b = a + jax.lax.axis_index({ax!r}).astype(a.dtype)\n"
                      f"    return jax.lax.ppermute(b, {ax!r}, perm={perm!r})\n"),
                local=(draw(st.integers(1, 3)),), labels=[("axes", _axes_label(ax)), ("perm", perm_kind(perm, _size(m, ax)))])


def _nested_shard_map(draw, m, dt):
    names = list(draw(st.permutations(m.axis_names)))
    k = draw(st.integers(1, m.ndim - 1))
    outer, inner = tuple(names[:k]), tuple(names[k:])
    body = (f"def f(a):\n    inner = jax.shard_map(lambda b: jax.lax.psum(b, {inner!r}) + b,\n"
            f"                          in_specs=P({inner!r}), out_specs=P({inner!r}), axis_names={set_text(inner)})\n"
            f"    return inner(a) * 2\n")
    return dict(body=body, local=(_size(m, inner) * draw(st.integers(1, 2)),), axis_names=outer,
                in_specs=(PartitionSpec(outer),), out_specs=PartitionSpec(outer),
                labels=[("outer", _axes_label(outer)), ("inner", _axes_label(inner))])


def _jit_shardings(draw, m, dt):
    s_in = draw(partition_specs(m, 2))
    s_out = draw(partition_specs(m, 2))
    return dict(entry="jit", body="def f(a):\n    return (a * 2 + a.sum(axis=0, keepdims=True)).T\n",
                spec_in=s_in, spec_out=s_out, local=(1, 1), labels=[], outputs=(_REDUCE_SUM_ZERO,))


def _jit_constraint(draw, m, dt):
    s_in = draw(partition_specs(m, 2))
    s_mid = draw(partition_specs(m, 2))
    s_out = draw(partition_specs(m, 2))
    return dict(entry="jit",
                body=(f"def f(a):\n    b = jax.lax.with_sharding_constraint(a + 1, {spec_source(s_mid)})\n"
                      f"    return b * b - a\n"),
                spec_in=s_in, spec_mid=s_mid, spec_out=s_out, local=(1, 1), labels=[])


def _reshard_device_order(draw, m, dt):
    ids = np.asarray(m.device_ids)
    order = draw(st.sampled_from(["reversed", "transposed", "random"]))
    flat = ids.ravel()
    if order == "reversed":
        new = flat[::-1]
    elif order == "transposed":
        new = flat[np.arange(flat.size).reshape(ids.shape[::-1]).T.ravel()]
    else:
        new = np.asarray(draw(st.permutations(flat.tolist())))
    m2 = Mesh(m.axis_sizes, m.axis_names, device_ids=np.asarray(new).reshape(ids.shape))
    s_in = draw(partition_specs(m, 2))
    s_out = draw(partition_specs(m2, 2))
    return dict(entry="device_put", body="def f(a):\n    return a\n", spec_in=s_in, spec_out=s_out,
                target_mesh=m2, local=(1, 1), labels=[("to", order)])


def _pmap_grouped(draw, m, dt):
    groups = draw(axis_index_groups(m.size))
    name = m.axis_names[0]
    return dict(entry="pmap",
                body=(f"def f(a):\n    s = jax.lax.psum(a * 2, {name!r}, axis_index_groups={groups!r})\n"
                      f"    return jax.lax.pmax(s - a, {name!r}, axis_index_groups={groups!r})\n"),
                local=(draw(st.integers(1, 3)),), labels=[("groups", "drawn")])


def _pargmax_pargmin(draw, m, dt):
    # JAX's own composition (jax._src.lax.parallel: pmax / pmin, ==, select, pmin of the
    # index), so refsim and XLA run the same function; NaN data shows how a max/min
    # all-reduce that ignores NaN changes the index (docs/collectives.md, special values).
    ax = draw(st.sampled_from(m.axis_names))
    op = draw(st.sampled_from(["pargmax", "pargmin"]))
    return dict(body=f"def f(a):\n    return jax._src.lax.parallel.{op}(a, {ax!r})\n",
                local=(draw(st.integers(1, 3)),), labels=[("op", op), ("axis", ax)])


FAMILIES = {
    "elementwise_psum": (_elementwise_psum, 1),
    "structural_all_to_all": (_structural_all_to_all, 1),
    "scan_ppermute": (_scan_ppermute, 1),
    "while_pmax": (_while_pmax, 1),
    "cond_axis_index": (_cond_axis_index, 1),
    "switch_reductions": (_switch_reductions, 1),
    "grad_psum": (_grad_psum, 1),
    "grad_scan_ppermute": (_grad_scan_ppermute, 1),
    "vmap_all_gather": (_vmap_all_gather, 1),
    "vmap_psum_scatter": (_vmap_psum_scatter, 1),
    "reduce_scatter_all_gather": (_reduce_scatter_all_gather, 1),
    "axis_index_ppermute": (_axis_index_ppermute, 1),
    "nested_shard_map": (_nested_shard_map, 2),
    "jit_shardings": (_jit_shardings, 1),
    "jit_constraint": (_jit_constraint, 1),
    "reshard_device_order": (_reshard_device_order, 1),
    "pmap_grouped": (_pmap_grouped, 1),
    "pargmax_pargmin": (_pargmax_pargmin, 1),
}


def _usable(name: str, m: Mesh, floats: list) -> bool:
    if name == "pmap_grouped":
        return m.ndim == 1
    if name in ("grad_psum", "grad_scan_ppermute"):
        return bool(floats)
    return m.ndim >= FAMILIES[name][1]


# Module level: st.composite reads the function's source each time it decorates one (~3 ms),
# which a closure redefined per call would pay on every `programs` strategy.
@st.composite
def _draw_program(draw, mesh_s, fams, dts, dtypes) -> Program:
    m: Mesh = draw(mesh_s)
    floats = [d for d in dts if d.kind == "f" or d.name == "bfloat16"]
    choices = [f for f in fams if _usable(f, m, floats)]
    if not choices:
        raise InvalidArgument(f"none of families={fams!r} can run on {m!r} with dtypes={tuple(dtypes)!r}.")
    name = draw(st.sampled_from(choices))
    b = FAMILIES[name][0](draw, m, None)
    dt = draw(st.sampled_from(floats if b.get("floats_only") else dts))
    entry = b.get("entry", "shard_map")
    kw: dict = {}
    if entry == "shard_map":
        in_spec = b["in_specs"][0] if "in_specs" in b else draw(partition_specs(m, len(b["local"]), required_axes=m.axis_names))
        counts = [_size(m, in_spec.axes_of(d)) for d in range(len(b["local"]))]
        shape = tuple(l * c for l, c in zip(b["local"], counts))
        out_rank = b.get("out_rank", len(b["local"]))
        out_spec = b["out_specs"] if "out_specs" in b else draw(partition_specs(m, out_rank, required_axes=m.axis_names))
        kw.update(in_specs=(in_spec,), out_specs=out_spec, axis_names=b.get("axis_names"))
    elif entry == "pmap":
        shape = (m.size,) + tuple(b["local"])
    else:
        s_in = NamedSharding(m, b["spec_in"])
        tm = b.get("target_mesh", m)
        s_out = NamedSharding(tm, b["spec_out"])
        counts = [math.lcm(*(NamedSharding(mm, sp).num_shards(2)[d] for mm, sp in
                             ((m, b["spec_in"]), (tm, b["spec_out"]), (m, b.get("spec_mid", PartitionSpec())))))
                  for d in range(2)]
        if name == "jit_shardings":
            # the output is transposed, so both dims must divide by every spec's count
            shape = (math.lcm(*counts) * draw(st.integers(1, 2)),) * 2
        else:
            shape = tuple(c * draw(st.integers(1, 2)) for c in counts)
        kw.update(in_shardings=(s_in,), out_shardings=s_out)
    x = draw(arrays(dt, shape))
    labels = list(b["labels"])
    return Program(family=name, source=b["body"], entry=entry, mesh=m, args=(x,), labels=tuple(labels),
                   outputs=b.get("outputs", ("exact",)), **kw)


def programs(mesh, *, families=tuple(FAMILIES), dtypes=PROGRAM_DTYPES) -> st.SearchStrategy[Program]:
    """A whole `Program` over `mesh` from one of `families` (see FAMILIES), with exact-friendly data.

    shard_map families take inputs varying over every mesh axis and name every axis in their
    out specs; "nested_shard_map" needs >= 2 axes, "pmap_grouped" a 1-D mesh, and families
    that differentiate draw floating dtypes only (a family that cannot run on the drawn mesh
    or dtypes is skipped). Outputs are compared exactly: the data keeps every sum exact (the sign of
    a zero aside where a family adds a `reduce` sum into its output, scan_ppermute and jit_shardings:
    StableHLO leaves it to the implementation).

    >>> programs(Mesh((2, 4), ('x', 'y')), families=("scan_ppermute",)).example().case_id  # doctest: +SKIP
    "scan_ppermute[axes=('y',),perm=cycles,length=2,dtype=float32,mesh=2x4:default]"
    """
    mesh_s = _check_mesh(mesh)
    fams = v.check_options("families", families, tuple(FAMILIES))
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    if not dtypes:
        raise InvalidArgument("dtypes=() is empty; name at least one dtype.")
    dts = [_np_dtype(d) for d in dtypes]
    return _draw_program(mesh_s, fams, tuple(dts), dtypes)
