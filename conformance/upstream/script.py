"""The plain-JAX script of a finding: JAX and NumPy only, the device count set inside.

`script_text(case, ...)` writes a drawn sharded program (`conformance.strategies.sharded`) as a
script a JAX or XLA engineer runs as is: it sets ``XLA_FLAGS`` to the device count it needs
before JAX is imported, picks the partitioner from its first argument (``shardy`` or ``gspmd``),
jits the program with the drawn in/out shardings over the drawn mesh (device order kept), and
checks every device's shard against an expected value computed independently of the sharding:

* ``expected="one-device"``: the same program jitted on one device (every mesh axis of size 1,
  so nothing is split), computed by the script itself; the generator confirms it against refsim
  first (`conformance.upstream.helper`'s ``confirm``);
* ``expected="embedded"``: the global values refsim (NumPy) computed, written in as literals.
  Used where the one-device run is not the same program (a ``shard_map`` region's collectives
  and block shapes depend on the mesh) or disagrees with refsim.

A wrong value ends the script with an `AssertionError` naming the output, the device and the
first differing elements; a crash or an exception is the failure itself. Nothing here imports
JAX: the text is built from the case's source, layouts and arrays.
"""
from __future__ import annotations

import math
import re

import numpy as np

from conformance.strategies import _program_classes as pc
from conformance.strategies._sharded_graph import spec_text

__all__ = ["EXPECTED_MODES", "array_literal", "manual_ops", "script_text", "tolerances_of"]

EXPECTED_MODES = ("one-device", "embedded")


def array_literal(a) -> str:
    """Source rebuilding `a` bit for bit: float values as exact Python floats, nan / inf by name."""
    a = np.asarray(a)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"an array of dtype {a.dtype} has no literal here; programs draw bool, int and float")
    vals = a.astype(np.float64) if a.dtype.kind == "f" and a.dtype.itemsize < 4 else a
    dt = "np.bool_" if a.dtype == np.bool_ else f"np.{a.dtype.name}"
    body = repr(vals.ravel().tolist()).replace("nan", "nan_").replace("inf", "inf_")
    return f"np.array({body}, dtype={dt}).reshape({tuple(int(d) for d in a.shape)!r})"


def _spec(spec) -> str:
    parts = ["P.UNCONSTRAINED" if type(p).__name__ == "_Unconstrained" else repr(p) for p in spec]
    for name in ("unreduced", "reduced"):
        axes = sorted(getattr(spec, name, None) or ())
        if axes:
            parts.append(f"{name}={{{', '.join(repr(a) for a in axes)}}}")
    return "P(" + ", ".join(parts) + ")"


def _specs(shardings) -> str:
    items = [_spec(s.spec) for s in shardings]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def manual_ops(case) -> list:
    """The ``shard_map`` regions of `case` whose values depend on the mesh itself (their
    collectives, axis indices and block shapes), as source lines: those manual over an axis of
    size > 1. With one, the program on one device is another program; a region manual only over
    size-1 axes computes the same there."""
    sizes = dict(zip(case.mesh.axis_names, (int(n) for n in case.mesh.axis_sizes)))
    out = []
    for line in case.source.splitlines():
        if "jax.shard_map(" not in line:
            continue
        m = re.search(r"axis_names=\{([^}]*)\}", line)
        axes = re.findall(r"'([^']+)'", m.group(1)) if m else list(sizes)
        if any(sizes.get(a, 2) > 1 for a in axes):
            out.append(line.strip())
    return out


def tolerances_of(case, expected) -> list:
    """Per output, the largest allowed absolute difference (0: bit for bit, either sign of zero),
    from the case's value model (`ShardedProgram.policies`) and refsim's `expected` global values
    (None where refsim could not run: exact, or 2**-10 of 1 for a derivative)."""
    out = []
    for k, (kind, value) in enumerate(case.policies):
        if kind == "exact":
            out.append(0.0)
        elif kind == "abs":
            out.append(2 * float(value))           # two correct results, each within `value` of exact
        else:
            scale = 1.0
            if expected is not None:
                x = np.asarray(expected[k], np.float64)
                scale = max(1.0, float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0)))
            out.append(2 * float(value) * scale)
    return out


_HEAD = '''\
"""{title}

{about}
Run: python {{this file}} [shardy|gspmd]      (default: {partitioner}, the partitioner it was found with)
Needs only JAX and NumPy; it sets the device count itself ({ndev} XLA:CPU devices).
"""
import os
import sys
from importlib.metadata import version

# {ndev} virtual CPU devices, set before JAX is imported
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count={ndev}"
{platform_line}
import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

PARTITIONER = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else {partitioner!r}
if PARTITIONER not in ("shardy", "gspmd"):
    sys.exit(f"usage: python {{sys.argv[0]}} [shardy|gspmd]; got {{PARTITIONER!r}}")
jax.config.update("jax_use_shardy_partitioner", PARTITIONER == "shardy")
nan_, inf_ = float("nan"), float("inf")

# -- the program ------------------------------------------------------------------------------------
'''

_RUN = '''
# -- its layouts: the mesh (device order kept) and jit's in / out shardings -------------------------
MESH_SHAPE = {shape!r}
AXIS_NAMES = {names!r}
AXIS_TYPES = {types}
DEVICE_IDS = {ids!r}
IN_SPECS = {in_specs}
OUT_SPECS = {out_specs}


def inputs():
    return (
{inputs}
    )


def run(mesh_shape, device_ids):
    """The outputs of `f` jitted with IN_SPECS / OUT_SPECS over a mesh of `mesh_shape` on the
    devices `device_ids` (row-major)."""
    devices = {{d.id: d for d in jax.devices()}}
    grid = np.array([devices[i] for i in np.ravel(device_ids)], dtype=object).reshape(mesh_shape)
    mesh = jax.sharding.Mesh(grid, AXIS_NAMES, axis_types=AXIS_TYPES)
    with jax.set_mesh(mesh):
        fn = jax.jit(f, {donate}in_shardings=tuple(NamedSharding(mesh, s) for s in IN_SPECS),
                     out_shardings=tuple(NamedSharding(mesh, s) for s in OUT_SPECS))
        # placed as jit's in_shardings lay them out (on an Explicit mesh a NumPy argument's type has no
        # sharding, and JAX traces another program: one that can raise where this one runs)
        args = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs(), IN_SPECS)]
        return jax.tree_util.tree_leaves(fn(*args))

'''

_ONE_DEVICE = '''
def expected():
    """The same program jitted on one device: every mesh axis of size 1, so nothing is split.
    (It agreed with a NumPy reference interpreter, refsim, when this script was written.)"""
    return [np.asarray(o) for o in run((1,) * len(AXIS_NAMES), [jax.devices()[0].id])]

'''

_EMBEDDED = '''
def expected():
    """{why}"""
    return [
{values}
    ]

'''

_CHECK = '''
# per output: the largest allowed difference (0.0: bit for bit, either sign of zero)
TOLERANCE = {tolerance!r}


def differences(k, got, want):
    """How output `k`'s shard `got` differs from `want`, in words ('' when it agrees)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape / dtype {{got.dtype}}{{list(got.shape)}}, expected {{want.dtype}}{{list(want.shape)}}"
    a, b = got.astype(np.float64), want.astype(np.float64)
    bad = ~((a == b) | (np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= TOLERANCE[k]))
    if not bad.any():
        return ""
    at = [tuple(int(i) for i in ix) for ix in np.argwhere(bad)[:3]]
    return (f"{{int(bad.sum())}} of {{bad.size}} elements differ, first at "
            + ", ".join(f"{{ix}}: got {{got[ix].tolist()!r}}, expected {{want[ix].tolist()!r}}" for ix in at))


def block(index):
    """A shard's index as NumPy slicing text: [0:2, :]."""
    return "[" + ", ".join(":" if s == slice(None) else f"{{s.start or 0}}:{{s.stop}}" for s in index) + "]"


def main():
    print(jax.__version__, "jaxlib", version("jaxlib"), PARTITIONER, flush=True)
    got = run(MESH_SHAPE, DEVICE_IDS)      # the sharded program: what fails
    want = expected()
    assert len(got) == len(want), f"{{len(got)}} outputs, expected {{len(want)}}"
    wrong = {{}}   # (output, block, what differs) -> devices
    for k, (out, w) in enumerate(zip(got, want)):
        for shard in sorted(out.addressable_shards, key=lambda s: s.device.id):
            why = differences(k, np.asarray(shard.data), np.asarray(w)[shard.index])
            if why:
                wrong.setdefault((k, block(shard.index), why), []).append(shard.device.id)
    wrong = [f"output {{k}}, block {{b}} on device(s) {{', '.join(map(str, d))}}: {{why}}"
             for (k, b, why), d in wrong.items()]
    print("\\n".join(wrong) or "every shard of every output agrees")
    assert not wrong, f"wrong values under {{PARTITIONER}}: " + wrong[0]


if __name__ == "__main__":
    main()
'''


_CHAIN_RUN = '''# per call: its axis order, its devices by position in DEVICE_IDS (row-major), its out specs
CHAIN = [
{rows}
]


def run(mesh_shape, device_ids):
    """`f` (one training step) jitted once per CHAIN entry, each on a mesh of the same devices in
    another order and axis order; the carry (output 0) and the other arguments are moved into each
    next call's shardings by `jax.device_put`. Returns the last carry, then every call's outputs."""
    devices = {{d.id: d for d in jax.devices()}}
    flat = [int(i) for i in np.ravel(device_ids)]
    args, outs = list(inputs()), []
    for names, positions, specs in CHAIN:
        shape = tuple(mesh_shape[AXIS_NAMES.index(a)] for a in names)
        ids = [flat[p] for p in positions] if len(positions) == len(flat) else flat
        grid = np.array([devices[i] for i in ids], dtype=object).reshape(shape)
        mesh = jax.sharding.Mesh(grid, names, axis_types=tuple(AXIS_TYPES[AXIS_NAMES.index(a)] for a in names))
        ins = tuple(NamedSharding(mesh, s) for s in IN_SPECS)
        args = [jax.device_put(a, s) for a, s in zip(args, ins)]
        with jax.set_mesh(mesh):
            o = jax.jit(f, in_shardings=ins, out_shardings=tuple(NamedSharding(mesh, s) for s in specs))(*args)
        args[0], outs = o[0], outs + list(o[1:])
    return jax.tree_util.tree_leaves([args[0]] + outs)
'''


def _chained(case, text: str) -> str:
    """`text` with a `run` that makes the calls of a ``jit_chain_orders`` case (see its class)."""
    flat = [int(i) for i in np.ravel(case.mesh.device_ids)]
    rows = []
    for m, specs in zip(pc.chain_meshes(case.graph.program_class, case.mesh),
                        pc.chain_specs(case.graph.program_class, len(case.graph.outs))):
        positions = [flat.index(int(i)) for i in np.ravel(m.device_ids)]
        rows.append(f"    ({tuple(m.axis_names)!r}, {positions!r}, ({''.join(spec_text(sp) + ', ' for sp in specs)})),")
    start = text.index("def run(mesh_shape, device_ids):")
    end_mark = "return jax.tree_util.tree_leaves(fn(*args))\n"
    end = text.index(end_mark, start) + len(end_mark)
    return text[:start] + _CHAIN_RUN.format(rows="\n".join(rows)) + text[end:]


def script_text(case, *, title: str, about: str, expected: str = "one-device", values=None, why: str = "",
                tolerance=None, platform: str = "cpu") -> str:
    """The script of `case` (a `ShardedProgram`). expected: an `EXPECTED_MODES` name; values: the
    global expected arrays (``"embedded"``); why: the docstring of the embedded ``expected()``;
    tolerance: per output, the allowed difference (`tolerances_of`); title / about: its docstring."""
    if expected not in EXPECTED_MODES:
        raise ValueError(f"expected={expected!r}; pass one of {EXPECTED_MODES}")
    if expected == "embedded" and values is None:
        raise ValueError("expected='embedded' needs values= (refsim's global outputs)")
    m = case.mesh
    ids = np.asarray(m.device_ids)
    types = tuple(t.name for t in m.axis_types)
    n_out = len(case.out_shardings)
    tol = [0.0] * n_out if tolerance is None else [float(t) for t in tolerance]
    text = _HEAD.format(title=title.replace('"""', "'''"), about=about.replace('"""', "'''"),
                        partitioner=case.partitioner, ndev=int(ids.max()) + 1,
                        platform_line=('os.environ.setdefault("JAX_PLATFORMS", "cpu")   # found on XLA:CPU\n'
                                       if platform == "cpu" else ""))
    text += case.source.strip() + "\n\n"
    text += _RUN.format(shape=tuple(int(s) for s in m.axis_sizes), names=tuple(m.axis_names),
                        types="(" + ", ".join(f"jax.sharding.AxisType.{t}" for t in types)
                              + ("," if len(types) == 1 else "") + ")",
                        ids=ids.tolist(), in_specs=_specs(case.in_shardings), out_specs=_specs(case.out_shardings),
                        donate=(f"donate_argnums={tuple(case.donate_argnums)!r}, "
                                if getattr(case, "donate_argnums", ()) else ""),
                        inputs="\n".join(f"        {array_literal(a)}," for a in case.args))
    kinds = [getattr(x, "memory_kind", None) or "device" for x in (*case.in_shardings, *case.out_shardings)]
    if set(kinds) - {"device"}:   # the jit's shardings in memory kinds (pinned_host): stated as the case has them
        n_in = len(case.in_shardings)
        text = text.replace("IN_SPECS = ", f"IN_MEMORY_KINDS = {tuple(kinds[:n_in])!r}\n"
                                           f"OUT_MEMORY_KINDS = {tuple(kinds[n_in:])!r}\nIN_SPECS = ", 1)
        text = text.replace("in_shardings=tuple(NamedSharding(mesh, s) for s in IN_SPECS)",
                            "in_shardings=tuple(NamedSharding(mesh, s, memory_kind=k) "
                            "for s, k in zip(IN_SPECS, IN_MEMORY_KINDS))", 1)
        text = text.replace("out_shardings=tuple(NamedSharding(mesh, s) for s in OUT_SPECS)",
                            "out_shardings=tuple(NamedSharding(mesh, s, memory_kind=k) "
                            "for s, k in zip(OUT_SPECS, OUT_MEMORY_KINDS))", 1)
        # the arguments placed where the jit takes them (JAX refuses a device argument for a pinned_host one)
        text = text.replace("args = [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(inputs(), IN_SPECS)]",
                            "args = [jax.device_put(x, NamedSharding(mesh, s, memory_kind=k)) "
                            "for x, s, k in zip(inputs(), IN_SPECS, IN_MEMORY_KINDS)]", 1)
    if getattr(case, "program_class", "plain") == "jit_chain_orders":
        text = _chained(case, text)
    if expected == "one-device":
        text += _ONE_DEVICE
    else:
        text += _EMBEDDED.format(why=why or "The program's global outputs, computed by refsim (a NumPy reference "
                                           "interpreter of JAX programs).",
                                 values="\n".join(f"        {array_literal(v)}," for v in values))
    text += _CHECK.format(tolerance=[t if math.isfinite(t) else 1e308 for t in tol])
    return text
