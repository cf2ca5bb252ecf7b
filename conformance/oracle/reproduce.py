"""Reproducer files for a user's program, format v1 ("program" flavour of conformance/cases/repro.py).

The file needs only JAX and NumPy (and the user's own module, which it imports to rebuild the
program, so that a fix in JAX or XLA makes it pass). It defines PROGRAM_FILE, PROGRAM_MODULE,
PROGRAM_NAME (where the checked callable lives), WRAP (None, or how `conformance.check`
wrapped a plain function: shard_map / jit with its mesh and specs), the inputs and refsim's
expected shards (base64 .npz in DATA), EXPECTED_INDEX, LAYOUTS (each input's mesh and
PartitionSpec) and POLICIES (per output: "exact", "exact_unsigned_zero", "ulp" with its bound
in ULPS, "scaled" with the allowed error in ALLOWED, or "sum_bound"; a scaled or sum_bound
output keeps per device the arrays of its check in DATA: the reference value, the allowed
error, the exact elements and where NaN / infinities are allowed). Run as a script it places
the inputs as they were placed when checked, calls the program the way the user did, checks
every device's shard with the element check of `conformance.verdict.compare`
(`conformance.verdict.elements`, whose source the file embeds) and exits 1 naming the first
differing elements (0 when all agree, 2 when it cannot run here).

Values with unreduced axes (each device holds a partial value): an unreduced input is stored as
each device's own value (``in<i>_dev<d>`` in DATA, its global shape in PARTIAL_INPUTS) and rebuilt
with `jax.make_array_from_single_device_arrays` under its unreduced sharding; an unreduced output
is read per device (``addressable_shards``: JAX gives it no global read, and on 0.12 no shard
index) and, where refsim states the value the partial values combine to (PARTIALS "combined": a
jit-level result), each device's block is that combination over the unreduced axes
(`conformance.verdict.elements.combine_partials`, by the output's unreduced kind); where refsim
states each device's partial value ("per device": a shard_map's out_specs, a device_put onto an
unreduced layout) each device is compared as it is.
"""
from __future__ import annotations

import base64
import io
import os

import numpy as np

from conformance.cases.source import _index_source, spec_source
from conformance.oracle.policy import ScaledBound
from conformance.verdict import ELEMENT_CHECK, REPRO_MAIN, compare
from conformance.verdict.elements import SUM_CHECK_FIELDS, pack_sum_check
import refsim
from refsim import compat
from refsim.layouts.partition_spec import PartitionSpec

_HEAD = '''\
# conformance reproducer v1 (program): {name}
"""Reproducer for a disagreement found by conformance.check in {name}

{what}. It runs the program with JAX on the inputs it was checked with, and checks every
device's shard against refsim's values ({policy}).

Run: python {{this file}}   (on CPU it asks XLA for {ndev} host devices unless XLA_FLAGS already names a count)
"""
import base64
import importlib
import importlib.util
import io
import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count={ndev}").strip()

import numpy as np
import jax
from jax.sharding import PartitionSpec as P

'''

_MAIN = r'''

def _data():
    return np.load(io.BytesIO(base64.b64decode(DATA)), allow_pickle=False)


def _mesh(ids, names, types):
    devs = {d.id: d for d in jax.devices()}
    need = sorted(int(i) for i in np.ravel(ids))
    if not set(need) <= set(devs):
        print(f"this program needs JAX devices {need}; have {sorted(devs)} (on CPU set "
              "XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported)")
        sys.exit(2)
    grid = np.array([devs[int(i)] for i in np.ravel(ids)], dtype=object).reshape(np.shape(ids))
    kinds = tuple(getattr(jax.sharding.AxisType, t) for t in types)
    return jax.sharding.Mesh(grid, tuple(names), axis_types=kinds)


def _import_program():
    """The checked callable, imported from the user's module (or loaded from its file); for an
    exported reproducer, the program deserialized from EXPORTED (jax.export)."""
    if EXPORTED is not None:
        return jax.export.deserialize(bytearray(base64.b64decode(EXPORTED))).call
    if PROGRAM_MODULE and PROGRAM_ROOT is not None:
        sys.path.insert(0, PROGRAM_ROOT)
        mod = importlib.import_module(PROGRAM_MODULE)
    else:
        spec = importlib.util.spec_from_file_location("_conformance_program", PROGRAM_FILE)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    obj = mod
    for part in PROGRAM_NAME.split("."):
        obj = getattr(obj, part)
    return obj


def program():
    if DEVICE_PUT is not None:   # jax.device_put of each input onto its target layout
        targets = [jax.sharding.NamedSharding(_mesh(ids, names, types), spec) for ids, names, types, spec in DEVICE_PUT]
        return lambda *xs: tuple(jax.device_put(x, t) for x, t in zip(xs, targets))
    f = _import_program()
    if WRAP is None:
        return f
    mesh = _mesh(*WRAP["mesh"])
    named = lambda s: None if s is None else jax.sharding.NamedSharding(mesh, s)
    if WRAP["kind"] == "shard_map":
        kw = {} if WRAP["axis_names"] is None else {"axis_names": set(WRAP["axis_names"])}
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=WRAP["in_specs"], out_specs=WRAP["out_specs"],
                                     check_vma=WRAP["check_vma"], **kw))
    tree = lambda t: jax.tree_util.tree_map(named, t, is_leaf=lambda x: x is None or isinstance(x, P))
    return jax.jit(f, in_shardings=tree(WRAP["in_shardings"]), out_shardings=tree(WRAP["out_shardings"]))


def _partial_input(data, i, layout, shape):
    """Input `i`, unreduced over some mesh axes: each device's own partial value (DATA's
    in<i>_dev<d>) assembled under its unreduced sharding, as the checked call got it."""
    ids, names, types, spec = layout
    mesh = _mesh(ids, names, types)
    return jax.make_array_from_single_device_arrays(
        tuple(shape), jax.sharding.NamedSharding(mesh, spec),
        [jax.device_put(data[f"in{i}_dev{d.id}"], d) for d in mesh.devices.flat])


def inputs():
    """(args, kwargs) placed on the devices, meshes and PartitionSpecs they had when checked."""
    data = _data()
    leaves = []
    for i, layout in enumerate(LAYOUTS):
        if i in PARTIAL_INPUTS:
            leaves.append(_partial_input(data, i, layout, PARTIAL_INPUTS[i]))
            continue
        x = data[f"in{i}"]
        if layout is not None:
            ids, names, types, spec = layout
            x = jax.device_put(x, jax.sharding.NamedSharding(_mesh(ids, names, types), spec))
        leaves.append(x)
    return ARGS(leaves)


def run():
    args, kwargs = inputs()
    if WRAP is not None and WRAP["kind"] == "jit":
        with jax.set_mesh(_mesh(*WRAP["mesh"])):
            return program()(*args, **kwargs)
    if CONTEXT_MESH is not None:   # the mesh the call ran under (jax.set_mesh): a bare P in the program names it
        with jax.set_mesh(_mesh(*CONTEXT_MESH)):
            return program()(*args, **kwargs)
    return program()(*args, **kwargs)


# <element check>
def _unreduced_of(o):
    """(mesh axes, kind) over which JAX's result `o` holds a partial value per device, else None;
    kind "sum" (jax 0.12's unreduced_kind may say "max" or "min")."""
    spec = getattr(getattr(o, "sharding", None), "spec", None)
    axes = tuple(getattr(spec, "unreduced", None) or ())
    if not axes:
        return None
    kind = getattr(spec, "unreduced_kind", None)
    return axes, "sum" if kind is None else str(getattr(kind, "name", kind)).split(".")[-1].lower()


class _Block:
    """One device's block of an unreduced output: its data, at the index refsim gives it."""

    def __init__(self, data, index):
        self.data, self.index = data, index


def _blocks(k, o) -> dict:
    """{device id: its block of output `k`}: each device's shard, or for an output unreduced over
    some mesh axes (whose shards JAX gives no index, and no global read) each device's data at
    refsim's index: its own partial value where refsim states one per device (a shard_map's
    out_specs), else the combination (`combine_partials`) of the partial values of the devices
    that differ from it only along those axes, which is the value the program states."""
    un = _unreduced_of(o)
    if un is None:
        return {s.device.id: s for s in o.addressable_shards}
    own = {s.device.id: np.asarray(s.data) for s in o.addressable_shards}
    index = EXPECTED_INDEX[k]
    if PARTIALS[k] == "per device":
        return {d: _Block(v, index.get(d)) for d, v in own.items()}
    mesh, (axes, kind) = o.sharding.mesh, un
    names = list(mesh.axis_names)
    ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
    along = [n for n, a in enumerate(names) if a in axes]
    rest = [n for n in range(len(names)) if n not in along]
    groups = np.transpose(ids, rest + along).reshape(-1, int(np.prod([ids.shape[n] for n in along])))
    blocks = {}
    for g in groups.tolist():
        if all(d in own for d in g):
            total = combine_partials([own[d] for d in g], kind)
            blocks.update({d: _Block(total, index.get(d)) for d in g})
    return blocks


def check(out) -> list:
    """Every disagreement between `out` (JAX's result) and refsim's expected shards, as text."""
    data = _data()
    failures = []
    # float0 outputs (tangents of integer inputs) hold no data; the oracle checks them by shape
    leaves = [x for x in jax.tree_util.tree_leaves(out) if x.dtype != jax.dtypes.float0]
    if len(leaves) != len(EXPECTED_INDEX):
        return [f"JAX returned {len(leaves)} outputs, refsim {len(EXPECTED_INDEX)}"]
    for k, o in enumerate(leaves):
        got = _blocks(k, o)
        if set(got) != set(EXPECTED_INDEX[k]):
            failures.append(f"output {k}: devices {sorted(got)}, expected {sorted(EXPECTED_INDEX[k])}")
            continue
        for dev in sorted(EXPECTED_INDEX[k]):
            packed = ({f: data[f"sum{k}_dev{dev}_{f}"] for f in SUM_CHECK_FIELDS}
                      if POLICIES[k] in ("scaled", "sum_bound") else None)
            failures += shard_failures(k, dev, got[dev], data[f"out{k}_dev{dev}"], EXPECTED_INDEX[k][dev], o.shape,
                                       POLICIES[k], ULPS[k], packed, exact_word="refsim", bound_word="allowed",
                                       item=True)
        un = _unreduced_of(o)
        if un is not None and PARTIALS[k] == "combined" and any(f.startswith(f"output {k} ") for f in failures):
            first = next(n for n, f in enumerate(failures) if f.startswith(f"output {k} "))
            failures.insert(first, f"output {k} is unreduced over {list(un[0])} ({o.sharding.spec}): each device's "
                                   f"value below is the {un[1]} of the partial values along those axes")
    return failures


if __name__ == "__main__" and EXPORTED is not None:
    print(f"{PROGRAM_NAME}: the program as jax.export serialized it (StableHLO with its shardings; "
          f"{NOT_BISECTABLE})")


# <main>
'''
_MAIN = _MAIN.replace("# <element check>\n", ELEMENT_CHECK).replace("# <main>\n", REPRO_MAIN)


class NotReproducible(ValueError):
    """The program cannot be rebuilt by a reproducer (e.g. a closure with no module-level name)."""


def locate(fn) -> tuple[str, str | None, str | None, str]:
    """(file, module, sys.path root for the module, name) of the module-level binding of `fn`.

    `fn` must be reachable as a global of the module its function was defined in (a decorated
    function, or ``step = jax.jit(...)`` at module level); a closure has no such name.
    """
    chain, obj = [fn], fn
    for _ in range(10):                        # the object and what it wraps: their modules' globals
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            break
        chain.append(obj)
    found = None
    for c in reversed(chain):                  # innermost first: the user's own module
        g = getattr(c, "__globals__", None)
        if g is None:
            continue
        # only a name for `fn` itself (or oracle mode's wrapper of it): `train_step`, never the
        # `_step` it wraps, which would run without the jit / shard_map around it
        name = next((k for k, v in g.items() if not k.startswith("__")
                     and (v is fn or getattr(v, "_inner", None) is fn)), None)
        if name is not None:
            found = (g, name)
            break
    if found is None:
        inner = chain[-1]
        qual = getattr(inner, "__qualname__", repr(fn))
        where = getattr(inner, "__module__", None)
        raise NotReproducible(
            f"{qual} has no module-level name in {where} (a closure or a local); bind the checked "
            "callable to a module-level name so the reproducer can import it.")
    g, name = found
    file = os.path.abspath(g.get("__file__") or "")
    module = g.get("__name__")
    if not file or not os.path.exists(file):
        raise NotReproducible(f"{name} is defined in {module}, which has no source file to import.")
    root = None
    if module and module != "__main__" and not module.startswith("_conformance"):
        parts = module.split(".")
        base = file[:-len(".py")] if file.endswith(".py") else file
        if os.path.basename(base) == "__init__":
            base = os.path.dirname(base)
        root = base
        for _ in parts:
            root = os.path.dirname(root)
        if os.path.join(root, *parts) not in (base,):
            root, module = None, None
    else:
        module = None
    return file, module, root, name


def _tree_source(tree, leaf, is_leaf=lambda x: False) -> str:
    """Python source rebuilding a pytree of tuples/lists/dicts/None whose leaves `leaf(x)` writes
    (`is_leaf(x)` marks leaves that are containers themselves, such as a PartitionSpec)."""
    if is_leaf(tree):
        return leaf(tree)
    if tree is None:
        return "None"
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        items = [_tree_source(t, leaf, is_leaf) for t in tree]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(tree, list):
        return "[" + ", ".join(_tree_source(t, leaf, is_leaf) for t in tree) + "]"
    if isinstance(tree, dict):
        # in sorted key order, as JAX flattens a dict (leaf numbers follow it)
        return "{" + ", ".join(f"{k!r}: {_tree_source(tree[k], leaf, is_leaf)}" for k in sorted(tree)) + "}"
    return leaf(tree)


def _args_source(args, kwargs) -> str:
    """`ARGS(leaves)` source: the (args, kwargs) structure with leaf i read as L[i]."""
    import jax

    counter = iter(range(10 ** 9))

    def leaf(x):
        k = next(counter)
        # Python scalars (a jit's static arguments, say) are written as themselves
        return repr(x) if isinstance(x, (bool, int, float, str)) else f"L[{k}]"

    structure = (tuple(args), dict(kwargs))
    flat_n = len(jax.tree_util.tree_leaves(structure))
    src = _tree_source(structure, leaf)
    if next(counter) != flat_n:
        raise NotReproducible("the arguments hold pytree nodes other than tuple/list/dict "
                              "(e.g. a dataclass or NamedTuple); pass plain containers.")
    return f"ARGS = lambda L: {src}"


def _mesh_desc(jmesh) -> tuple:
    ids = np.vectorize(lambda d: d.id, otypes=[int])(jmesh.devices).tolist()
    types = tuple(getattr(t, "name", str(t)) for t in getattr(jmesh, "axis_types", ()) or ())
    if not types:
        types = ("Auto",) * len(jmesh.axis_names)
    return ids, tuple(jmesh.axis_names), types


def _context_mesh():
    """(device ids, axis names, axis types) of the concrete mesh the call runs under
    (`jax.set_mesh`), or None: a source reproducer calls the program under it, so a bare
    PartitionSpec the program states (``out_sharding=P(...)``) names the same mesh."""
    import jax

    get = getattr(jax.sharding, "get_mesh", None)
    mesh = get() if get is not None else None
    if not isinstance(mesh, jax.sharding.Mesh) or getattr(mesh, "empty", False) or not mesh.axis_names:
        return None
    return _mesh_desc(mesh)


def _layout(x):
    return _layout_of(getattr(x, "sharding", None))


def _layout_of(sh) -> str:
    """LAYOUTS' entry for an input placed by `sh`: a NamedSharding over several devices, else None."""
    import jax

    if isinstance(sh, jax.sharding.NamedSharding) and len(sh.device_set) > 1:
        ids, names, types = _mesh_desc(sh.mesh)
        return f"({ids!r}, {names!r}, {types!r}, {spec_source(PartitionSpec.from_jax(sh.spec))})"
    mesh = getattr(sh, "mesh", None)
    if isinstance(sh, refsim.NamedSharding) and isinstance(mesh, refsim.Mesh) and mesh.size > 1:
        # the oracle's host copy of an unreduced input (a refsim.Array): its mesh's device ids
        ids = np.asarray(mesh.device_ids).tolist()
        types = tuple(getattr(t, "name", str(t)) for t in mesh.axis_types)
        return f"({ids!r}, {tuple(mesh.axis_names)!r}, {types!r}, {spec_source(sh.spec)})"
    return "None"


def _partial_inputs_source(partial: dict) -> str:
    return ("# inputs unreduced over some mesh axes: {leaf: global shape}; DATA holds each device's partial "
            f"value as in<leaf>_dev<device>\nPARTIAL_INPUTS = {partial!r}")


def _policy_name(tol, dtype) -> str:
    """compare's element rule for `tol` on `dtype` (`compare.element_rule`), "scaled" for the
    oracle's `ScaledBound` (a sum_bound check around refsim's value)."""
    rule = compare.element_rule(tol, dtype)
    return "scaled" if rule == "sum_bound" and isinstance(tol, ScaledBound) else rule


def _wrap_source(wrap) -> str:
    if wrap is None:
        return "WRAP = None"
    lines = ["WRAP = {"]
    for k, v in wrap.items():
        lines.append(f"    {k!r}: {v},")
    return "\n".join(lines + ["}"])


def _expected_section(arrays: dict, expected, tolerances) -> tuple[list, list]:
    """(source lines from EXPECTED_INDEX to DATA, policy names); refsim's shards (and the arrays
    of each scaled check) go into `arrays` next to the inputs already there."""
    pols = [_policy_name(t, a.dtype) for t, a in zip(tolerances, expected)]
    index_lines, allowed = [], []
    for k, (arr, tol) in enumerate(zip(expected, tolerances)):
        index_lines.append("    {")
        for sh in arr.shards:
            d = int(sh.device_id)
            data = np.asarray(sh.data)
            arrays[f"out{k}_dev{d}"] = data
            index_lines.append(f"        {d}: {_index_source(sh.index)},")
            if pols[k] in ("scaled", "sum_bound"):
                for f, v in pack_sum_check(**tol.check_arrays(d, data.dtype)).items():
                    arrays[f"sum{k}_dev{d}_{f}"] = v
        index_lines.append("    },")
        allowed.append(float(tol.allowed(np.asarray(arr.shards[0].data).dtype)) if pols[k] == "scaled" else None)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    out = ["EXPECTED_INDEX = ["] + index_lines + ["]"]
    out.append(f"POLICIES = {pols!r}")
    out.append(f"ULPS = {[getattr(t, 'ulps', None) if p == 'ulp' else None for t, p in zip(tolerances, pols)]!r}")
    out.append(f"ALLOWED = {allowed!r}  # 'scaled' outputs: the allowed |xla - refsim| per element")
    out.append("# per output, where JAX's result is unreduced: refsim states each device's partial value "
               "('per device', a shard_map's out_specs) or the value they combine to ('combined')")
    out.append(f"PARTIALS = {[_partials_word(a) for a in expected]!r}")
    out.append("# inputs in0..., refsim's shards out<k>_dev<d> (and sum bounds), as a base64 .npz")
    out += _base64_lines("DATA", buf.getvalue())
    return out, pols


def _partials_word(arr) -> str:
    """PARTIALS' entry for refsim's expected output `arr`: "per device" when it keeps a partial
    value per device (unreduced axes in its layout), else "combined"."""
    spec = getattr(getattr(arr, "sharding", None), "spec", None)
    return "per device" if getattr(spec, "unreduced", None) else "combined"


def unreduced_partials(x) -> dict | None:
    """{device id: its own partial value} of an input unreduced over some mesh axes (a jax.Array
    or the oracle's host copy of one, a refsim.Array), else None. NotReproducible for partial
    values combined other than by sum (jax 0.12's unreduced_kind max / min)."""
    spec = getattr(getattr(x, "sharding", None), "spec", None)
    if not getattr(spec, "unreduced", None):
        return None
    if compat.unreduced_kind_of(spec) != "sum":
        raise NotReproducible(f"an input's partial values combine by {compat.unreduced_kind_of(spec)} ({spec}); "
                              "the reproducer states unreduced inputs whose partial values are summed.")
    if isinstance(x, refsim.Array):
        return {int(s.device_id): np.array(np.asarray(s.data), copy=True) for s in x.shards}
    # a jax.Array: each device's own data (JAX 0.12 refuses its shards' index, both a global read)
    return {int(s.device.id): np.array(np.asarray(s.data), copy=True) for s in x.addressable_shards}


def _store_input(arrays: dict, partial: dict, i: int, x, dtype=None) -> None:
    """Input leaf `i` into `arrays` (DATA): its global value as ``in<i>``, or for an input
    unreduced over some mesh axes each device's partial value as ``in<i>_dev<d>`` (its global
    shape recorded in `partial`, PARTIAL_INPUTS)."""
    parts = unreduced_partials(x)
    if parts is None:
        a = np.asarray(x)
        arrays[f"in{i}"] = a if dtype is None else a.astype(dtype, copy=False)
        return
    for d, v in parts.items():
        arrays[f"in{i}_dev{d}"] = v if dtype is None else v.astype(dtype, copy=False)
    partial[i] = tuple(int(n) for n in np.shape(x))


def _base64_lines(name: str, raw: bytes, width: int = 100) -> list:
    blob = base64.b64encode(raw).decode("ascii")
    return [f"{name} = ("] + [f"    {blob[i:i + width]!r}" for i in range(0, len(blob), width)] + [")"]


def _ndev(expected) -> int:
    return max([int(s.device_id) for a in expected for s in a.shards] or [0]) + 1


def source(fn, name: str, args, kwargs, expected, tolerances, wrap=None) -> str:
    """The reproducer of one checked call: `fn` as located by `locate`, its (args, kwargs) as
    placed, refsim's `expected` outputs (refsim.Arrays) and the per-output `tolerances`."""
    import jax

    file, module, root, pname = locate(fn)
    leaves = jax.tree_util.tree_leaves((tuple(args), dict(kwargs)))
    arrays: dict[str, np.ndarray] = {}
    partial: dict[int, tuple] = {}
    for i, x in enumerate(leaves):
        if getattr(x, "is_deleted", lambda: False)():
            raise NotReproducible(f"argument leaf {i} was donated to the call (deleted); check without "
                                  "donate_argnums to get a reproducer.")
        if unreduced_partials(x) is None and np.asarray(x).dtype == object:
            raise NotReproducible(f"argument leaf {i} is a {type(x).__name__}, not an array; pass arrays "
                                  "(or bind other values with functools.partial).")
        _store_input(arrays, partial, i, x)
    tail, pols = _expected_section(arrays, expected, tolerances)
    out = [_HEAD.format(name=name, what=f"Imports the program from {file}", policy=", ".join(sorted(set(pols))),
                        ndev=_ndev(expected))]
    out.append(f"PROGRAM_FILE = {file!r}")
    out.append(f"PROGRAM_MODULE = {module!r}")
    out.append(f"PROGRAM_ROOT = {root!r}")
    out.append(f"PROGRAM_NAME = {pname!r}")
    out.append("EXPORTED = None")
    out.append("DEVICE_PUT = None")
    out.append(_wrap_source(wrap))
    out.append("# the mesh the call ran under (jax.set_mesh), or None")
    out.append(f"CONTEXT_MESH = {_context_mesh()!r}")
    out.append(_args_source(args, kwargs))
    out.append("# per input leaf: None (placed by JAX) or (mesh device ids, axis names, axis types, PartitionSpec)")
    out.append("LAYOUTS = [" + ", ".join(_layout(x) for x in leaves) + "]")
    out.append(_partial_inputs_source(partial))
    return "\n".join(out + tail) + _MAIN


#: What an exported reproducer says about `python -m conformance explain` / `bisect`.
NOT_BISECTABLE = ("python -m conformance explain FILE compares its lowered, compiled and executed stages; its "
                  "jaxpr stage and python -m conformance bisect need the program's jaxpr, which a serialized "
                  "program does not keep: bind the checked callable to a module-level name to get a reproducer "
                  "that imports it")


def export_program(traced, out_shardings=None) -> bytes:
    """The traced call (`program.Traced`, its inputs' placement recorded by `take_host_copies`)
    serialized by `jax.export`: StableHLO with the inputs' shardings and `out_shardings` (the
    shardings XLA's outputs had), so the program re-runs on XLA without its Python source."""
    import jax
    from jax.extend.core import jaxpr_as_fun

    if traced.in_avals is None:
        raise NotReproducible("the call's inputs were not recorded before it ran; no program to export.")
    closed = traced.closed
    specs, shardings = [], []
    for v, (_, _, sh) in zip(closed.jaxpr.invars, traced.in_avals):
        aval = v.aval
        if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended):
            raise NotReproducible(f"an input is a {aval.dtype} array, which the reproducer cannot store.")
        sh = sh if isinstance(sh, jax.sharding.Sharding) else None
        specs.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sh))
        shardings.append(sh)
    for k, s in enumerate(out_shardings or ()):
        kind = compat.unreduced_kind_of(getattr(s, "spec", None))
        if getattr(getattr(s, "spec", None), "unreduced", None) and kind != "sum":
            # jax 0.12's export keeps the unreduced axes but not their kind: the deserialized
            # program's call fails ("Unexpected XLA sharding override ... unreduced_kind=sum")
            raise NotReproducible(f"output {k} is unreduced with unreduced_kind={kind}, which jax.export does not "
                                  "keep (the deserialized program fails to run); bind the checked callable to a "
                                  "module-level name to get a reproducer that imports it.")
    kw = {}
    if all(s is not None for s in shardings):
        kw["in_shardings"] = tuple(shardings)
    if out_shardings is not None and all(isinstance(s, jax.sharding.Sharding) for s in out_shardings):
        kw["out_shardings"] = tuple(out_shardings)

    def program(*xs):
        return tuple(jaxpr_as_fun(closed)(*xs))

    try:
        return jax.export.export(jax.jit(program, **kw))(*specs).serialize()
    except Exception as e:  # noqa: BLE001 - whatever export refuses, the disagreement stands
        first = str(e).splitlines()[0][:200] if str(e) else ""
        raise NotReproducible(f"jax.export could not serialize the program: {type(e).__name__}: {first}") from e


def _imported_nothing(name: str, program_name: str, what: str, pols, expected, layouts, partial) -> list[str]:
    """The head of a reproducer that imports no program (an exported one, a device_put): its
    docstring, the program variables unset, the inputs' layouts and unreduced partial values."""
    return [_HEAD.format(name=name, what=what, policy=", ".join(sorted(set(pols))), ndev=_ndev(expected)),
            "PROGRAM_FILE = None", "PROGRAM_MODULE = None", "PROGRAM_ROOT = None",
            f"PROGRAM_NAME = {program_name!r}", "WRAP = None", "CONTEXT_MESH = None",
            "ARGS = lambda L: (tuple(L), {})",
            "# per input: None (placed by JAX) or (mesh device ids, axis names, axis types, PartitionSpec)",
            "LAYOUTS = [" + ", ".join(layouts) + "]", _partial_inputs_source(partial)]


def exported_source(traced, name: str, expected, tolerances, out_shardings=None) -> str:
    """The reproducer of one checked call that has no module-level name (a closure, a local, a
    JAX-internal function, an eager operation): the program exported by `export_program`, its
    flat inputs as placed and refsim's `expected` outputs; run it with JAX alone."""
    import jax

    blob = export_program(traced, out_shardings)
    arrays: dict[str, np.ndarray] = {}
    partial: dict[int, tuple] = {}
    layouts = []
    for i, (v, x, (_, _, sh)) in enumerate(zip(traced.closed.jaxpr.invars, traced.flat_args, traced.in_avals)):
        _store_input(arrays, partial, i, x, v.aval.dtype)
        layouts.append(_layout_of(sh) if isinstance(sh, jax.sharding.Sharding) else "None")
    tail, pols = _expected_section(arrays, expected, tolerances)
    what = ("Runs the program as jax.export serialized it (StableHLO with its shardings: the checked callable "
            f"had no module-level name to import). {NOT_BISECTABLE}")
    out = _imported_nothing(name, name, what, pols, expected, layouts, partial)
    out.append(f"NOT_BISECTABLE = {NOT_BISECTABLE!r}")
    out.append("DEVICE_PUT = None")
    out += _base64_lines("EXPORTED", blob)
    return "\n".join(out + tail) + _MAIN


#: What a device_put reproducer says about `python -m conformance explain` / `bisect`.
NOT_A_PROGRAM = ("a jax.device_put moves data without a program: python -m conformance explain and bisect have "
                 "no stages or equations to compare; the reproducer itself shows the misplaced blocks")


def device_put_source(hosts, targets, expected) -> str:
    """The reproducer of a `jax.device_put` that disagreed: each input's global value (placed
    first as it was laid out, for a reshard between meshes), each target NamedSharding, and
    refsim's expected blocks per device (exact)."""
    import jax

    arrays: dict[str, np.ndarray] = {}
    partial: dict[int, tuple] = {}
    layouts, puts = [], []
    for i, (h, t) in enumerate(zip(hosts, targets)):
        t = getattr(t, "sharding", t)                         # a Format: its sharding
        if not (isinstance(t, jax.sharding.NamedSharding) and isinstance(t.mesh, jax.sharding.Mesh)):
            raise NotReproducible(f"input {i}'s target {type(t).__name__} is not a NamedSharding over a mesh; "
                                  "the reproducer states targets by their mesh and PartitionSpec.")
        if not isinstance(h, (np.ndarray, refsim.Array)):
            raise NotReproducible(f"input {i} is a {type(h).__name__}, which the reproducer cannot store.")
        # a global value, or (moved off an unreduced layout) each device's partial value
        _store_input(arrays, partial, i, h if isinstance(h, refsim.Array) else np.asarray(h).view(np.ndarray))
        layouts.append(_layout_of(getattr(h, "sharding", None)))
        ids, names, types = _mesh_desc(t.mesh)
        puts.append(f"({ids!r}, {names!r}, {types!r}, {spec_source(PartitionSpec.from_jax(t.spec))})")
    tail, pols = _expected_section(arrays, expected, [compare.EXACT] * len(expected))
    what = f"Calls jax.device_put on the inputs as they were placed ({NOT_A_PROGRAM})"
    out = _imported_nothing("device_put", "jax.device_put", what, pols, expected, layouts, partial)
    out.append("EXPORTED = None")
    out.append("# per input: the target (mesh device ids, axis names, axis types, PartitionSpec)")
    out.append("DEVICE_PUT = [" + ", ".join(puts) + "]")
    out.append(f"NOT_BISECTABLE = {NOT_A_PROGRAM!r}")
    return "\n".join(out + tail) + _MAIN


def write(directory: str, name: str, text: str) -> str:
    """Write `text` as ``<directory>/<name>.py`` (a safe file name); returns the path."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:80] or "program"
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"repro_{safe}.py")
    k = 1
    while os.path.exists(path):
        k += 1
        path = os.path.join(directory, f"repro_{safe}_{k}.py")
    with open(path, "w") as fh:
        fh.write(text)
    return path


__all__ = ["NOT_BISECTABLE", "NotReproducible", "export_program", "exported_source", "locate", "source", "write"]
