"""Read conformance reproducer files (`# conformance reproducer v1`) as bisectable cases.

A reproducer defines, at module level or in a named dict (or a function returning one):
MESH_SHAPE, AXIS_NAMES, AXIS_TYPES (optional: names of AxisType, default Auto), DEVICE_IDS (JAX
device ids in mesh shape), KIND ("shard_map", "jit", "pmap" or "device_put"), the layouts of that kind (IN_SPECS/OUT_SPECS/CHECK_VMA;
IN_SHARDINGS/OUT_SHARDINGS as PartitionSpecs over the mesh; AXIS_NAME/IN_AXES/OUT_AXES; for
"device_put" IN_SHARDINGS[0] places inputs()[0] on DEVICE_IDS and OUT_SHARDINGS reshards it
onto OUT_DEVICE_IDS, default the same devices), `program`, `inputs()`, and optionally
EXPECTED and TOLERANCE. `FILE.py:NAME` selects case NAME.

A reproducer written by `conformance.check` (and oracle mode: `conformance.oracle.reproduce`,
PROGRAM_NAME and WRAP instead of KIND) is read as a "called" case: `program()` is the callable
as the user ran it (under its jax.jit / shard_map, or wrapped as WRAP says) and `inputs()` its
(args, kwargs) placed as they were checked; explain and bisect take it as `conformance.check` did.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from typing import Any, Callable

import numpy as np

from conformance.debug.bisect import bisect
from conformance.debug.movement import compare_device_put
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

KINDS = ("shard_map", "jit", "pmap", "device_put")
CALLED = "called"
_PMAP_DEFAULT_AXIS = "_internal_pmap_axis_name"


@dataclasses.dataclass(frozen=True)
class Reproducer:
    """One case of a reproducer file, with its layouts as refsim objects."""

    target: str
    kind: str
    mesh: Mesh | None
    program: Callable
    inputs: tuple
    in_specs: Any = None
    out_specs: Any = None
    check_vma: bool = True
    in_shardings: Any = None
    out_shardings: Any = None
    axis_name: Any = None
    in_axes: Any = 0
    out_axes: Any = 0
    device_ids: Any = None
    expected: Any = None
    tolerance: str = "exact"
    kwargs: Any = None
    #: why the case has no jaxpr (an oracle reproducer holding the program as jax.export serialized
    #: it: explain compares its lowered, compiled and executed stages, bisect cannot run); "" otherwise
    no_jaxpr: str = ""

    def bisect_kwargs(self) -> dict:
        """Keyword arguments of `conformance.debug.bisect` for this case (pmap as its shard_map; a
        "called" case needs none: its program runs as given, with its keyword arguments bound)."""
        if self.kind == CALLED:
            if not self.kwargs:
                return {}

            return {"_fn": functools.partial(self.program, **self.kwargs)}
        if self.kind == "device_put":
            raise ValueError(f"{self.target} is a device_put case: one data movement with no equations, so "
                             "there is no program to bisect; call .bisect(), which compares it device by device.")
        if self.kind == "shard_map":
            return dict(mesh=self.mesh, in_specs=self.in_specs, out_specs=self.out_specs, check_vma=self.check_vma)
        if self.kind == "jit":
            return dict(mesh=self.mesh, in_shardings=self.in_shardings, out_shardings=self.out_shardings)
        fn, mesh, in_specs, out_specs = pmap_as_shard_map(self.program, self.inputs, self.axis_name, self.in_axes,
                                                          self.out_axes, self.device_ids)
        return dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False, _fn=fn)

    def bisect(self, *, runner=None, max_ulp: float = 0, tolerance: str = "auto", policy: str = "auto"):
        """Run `conformance.debug.bisect` on this case; a device_put case, which has no equations,
        is compared device by device instead (`conformance.debug.movement`, runner(x, source, target))."""
        if self.kind == "device_put":
            return compare_device_put(self.inputs[0], self.in_shardings[0], self.out_shardings, runner=runner,
                                      max_ulp=max_ulp)

        kw = self.bisect_kwargs()
        fn = kw.pop("_fn", self.program)
        return bisect(fn, *self.inputs, runner=runner, max_ulp=max_ulp, tolerance=tolerance, policy=policy, **kw)


def split_target(target: str) -> tuple[str, str | None]:
    """`FILE.py[:NAME]` -> (path, NAME or None); a drive letter's colon is not a separator."""
    m = re.match(r"^(.*\.py):([A-Za-z_][A-Za-z0-9_]*)$", target)
    return (m.group(1), m.group(2)) if m else (target, None)


def _import(path: str):
    if not os.path.isfile(path):
        raise ValueError(f"reproducer file {path!r} does not exist; pass FILE.py or FILE.py:NAME.")
    name = "_conformance_repro_" + re.sub(r"\W", "_", os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(target: str) -> Reproducer:
    """The case `FILE.py[:NAME]` names: NAME is a module-level dict (or a function returning one)
    with the reproducer keys; without NAME the module's own attributes are the case."""
    path, name = split_target(target)
    module = _import(path)
    if name is None:
        fields = vars(module)
    else:
        if not hasattr(module, name):
            cases = sorted(k for k, v in vars(module).items() if isinstance(v, dict) and "program" in v)
            raise ValueError(f"{path} has no case {name!r}; cases defined there: {cases or 'none (use FILE.py)'}.")
        obj = getattr(module, name)
        fields = obj() if callable(obj) else obj
        if not isinstance(fields, dict):
            raise TypeError(f"{target}: {name} must be a dict of reproducer fields or a function returning one, "
                            f"got {type(fields).__name__}.")
    return from_fields(fields, target)


def _get(fields: dict, key: str, target: str, default: Any = ...) -> Any:
    if key in fields:
        return fields[key]
    if default is not ...:
        return default
    raise ValueError(f"reproducer {target} has no {key}; a reproducer defines MESH_SHAPE, AXIS_NAMES, KIND, "
                     "the layouts of its KIND, program and inputs (see conformance.debug.loader).")


def _spec(p) -> PartitionSpec | None:
    if p is None or isinstance(p, PartitionSpec):
        return p
    import jax

    if isinstance(p, jax.sharding.PartitionSpec):
        return PartitionSpec.from_jax(p)
    if isinstance(p, (tuple, list)):
        return tuple(_spec(x) for x in p)
    raise TypeError(f"expected a PartitionSpec (or a tuple of them), got {p!r}.")


def from_fields(fields: dict, target: str = "<fields>") -> Reproducer:
    """A Reproducer from a dict of reproducer fields (the module attributes' names)."""
    if "KIND" not in fields and "PROGRAM_NAME" in fields and callable(fields.get("program")):
        return _called(fields, target)
    kind = _get(fields, "KIND", target)
    if kind not in KINDS:
        raise ValueError(f"reproducer {target}: KIND={kind!r}; use one of {KINDS}.")
    program = _get(fields, "program", target)
    raw = _get(fields, "inputs", target)
    inputs = tuple(np.asarray(x) for x in (raw() if callable(raw) else raw))
    ids = fields.get("DEVICE_IDS")
    common = dict(target=target, kind=kind, program=program, inputs=inputs,
                  expected=fields.get("EXPECTED"), tolerance=fields.get("TOLERANCE", "exact"))
    if kind == "pmap":
        return Reproducer(mesh=None, axis_name=fields.get("AXIS_NAME"), in_axes=fields.get("IN_AXES", 0),
                          out_axes=fields.get("OUT_AXES", 0), device_ids=ids, **common)
    shape = tuple(int(s) for s in _get(fields, "MESH_SHAPE", target))
    names = tuple(_get(fields, "AXIS_NAMES", target))
    # AXIS_TYPES (Explicit / Manual axes; absent: Auto) types the mesh the program runs on: an
    # Explicit program (reshard, out_sharding=) means something else, or nothing, on Auto axes
    mesh = Mesh(shape, names, device_ids=None if ids is None else np.asarray(ids).reshape(shape),
                axis_types=fields.get("AXIS_TYPES"))
    if kind == "shard_map":
        return Reproducer(mesh=mesh, in_specs=_spec(_get(fields, "IN_SPECS", target)),
                          out_specs=_spec(_get(fields, "OUT_SPECS", target)),
                          check_vma=bool(fields.get("CHECK_VMA", True)), **common)

    def named(tree, on=mesh):
        if tree is None:
            return None
        spec = _spec(tree)
        if isinstance(spec, tuple) and not isinstance(spec, PartitionSpec):
            return tuple(None if s is None else NamedSharding(on, s) for s in spec)
        return NamedSharding(on, spec)

    if kind == "device_put":
        return _device_put(fields, target, mesh, named, common)
    return Reproducer(mesh=mesh, in_shardings=named(fields.get("IN_SHARDINGS")),
                      out_shardings=named(fields.get("OUT_SHARDINGS")), **common)


def _called(fields: dict, target: str) -> Reproducer:
    """A reproducer of `conformance.check` / oracle mode: the program as the user ran it."""
    if fields.get("DEVICE_PUT") is not None:
        raise ValueError(f"reproducer {target}: {fields.get('NOT_BISECTABLE') or 'a jax.device_put, not a program'}; "
                         f"run it with python {target} to see the misplaced blocks.")
    if fields.get("PARTIAL_INPUTS"):
        raise ValueError(f"reproducer {target}: input(s) {sorted(fields['PARTIAL_INPUTS'])} are unreduced (each "
                         "device holds a partial value, which JAX reads back as no global value); explain and "
                         "bisect compare global values stage by stage and equation by equation. Run it with "
                         f"python {target}, which checks the value the partial values combine to.")
    raw = _get(fields, "inputs", target)
    got = raw() if callable(raw) else raw
    args, kwargs = got if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict) else (got, {})
    program = fields["program"]()
    unreduced = _unreduced_outputs(program, args, kwargs)
    if unreduced:
        raise ValueError(f"reproducer {target}: output(s) {unreduced} are unreduced (each device holds a partial "
                         "value, which JAX reads back as no global value); explain and bisect compare global values "
                         f"stage by stage and equation by equation. Run it with python {target}, which checks the "
                         "value the partial values combine to.")
    return Reproducer(target=target, kind=CALLED, mesh=None, program=program, inputs=tuple(args),
                      kwargs=dict(kwargs), tolerance=", ".join(sorted(set(fields.get("POLICIES", ["exact"])))),
                      no_jaxpr=(fields.get("NOT_BISECTABLE") or "the program is serialized StableHLO")
                      if fields.get("EXPORTED") is not None else "")


def _unreduced_outputs(program, args, kwargs) -> list:
    """The output leaves (by number) that `program(*args, **kwargs)` types unreduced over some mesh
    axes (`jax.eval_shape`: nothing runs); [] when none, or when its types cannot be taken here."""
    import jax

    try:
        outs = jax.tree_util.tree_leaves(jax.eval_shape(program, *args, **kwargs))
    except Exception:  # noqa: BLE001 - a program this cannot type is explained or bisected as before
        return []
    return [k for k, o in enumerate(outs)
            if getattr(getattr(getattr(o, "sharding", None), "spec", None), "unreduced", None)]


def _device_put(fields: dict, target: str, mesh: Mesh, named, common: dict) -> Reproducer:
    """A "device_put" case: inputs()[0] laid out by IN_SHARDINGS[0] on the mesh, resharded to
    OUT_SHARDINGS on the devices OUT_DEVICE_IDS names (a mesh of the same shape and axis names)."""
    src = named(_get(fields, "IN_SHARDINGS", target))
    src = src[0] if isinstance(src, tuple) else src
    out_ids = fields.get("OUT_DEVICE_IDS")
    out_mesh = mesh if out_ids is None else Mesh(mesh.axis_sizes, mesh.axis_names,
                                                 device_ids=np.asarray(out_ids).reshape(mesh.axis_sizes))
    dst = named(_get(fields, "OUT_SHARDINGS", target), out_mesh)
    if isinstance(dst, tuple) or src is None or dst is None:
        raise ValueError(f"reproducer {target}: a device_put case takes one IN_SHARDINGS spec and one "
                         f"OUT_SHARDINGS spec, got {fields.get('IN_SHARDINGS')!r} and {fields.get('OUT_SHARDINGS')!r}.")
    if len(common["inputs"]) != 1:
        raise ValueError(f"reproducer {target}: a device_put case moves one array; inputs() returned "
                         f"{len(common['inputs'])}.")
    return Reproducer(mesh=mesh, in_shardings=(src,), out_shardings=dst, device_ids=out_ids, **common)


def pmap_as_shard_map(fn, inputs, axis_name, in_axes, out_axes, device_ids):
    """`jax.pmap(fn, axis_name, in_axes, out_axes)` as the shard_map JAX builds it (jax >= 0.10):
    a 1-D mesh named `axis_name`, each mapped argument split along its in_axes dim, the
    body squeezing that dim and expanding `out_axes`. Returns (fn, mesh, in_specs, out_specs)."""
    import jax

    name = axis_name if axis_name is not None else _PMAP_DEFAULT_AXIS
    n_args = len(inputs)
    axes = list(in_axes) if isinstance(in_axes, (tuple, list)) else [in_axes] * n_args
    if len(axes) != n_args:
        raise ValueError(f"IN_AXES={in_axes!r} has {len(axes)} entries for {n_args} inputs; give one per input.")
    axes = [None if a is None else a % max(np.ndim(x), 1) for a, x in zip(axes, inputs)]
    sizes = {np.shape(x)[a] for a, x in zip(axes, inputs) if a is not None}
    if len(sizes) != 1:
        raise ValueError(f"pmap reproducer: mapped input sizes {sorted(sizes)}; need exactly one mapped size.")
    (n,) = sizes
    mesh = Mesh((n,), (name,), device_ids=None if device_ids is None else np.asarray(device_ids).reshape(n))

    def spec(a):
        return PartitionSpec() if a is None else PartitionSpec(*([None] * a), name)

    def body(*args):
        local = [x if a is None else jax.lax.squeeze(x, (a,)) for x, a in zip(args, axes)]
        out = fn(*local)
        if isinstance(out, (tuple, list)):
            oa = out_axes if isinstance(out_axes, (tuple, list)) else [out_axes] * len(out)
            return type(out)(y if a is None else jax.lax.expand_dims(y, (a,)) for y, a in zip(out, oa))
        return out if out_axes is None else jax.lax.expand_dims(out, (out_axes,))

    out_specs = (tuple(spec(a) for a in out_axes) if isinstance(out_axes, (tuple, list)) else spec(out_axes))
    body.__name__ = getattr(fn, "__name__", "pmap_body")
    return body, mesh, tuple(spec(a) for a in axes), out_specs
