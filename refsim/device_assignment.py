"""One computation, one device assignment: JAX's "Received incompatible devices" check.

A jitted computation runs on one ordered tuple of devices (JAX's `_device_assignment`,
a mesh's devices in row-major order). Every committed argument, every explicit input /
output sharding, the context mesh (`jax.set_mesh`) and every concrete mesh used inside
the program (`shard_map`, `with_sharding_constraint`) must name that same tuple; the same
devices in another order are a different assignment. JAX raises `ValueError` ("Received
incompatible devices for jitted computation. Got argument x of f with shape float32[8]
and with device ids [0, 1, 2, 3] ... and ..."), built in `jax/_src/stages.py` from its
internal `DeviceAssignmentMismatchError`; refsim raises `DeviceAssignmentError`, a
`ValueError` with the same wording (without JAX's platform suffix) plus the fix.
Plain NumPy arguments are uncommitted and take part in no check, as in JAX.
"""
from __future__ import annotations

import dataclasses
import inspect
import weakref
from typing import Iterable, Sequence

import numpy as np


class DeviceAssignmentError(ValueError):
    """Arguments, shardings or meshes of one computation name different device tuples.

    `uses` holds the two disagreeing `Use`s (first the one that fixed the assignment).
    """

    def __init__(self, message: str, uses: tuple):
        super().__init__(message)
        self.uses = uses


@dataclasses.dataclass(frozen=True)
class Use:
    """One place a computation names devices.

    kind: "argument" (a committed argument's own sharding), "in_sharding" (an explicit
    input sharding), "out_sharding", "context" (the context mesh), or "inside" (a mesh or
    sharding used by equation `eqn` inside the program). `name`/`shape`/`dtype` describe
    an argument.
    """

    kind: str
    devices: tuple
    name: str | None = None
    shape: tuple | None = None
    dtype: object = None
    eqn: str | None = None

    def describe(self, fun_name: str, api_name: str) -> str:
        ids = f"with device ids {list(self.devices)}"
        if self.kind == "argument":
            return f"argument {self.name} of {fun_name} with shape {_type_str(self.shape, self.dtype)} and {ids}"
        if self.kind == "in_sharding":
            return f"explicit input sharding of argument {self.name} {ids}"
        if self.kind == "out_sharding":
            return f"explicit output sharding {ids}"
        if self.kind == "context":
            return f"{api_name}'s context mesh {ids}"
        return f"{self.eqn} inside {api_name} {ids}"


def _type_str(shape, dtype) -> str:
    return f"{np.dtype(dtype).name}[{','.join(str(d) for d in shape)}]"


def assignment(sharding_or_mesh) -> tuple[int, ...] | None:
    """The ordered device ids a refsim sharding or mesh (or a JAX one) runs on; None if abstract.

    NamedSharding / Mesh: the mesh's device ids in row-major order (JAX ignores
    `_logical_device_ids` here too); SingleDeviceSharding: its one device; any other
    sharding: the keys of its `devices_indices_map`, in order.
    """
    x = sharding_or_mesh
    if type(x).__name__ == "AbstractMesh":
        return None  # names no devices
    if hasattr(x, "axis_names"):  # a mesh
        if type(x).__module__.startswith("jax"):
            return tuple(int(d.id) for d in np.asarray(x.devices).flat)
        cached = getattr(x, "_assignment", None)  # a refsim Mesh is immutable: compute once
        if cached is None:
            cached = tuple(np.asarray(x.device_ids).ravel().tolist())
            try:
                x._assignment = cached
            except AttributeError:
                pass
        return cached
    mesh = getattr(x, "mesh", None)
    if mesh is not None:
        return assignment(mesh)
    if hasattr(x, "device_id"):  # refsim SingleDeviceSharding
        return (int(x.device_id),)
    if hasattr(x, "_device_assignment"):  # a JAX sharding
        return tuple(int(d.id) for d in x._device_assignment)
    devs = getattr(x, "devices", None)  # refsim PmapSharding
    if isinstance(devs, np.ndarray):
        return tuple(int(i) for i in devs.ravel())
    raise TypeError(f"{x!r} ({type(x).__name__}) is not a sharding or mesh; cannot tell its devices.")


_NAMES: dict = {}  # (f, treedef of args) -> names; bounded (see arg_names)
_NAMES_MAX = 1024


def arg_names(f, args: tuple, treedef=None) -> list[str]:
    """A name per flattened leaf of `args`, as JAX's debug info writes them (`x`, `x[0]`, `args[2]`).

    The names depend only on `f`'s signature and the pytree structure of `args`: they are
    remembered per (f, structure) (`treedef`: `jax.tree_util.tree_structure(args)`, if the
    caller has it), so a call repeated with new data inspects no signature."""
    import jax

    if treedef is None:
        treedef = jax.tree_util.tree_structure(args)
    key = (f, treedef)
    try:
        names = _NAMES.get(key)
    except TypeError:  # an unhashable callable: derive the names for this call
        return _arg_names(f, args)
    if names is None:
        names = _arg_names(f, args)
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        _NAMES[key] = tuple(names)
    return list(names)


def _arg_names(f, args: tuple) -> list[str]:
    import jax

    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i, a in enumerate(args):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD):
            base = params[i].name
        else:
            var = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), "args")
            first_var = next((k for k, p in enumerate(params) if p.kind is p.VAR_POSITIONAL), 0)
            base = f"{var}[{i - first_var}]"
        paths = jax.tree_util.tree_flatten_with_path(a)[0]
        names.extend(base + jax.tree_util.keystr(path) for path, _ in paths)
    return names


def fun_name(f) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


def check(uses: Iterable[Use], *, fun: str, api_name: str = "jit") -> tuple[int, ...] | None:
    """Raise DeviceAssignmentError unless every use names the same ordered devices.

    As JAX's `_get_and_check_device_assignment`: with a context mesh every use is compared
    with it, otherwise with the first use. Returns the common assignment (None when no
    use names devices).
    """
    uses = [u for u in uses if u.devices is not None]
    ctx = next((u for u in uses if u.kind == "context"), None)
    first = ctx
    for u in uses:
        if u is ctx:
            continue
        if first is None:
            first = u
            continue
        if tuple(u.devices) != tuple(first.devices):
            raise DeviceAssignmentError(_message(first, u, fun, api_name), (first, u))
    return None if first is None else tuple(first.devices)


def _message(a: Use, b: Use, fun: str, api_name: str) -> str:
    same = set(a.devices) == set(b.devices)
    why = ("the same devices in another order, which is a different device assignment"
           if same else "different devices")
    fix = (f"put argument {b.name} on the devices and order of the rest with "
           f"refsim.device_put({b.name}, sharding), or pass in_shardings"
           if b.kind == "argument" else
           "build every sharding and the mesh from one Mesh (same device ids, same order)")
    return (f"Received incompatible devices for {api_name}ted computation. Got {a.describe(fun, api_name)} "
            f"and {b.describe(fun, api_name)}. They name {why}; {fix}.")


def argument_uses(flat_args: Sequence, names: Sequence[str], in_shardings: Sequence | None = None) -> list[Use]:
    """Uses for flattened arguments: an explicit in_sharding wins over the argument's own
    sharding (JAX moves a committed argument to it); NumPy values are uncommitted."""
    out = []
    in_shardings = list(in_shardings) if in_shardings is not None else [None] * len(flat_args)
    for x, name, s in zip(flat_args, names, in_shardings):
        if s is not None:
            out.append(Use("in_sharding", assignment(s), name=name))
            continue
        sh = _committed_sharding(x)
        if sh is not None:
            out.append(Use("argument", assignment(sh), name=name, shape=tuple(np.shape(x)),
                           dtype=getattr(x, "dtype", None)))
    return out


def _committed_sharding(x):
    if type(x).__name__ == "Array" and type(x).__module__.startswith("refsim"):
        return x.sharding
    return None


_INSIDE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def inside_uses(closed_jaxpr) -> list[Use]:
    """Concrete meshes named inside the program (`shard_map`, `sharding_constraint`, ...),
    in nested jaxprs too, in equation order. A traced program is immutable: the walk is done
    once per Jaxpr object (kept while it lives)."""
    jaxpr = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    try:
        found = _INSIDE.get(jaxpr)
    except TypeError:  # not weakly referenceable: walk it for this call
        found = None
    if found is None:
        out: list[Use] = []
        _walk(jaxpr, out, set())
        found = tuple(out)
        try:
            _INSIDE[jaxpr] = found
        except TypeError:
            pass
    return list(found)


def _walk(jaxpr, out: list, seen: set) -> None:
    if id(jaxpr) in seen:
        return
    seen.add(id(jaxpr))
    for eqn in jaxpr.eqns:
        for key, v in eqn.params.items():
            if key in ("mesh", "sharding"):
                mesh = v if key == "mesh" else getattr(v, "mesh", None)
                if type(mesh).__name__ == "Mesh" and type(mesh).__module__.startswith("jax"):
                    out.append(Use("inside", assignment(mesh), eqn=eqn.primitive.name))
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _walk(inner, out, seen)


def context_uses() -> list[Use]:
    """The concrete context mesh set by `jax.set_mesh`, if any, as a Use."""
    import jax

    mesh = jax.sharding.get_mesh()
    if getattr(mesh, "empty", True):
        return []
    return [Use("context", assignment(mesh))]


def check_call(f, args: tuple, flat_args: Sequence, *, in_shardings: Sequence | None = None,
               uses: Sequence[Use] = (), api_name: str = "jit", treedef=None) -> tuple[int, ...] | None:
    """Check one call of `f`: its committed arguments (or their explicit in_shardings), the
    context mesh and any further `uses`; raises DeviceAssignmentError naming both sides.
    `treedef`: the pytree structure of `args`, when the caller has flattened them already."""
    names = arg_names(f, args, treedef)
    if len(names) != len(flat_args):  # an unusual signature: fall back to positions
        names = [f"args[{i}]" for i in range(len(flat_args))]
    all_uses = context_uses() + argument_uses(flat_args, names, in_shardings) + list(uses)
    return check(all_uses, fun=fun_name(f), api_name=api_name)
