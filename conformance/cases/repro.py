"""Reproducer files, format v1: a standalone script (JAX + NumPy only) for one conformance case.

The module defines MESH_SHAPE, AXIS_NAMES, AXIS_TYPES (only where an axis is not Auto: the names of
`jax.sharding.AxisType`, e.g. ('Explicit', 'Explicit')), DEVICE_IDS (JAX device ids in mesh shape), KIND
("shard_map", "jit", "pmap"; "device_put" for a reshard onto another device order, with
OUT_DEVICE_IDS), the layouts of its kind (IN_SPECS / OUT_SPECS / CHECK_VMA; IN_SHARDINGS /
OUT_SHARDINGS as PartitionSpecs over the mesh; AXIS_NAME / IN_AXES / OUT_AXES), `program`,
`inputs()`, EXPECTED (per output: device id -> refsim's shard data), EXPECTED_INDEX,
POLICIES (per output: "exact", "exact_unsigned_zero", "ulp" with its bound in ULPS, or
"sum_bound" with BOUNDS holding per device the arrays of the sum check: the exact value,
the allowed error, the exact elements and where NaN / infinities are allowed) and TOLERANCE.
Run as a script it builds the mesh from `jax.devices()` by id, runs the program the way a JAX
user would, checks every device's shard with the element check of `conformance.verdict.compare`
(`conformance.verdict.elements`, whose source the file embeds) and exits 1 naming the first
differing elements. `conformance.debug.loader` reads the same attributes.
"""
from __future__ import annotations

import numpy as np

from conformance.cases.source import _array_literal, _index_source, spec_source
from conformance.verdict import ELEMENT_CHECK, REPRO_MAIN, compare
from conformance.verdict.elements import pack_sum_check
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec

_HEAD = '''\
# conformance reproducer v1: {case_id}
"""Reproducer for conformance case {case_id}

Rebuilds the case with JAX and NumPy only and checks every device's shard against refsim's values.

Run: python {{this file}}   (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count={ndev} or more)
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

nan_, inf_ = float("nan"), float("inf")
'''

_MAIN = '''

def _mesh(ids):
    devs = {d.id: d for d in jax.devices()}
    need = sorted(int(i) for i in np.ravel(ids))
    if not set(need) <= set(devs):
        sys.exit(f"this case needs JAX devices {need}; have {sorted(devs)} (on CPU set "
                 "XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported)")
    grid = np.array([devs[int(i)] for i in np.ravel(ids)], dtype=object).reshape(MESH_SHAPE)
    types = globals().get("AXIS_TYPES")   # absent: every axis is Auto
    kw = {} if types is None else {"axis_types": tuple(getattr(jax.sharding.AxisType, t) for t in types)}
    return jax.sharding.Mesh(grid, AXIS_NAMES, **kw)


def run():
    """The program under JAX's own entry point for KIND, on the devices DEVICE_IDS names."""
    args = inputs()
    if KIND == "pmap":
        devs = {d.id: d for d in jax.devices()}
        return jax.pmap(program, axis_name=AXIS_NAME, in_axes=IN_AXES, out_axes=OUT_AXES,
                        devices=[devs[int(i)] for i in np.ravel(DEVICE_IDS)])(*args)
    mesh = _mesh(DEVICE_IDS)
    named = lambda s: jax.sharding.NamedSharding(mesh, s)
    if KIND == "shard_map":
        kw = {} if MANUAL_AXES is None else {"axis_names": set(MANUAL_AXES)}
        return jax.jit(jax.shard_map(program, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS,
                                     check_vma=CHECK_VMA, **kw))(*args)
    if KIND == "jit":
        outs = named(OUT_SHARDINGS) if isinstance(OUT_SHARDINGS, P) else tuple(map(named, OUT_SHARDINGS))
        with jax.set_mesh(mesh):
            return jax.jit(program, in_shardings=tuple(map(named, IN_SHARDINGS)), out_shardings=outs)(*args)
    target = jax.sharding.NamedSharding(_mesh(OUT_DEVICE_IDS), OUT_SHARDINGS)
    return jax.device_put(jax.device_put(args[0], named(IN_SHARDINGS[0])), target)


# <element check>
def check(out) -> list:
    """Every disagreement between `out` (JAX's result) and EXPECTED, as lines of text."""
    failures = []
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != len(EXPECTED):
        return [f"JAX returned {len(leaves)} outputs, refsim {len(EXPECTED)}"]
    for k, o in enumerate(leaves):
        got = {s.device.id: s for s in o.addressable_shards}
        if set(got) != set(EXPECTED[k]):
            failures.append(f"output {k}: devices {sorted(got)}, expected {sorted(EXPECTED[k])}")
            continue
        for dev, want in sorted(EXPECTED[k].items()):
            failures += shard_failures(k, dev, got[dev], want, EXPECTED_INDEX[k][dev], o.shape, POLICIES[k], ULPS[k],
                                       BOUNDS[k].get(dev))
    return failures


# <main>
'''

# The element check every reproducer embeds (both templates): `conformance.verdict.elements`
# source, the code conformance.verdict.compare runs. Kept under this name for older imports.
_MAIN = _MAIN.replace("# <element check>\n", ELEMENT_CHECK).replace("# <main>\n", REPRO_MAIN)


def _ids_literal(mesh) -> str:
    return repr(np.asarray(mesh.device_ids).tolist())


def _specs_tuple(specs) -> str:
    return "(" + ", ".join(spec_source(s) for s in specs) + ("," if len(specs) == 1 else "") + ")"


def _packed_source(packed: dict) -> str:
    """Source of a `pack_sum_check` dict: float64 / bool arrays bit for bit, strings as strings."""
    items = []
    for key, v in packed.items():
        v = np.asarray(v)
        items.append(f"{key!r}: " + (repr(str(v)) if v.dtype.kind == "U" else _array_literal(v)))
    return "{" + ", ".join(items) + "}"


def source(case, expected, tolerances=None) -> str:
    """The v1 reproducer of `case` (a `conformance.cases.Program`) with refsim's `expected` result."""
    m = case.mesh
    out = [_HEAD.format(case_id=case.case_id, ndev=int(np.max(m.device_ids)) + 1)]
    out.append(f"MESH_SHAPE = {tuple(int(s) for s in m.axis_sizes)!r}")
    out.append(f"AXIS_NAMES = {tuple(m.axis_names)!r}")
    types = tuple(t.name for t in getattr(m, "axis_types", ()))
    if any(t != "Auto" for t in types):
        out.append(f"AXIS_TYPES = {types!r}")
    out.append(f"DEVICE_IDS = {_ids_literal(m)}")
    out.append(f"KIND = {case.entry!r}")
    if case.entry == "shard_map":
        out.append(f"IN_SPECS = {_specs_tuple(case.in_specs)}")
        outs = case.out_specs
        out.append("OUT_SPECS = " + (spec_source(outs) if isinstance(outs, PartitionSpec) else _specs_tuple(outs)))
        out.append("CHECK_VMA = True")
        out.append(f"MANUAL_AXES = {None if case.axis_names is None else tuple(case.axis_names)!r}")
    elif case.entry == "pmap":
        out += [f"AXIS_NAME = {m.axis_names[0]!r}", "IN_AXES = 0", "OUT_AXES = 0"]
    else:
        out.append(f"IN_SHARDINGS = {_specs_tuple([s.spec for s in case.in_shardings])}")
        o = case.out_shardings
        out.append("OUT_SHARDINGS = " + (spec_source(o.spec) if isinstance(o, NamedSharding)
                                          else _specs_tuple([s.spec for s in o])))
        if case.entry == "device_put":
            out.append(f"OUT_DEVICE_IDS = {_ids_literal(o.mesh)}")
    out += ["", case.source.strip(), "", "", "program = f", "", "",
            "def inputs():", "    return ("]
    out += [f"        {_array_literal(np.asarray(a))}," for a in case.args]
    out += ["    )", ""]
    outs = compare.as_outputs(expected)
    tols = list(tolerances) if tolerances is not None else case.tolerances()
    tols = [tols[k] if k < len(tols) else compare.EXACT for k in range(len(outs))]
    pols = [compare.element_rule(tols[k], arr.dtype) for k, arr in enumerate(outs)]
    data, index, bounds = [], [], []
    for k, arr in enumerate(outs):
        data.append("    {")
        index.append("    {")
        bounds.append("    {")
        for sh in arr.shards:
            d = int(sh.device_id)
            data.append(f"        {d}: {_array_literal(np.asarray(sh.data))},")
            index.append(f"        {d}: {_index_source(sh.index)},")
            if pols[k] == "sum_bound":
                packed = pack_sum_check(**tols[k].check_arrays(d, np.asarray(sh.data).dtype))
                bounds.append(f"        {d}: {_packed_source(packed)},")
        for lst in (data, index, bounds):
            lst.append("    },")
    out += ["# refsim's expected shards: per output, device id -> data (and its index in the global array)",
            "EXPECTED = ["] + data + ["]", "EXPECTED_INDEX = ["] + index + ["]"]
    out.append(f"POLICIES = {pols!r}")
    out.append(f"ULPS = {[getattr(t, 'ulps', None) if p == 'ulp' else None for t, p in zip(tols, pols)]!r}")
    out += ["# sum_bound outputs: device id -> the arrays of the sum check (exact value and allowed error as",
            "# float64 parts, exact elements, where +inf / -inf / NaN are allowed)", "BOUNDS = ["] + bounds + ["]"]
    out.append(f"TOLERANCE = {'sum_bound' if 'sum_bound' in pols else 'exact'!r}")
    return "\n".join(out) + _MAIN
