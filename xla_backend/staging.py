"""The one staging step: wrap a function for JAX as a user would, and put its inputs on devices.

A `Layout` says how a program runs on XLA: its entry point (``"shard_map"``: `jax.shard_map`
under `jax.jit`; ``"jit"``: `jax.jit` with shardings; ``"pmap"``: `jax.pmap`), its mesh, the
specs or shardings, the manual axes and check_vma. `stage(fn, layout, args)` gives the
callable, the inputs placed on the layout's devices and, on demand, the lowering:

    >>> layout = Layout.shard_map(mesh, in_specs=P('x'), out_specs=P())
    >>> staged = stage(f, layout, (np.arange(8.0),))
    >>> with staged.context():
    ...     out = staged.call(*staged.args)
    >>> staged.lower().as_text()                # lowered once, on first use

`xla_backend.shard_map` / `jit` / `pmap`, `conformance.check`, `conformance.debug.explain` and the
debugger all build their programs here, so the program every tool compares is the one
xla_backend runs. Devices correspond by id (refsim device id == JAX ``device.id``): a refsim
`Mesh` becomes a `jax.sharding.Mesh` only through `xla_backend.jax_mesh`, pmap's device ids
become JAX devices only through `xla_backend.jax_devices`.

Specs and shardings are pytree prefixes of the argument tuple, as in `jax.shard_map`
(``in_specs``) and `jax.jit` (``in_shardings``): one leaf applies to every argument below it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from refsim import compat
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from xla_backend import convert, meshes, placement

__all__ = ["ENTRIES", "Layout", "Staged", "Wrapped", "broadcast_prefix", "is_sharding", "is_spec",
           "spec_to_jax", "spec_to_refsim", "stage", "tree_key", "wrap"]

ENTRIES = ("shard_map", "jit", "pmap")


# -- pytrees of specs and shardings --------------------------------------------------------------
def is_spec(x) -> bool:
    """True for a pytree leaf of in_specs/out_specs: None, a refsim or a JAX PartitionSpec."""
    import jax

    return x is None or isinstance(x, (PartitionSpec, jax.sharding.PartitionSpec))


def is_sharding(x) -> bool:
    """True for a pytree leaf of in_shardings/out_shardings: None, a JAX or a refsim sharding."""
    import jax

    return x is None or isinstance(x, jax.sharding.Sharding) or hasattr(x, "devices_indices_map")


def spec_to_jax(spec):
    """A refsim PartitionSpec as JAX's; None and JAX specs unchanged."""
    if spec is None or not isinstance(spec, PartitionSpec):
        return spec
    return spec.to_jax()


def spec_to_refsim(spec) -> PartitionSpec:
    """A JAX PartitionSpec as refsim's; None is the replicated ``PartitionSpec()``."""
    if spec is None:
        return PartitionSpec()
    return spec if isinstance(spec, PartitionSpec) else PartitionSpec.from_jax(spec)


def tree_key(tree, is_leaf):
    """A hashable key for a pytree of specs or shardings."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    return (tuple(leaves), treedef)


def broadcast_prefix(prefix, args: tuple, is_leaf, what: str) -> list:
    """One prefix leaf per leaf of `args`, as JAX matches in_specs/in_shardings to arguments."""
    import jax

    if is_leaf(prefix):
        return [prefix] * len(jax.tree_util.tree_leaves(args))
    if isinstance(prefix, list):
        prefix = tuple(prefix)
    try:
        nested = jax.tree_util.tree_map(
            lambda p, sub: [p] * len(jax.tree_util.tree_leaves(sub)), prefix, args, is_leaf=is_leaf
        )
    except ValueError as e:
        raise ValueError(
            f"{what}={prefix!r} is not a pytree prefix of the {len(args)} positional "
            f"argument(s): {e}. Give one spec per argument (a tuple) or one for all."
        ) from None
    return [p for group in jax.tree_util.tree_leaves(nested, is_leaf=lambda x: isinstance(x, list))
            for p in group]


# -- the layout ----------------------------------------------------------------------------------
_OPTIONS = {
    "shard_map": ("in_specs", "out_specs", "axis_names", "check_vma", "pin_outputs"),
    "jit": ("in_shardings", "out_shardings", "static_argnums", "place_unsharded"),
    "pmap": ("axis_name", "in_axes", "out_axes", "axis_size", "devices", "static_broadcasted_argnums"),
}
_BUILDER = {"shard_map": "Layout.shard_map(mesh, in_specs, out_specs, ...)",
            "jit": "Layout.jit(in_shardings, out_shardings, ...)", "pmap": "Layout.pmap(axis_name, ...)"}


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a program runs on XLA; build one with `Layout.shard_map`, `Layout.jit` or `Layout.pmap`.

    entry: ``"shard_map"``, ``"jit"`` or ``"pmap"``. mesh: a refsim `Mesh` (its device ids
    name JAX devices) or a `jax.sharding.Mesh`; shard_map's mesh, jit's context mesh (None:
    the one mesh all NamedShardings share, if any); never set for pmap. use_mesh: run and
    lower under ``jax.set_mesh(mesh)``, as a JAX user would, so the body may read the context
    mesh. The other fields are the entry point's own arguments (see its builder), left at
    their defaults for the other entry points.
    """

    entry: str
    mesh: Any = None
    use_mesh: bool = True
    # shard_map
    in_specs: Any = None
    out_specs: Any = None
    axis_names: frozenset | None = None
    check_vma: bool = True
    pin_outputs: bool = True
    # jit
    in_shardings: Any = None
    out_shardings: Any = None
    static_argnums: tuple = ()
    place_unsharded: bool = True
    donate_argnums: tuple = ()
    # pmap
    axis_name: Any = None
    in_axes: Any = 0
    out_axes: Any = 0
    axis_size: int | None = None
    devices: tuple | None = None
    static_broadcasted_argnums: tuple = ()

    def __post_init__(self):
        if self.entry not in ENTRIES:
            raise ValueError(f"Layout entry={self.entry!r} is not an entry point; use one of {ENTRIES}, e.g. "
                             "Layout.shard_map(mesh, in_specs, out_specs).")
        for f in dataclasses.fields(self):
            owner = next((e for e, names in _OPTIONS.items() if f.name in names), None)
            if owner not in (None, self.entry) and getattr(self, f.name) != f.default:
                raise ValueError(
                    f"Layout(entry={self.entry!r}) got {f.name}={getattr(self, f.name)!r}, an option of {owner}; "
                    f"build a {owner} layout with {_BUILDER[owner]}, or a {self.entry} one with "
                    f"{_BUILDER[self.entry]}.")
        if self.entry == "pmap" and self.mesh is not None:
            raise ValueError(f"Layout(entry='pmap') got mesh={self.mesh!r}; pmap places by devices=, not by a "
                             "mesh: pass device ids as Layout.pmap(axis_name, devices=[...]).")
        if self.entry == "shard_map" and self.mesh is None:
            raise TypeError("Layout.shard_map needs a mesh: a refsim.Mesh with device ids "
                            "(xla_backend.mesh(shape, names)) or a jax.sharding.Mesh.")
        if self.mesh is not None:
            _check_mesh(self.mesh)

    @classmethod
    def shard_map(cls, mesh, in_specs, out_specs, *, check_vma: bool = True, axis_names=None,
                  pin_outputs: bool = True, use_mesh: bool = True) -> "Layout":
        """`jax.jit(jax.shard_map(fn, mesh=..., in_specs=..., out_specs=..., check_vma=...,
        axis_names=...))`. `axis_names` (None: every mesh axis) are the manual axes.
        `pin_outputs` gives the jit ``out_shardings=NamedSharding(mesh, out_spec)``, so the
        layout over axes outside a partial `axis_names` is the one refsim gives, not whatever
        XLA's partitioner picks."""
        names = None if axis_names is None else frozenset(axis_names)
        return cls("shard_map", mesh, use_mesh, in_specs=in_specs, out_specs=out_specs, axis_names=names,
                   check_vma=bool(check_vma), pin_outputs=bool(pin_outputs))

    @classmethod
    def jit(cls, in_shardings=None, out_shardings=None, *, mesh=None, static_argnums=(),
            place_unsharded: bool = True, donate_argnums=()) -> "Layout":
        """`jax.jit(fn, in_shardings=..., out_shardings=..., static_argnums=...)` with refsim or JAX
        shardings. `mesh`: the context mesh (None: the one mesh every NamedSharding shares).
        `place_unsharded`: an argument without an in_sharding goes to the default device as the
        array JAX would make of it (True), or is passed as given (False: Python scalars stay
        weakly typed, as in the user's own call). `donate_argnums`: as `jax.jit`'s (the placed
        arguments are donated: XLA may alias them to outputs and JAX deletes them)."""
        static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
        return cls("jit", mesh, in_shardings=in_shardings, out_shardings=out_shardings, static_argnums=static,
                   place_unsharded=bool(place_unsharded), donate_argnums=donate)

    @classmethod
    def pmap(cls, axis_name=None, *, in_axes=0, out_axes=0, axis_size=None, devices=None,
             static_broadcasted_argnums=()) -> "Layout":
        """`jax.pmap(fn, axis_name, ...)`; `devices` are JAX devices or their ids (refsim's view)."""
        if devices is not None:
            devices = tuple(_device_id(d) for d in devices)
        sba = static_broadcasted_argnums
        sba = (sba,) if isinstance(sba, int) else tuple(sba)
        return cls("pmap", axis_name=axis_name, in_axes=in_axes, out_axes=out_axes, axis_size=axis_size,
                   devices=devices, static_broadcasted_argnums=sba)

    def entry_kwargs(self) -> dict:
        """The keyword arguments of this layout for `refsim.<entry>` / `xla_backend.<entry>`
        (the twins share one signature): ``getattr(refsim, layout.entry)(fn, **layout.entry_kwargs())``."""
        if self.entry == "shard_map":
            kw = {"mesh": self.mesh, "in_specs": self.in_specs, "out_specs": self.out_specs,
                  "check_vma": self.check_vma}
            if self.axis_names is not None:
                kw["axis_names"] = set(self.axis_names)
            return kw
        if self.entry == "jit":
            kw = {"in_shardings": self.in_shardings, "out_shardings": self.out_shardings}
            if self.static_argnums:
                kw["static_argnums"] = self.static_argnums
            if self.donate_argnums:
                kw["donate_argnums"] = self.donate_argnums
            return kw
        kw = {"axis_name": self.axis_name, "in_axes": self.in_axes, "out_axes": self.out_axes}
        if self.axis_size is not None:
            kw["axis_size"] = self.axis_size
        if self.devices is not None:
            kw["devices"] = list(self.devices)
        if self.static_broadcasted_argnums:
            kw["static_broadcasted_argnums"] = self.static_broadcasted_argnums
        return kw


def _check_mesh(mesh) -> None:
    import jax

    if isinstance(mesh, (Mesh, jax.sharding.Mesh)):
        return
    raise TypeError(
        f"Layout mesh={mesh!r} ({type(mesh).__name__}) has no devices; pass a refsim.Mesh with device ids "
        "(xla_backend.mesh(shape, names)) or a jax.sharding.Mesh.")


def _device_id(d) -> int:
    if hasattr(d, "id"):
        return int(d.id)
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return int(d)
    raise TypeError(f"Layout.pmap devices entry {d!r} ({type(d).__name__}) is not a device; pass JAX devices "
                    "or their integer ids (jax.devices()[k].id).")


# -- wrapping ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Wrapped:
    """`fn` under the layout's entry point, before any argument is seen.

    fn: the function under the entry point, not jitted (``jax.shard_map(fn, ...)``; for jit
    and pmap the same as `call`). call: what runs (``jax.jit(jax.shard_map(...))``,
    ``jax.jit(fn, ...)`` or ``jax.pmap(fn, ...)``). jax_mesh: the JAX mesh the program runs
    on (None for pmap and for jit without one mesh). jax_in / jax_out: the specs (shard_map)
    or shardings (jit) as JAX objects, in the trees given.
    """

    layout: Layout
    fn: Callable
    call: Callable
    jax_mesh: Any = None
    jax_in: Any = None
    jax_out: Any = None
    jax_devices: tuple | None = None

    def context(self):
        """``jax.set_mesh(jax_mesh)`` where the layout runs under its mesh, else a null context."""
        import jax

        if self.jax_mesh is None or not self.layout.use_mesh:
            return contextlib.nullcontext()
        return jax.set_mesh(self.jax_mesh)

    def leaf_shardings(self, args) -> list:
        """The layout's in_specs (shard_map) or in_shardings (jit), one per leaf of the dynamic
        arguments, as given; [] for pmap. Raises ValueError when they are no prefix of `args`."""
        import jax

        lay = self.layout
        if lay.entry == "shard_map":
            return broadcast_prefix(lay.in_specs, tuple(args), is_spec, "in_specs")
        if lay.entry == "jit":
            dyn = _dynamic(tuple(args), lay.static_argnums)
            if lay.in_shardings is None:
                return [None] * len(jax.tree_util.tree_leaves(dyn))
            return broadcast_prefix(lay.in_shardings, dyn, is_sharding, "in_shardings")
        return []

    def place(self, args, leaf_shardings=None) -> "Staged":
        """The arguments on the layout's devices: a `Staged` program ready to run or lower.

        shard_map: each leaf laid out by ``NamedSharding(mesh, its in_spec)``; jit: by its
        in_sharding (None: see `Layout.jit`'s place_unsharded; static arguments stay as given);
        pmap: jax.Arrays as given, anything else as the NumPy array JAX would make of it. A
        jax.Array already in its layout and a refsim.Array keep each device's own data.
        `leaf_shardings`: `leaf_shardings(args)` if already computed.
        """
        import jax

        lay, args = self.layout, tuple(args)
        if lay.entry == "pmap":
            leaves, tree = jax.tree_util.tree_flatten(args)
            leaves = [x if isinstance(x, jax.Array) else placement.canonical_numpy(x) for x in leaves]
            return Staged(self, tuple(jax.tree_util.tree_unflatten(tree, leaves)), list(leaves))
        if lay.entry == "jit" and lay.in_shardings is None and not lay.place_unsharded:
            return Staged(self, args, jax.tree_util.tree_leaves(_dynamic(args, lay.static_argnums)))
        shardings = self.leaf_shardings(args) if leaf_shardings is None else leaf_shardings
        static = set(lay.static_argnums)
        leaves, tree = jax.tree_util.tree_flatten(_dynamic(args, lay.static_argnums))
        _check_ranks(_dynamic(args, lay.static_argnums), shardings, lay.entry)
        if lay.entry == "shard_map":
            placed = [placement.to_device(x, self._named(s)) for x, s in zip(leaves, shardings)]
        else:
            placed = [placement.to_device(x, s) if s is not None or lay.place_unsharded else x
                      for x, s in zip(leaves, shardings)]
        it = iter(jax.tree_util.tree_unflatten(tree, placed))
        full = tuple(args[i] if i in static else next(it) for i in range(len(args)))
        return Staged(self, full, placed)

    def _named(self, spec):
        mesh = self.layout.mesh
        if isinstance(mesh, Mesh):
            return _refsim_named(mesh, spec_to_refsim(spec))
        import jax

        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec() if spec is None else spec_to_jax(spec))

    @property
    def device_ids(self) -> np.ndarray | None:
        """The JAX device id at each mesh position, flat in row-major order (pmap: the devices
        given; None where the layout names no devices)."""
        if self.jax_devices is not None:
            return np.asarray([d.id for d in self.jax_devices], dtype=np.int64)
        mesh = self.layout.mesh
        if isinstance(mesh, Mesh):
            return np.asarray(mesh.device_ids, dtype=np.int64).reshape(-1)
        if self.jax_mesh is not None:
            return np.asarray([d.id for d in self.jax_mesh.devices.flat], dtype=np.int64)
        return None


@functools.lru_cache(maxsize=1024)
def _refsim_named(mesh: Mesh, spec: PartitionSpec) -> NamedSharding:
    # One object per (mesh, spec): every call places its arguments by the same few shardings,
    # and their conversion to JAX is cached by equality (xla_backend.convert.to_jax_sharding).
    return NamedSharding(mesh, spec)


def wrap(fn: Callable, layout: Layout) -> Wrapped:
    """`fn` under `layout`'s entry point, on the JAX devices its mesh or devices name."""
    import jax

    if not isinstance(layout, Layout):
        raise TypeError(f"layout={layout!r} is not an xla_backend.staging.Layout; build one with "
                        "Layout.shard_map(...), Layout.jit(...) or Layout.pmap(...).")
    if layout.entry == "shard_map":
        jmesh = meshes.jax_mesh(layout.mesh)
        j_in = jax.tree_util.tree_map(spec_to_jax, layout.in_specs, is_leaf=is_spec)
        j_out = jax.tree_util.tree_map(spec_to_jax, layout.out_specs, is_leaf=is_spec)
        kw = {} if layout.axis_names is None else {"axis_names": layout.axis_names}
        smapped = jax.shard_map(fn, mesh=jmesh, in_specs=j_in, out_specs=j_out, check_vma=layout.check_vma, **kw)
        if layout.pin_outputs:
            pinned = jax.tree_util.tree_map(lambda s: None if s is None else jax.sharding.NamedSharding(jmesh, s),
                                            j_out, is_leaf=is_spec)
            call = jax.jit(smapped, out_shardings=pinned)
        else:
            call = jax.jit(smapped)
        return Wrapped(layout, smapped, call, jmesh, j_in, j_out)
    if layout.entry == "jit":
        def to_j(t):
            return jax.tree_util.tree_map(convert.to_jax_sharding, t, is_leaf=is_sharding)

        j_in, j_out = to_j(layout.in_shardings), to_j(layout.out_shardings)
        kw = {}
        if layout.in_shardings is not None:
            kw["in_shardings"] = j_in
        if layout.out_shardings is not None:
            kw["out_shardings"] = j_out
        if layout.donate_argnums:
            kw["donate_argnums"] = layout.donate_argnums
        jitted = jax.jit(fn, static_argnums=layout.static_argnums, **kw)
        if layout.mesh is not None:
            jmesh = meshes.jax_mesh(layout.mesh)
        else:
            found = {s.mesh for s in jax.tree_util.tree_leaves((j_in, j_out), is_leaf=is_sharding)
                     if isinstance(s, jax.sharding.NamedSharding)}
            jmesh = found.pop() if len(found) == 1 else None
        return Wrapped(layout, jitted, jitted, jmesh, j_in, j_out)
    jdevs = None if layout.devices is None else tuple(meshes.jax_devices(list(layout.devices)).tolist())
    pmapped = jax.pmap(fn, layout.axis_name, in_axes=layout.in_axes, out_axes=layout.out_axes,
                       axis_size=layout.axis_size, devices=None if jdevs is None else list(jdevs),
                       static_broadcasted_argnums=layout.static_broadcasted_argnums)
    return Wrapped(layout, pmapped, pmapped, jax_devices=jdevs)


def _dynamic(args: tuple, static_argnums) -> tuple:
    static = set(static_argnums)
    return tuple(a for i, a in enumerate(args) if i not in static)


def _check_ranks(dynamic: tuple, shardings: list, entry: str) -> None:
    """ValueError, as JAX raises it, for an argument whose rank is below its spec's length (a
    Python list is a pytree: each element is an argument of its own, a scalar under ``P('i')``);
    laid out anyway it failed inside JAX with a bare IndexError or AssertionError."""
    import jax

    what = "in_specs" if entry == "shard_map" else "in_shardings"
    paths = jax.tree_util.tree_flatten_with_path(dynamic)[0]
    for (path, x), s in zip(paths, shardings):
        spec = s if entry == "shard_map" else getattr(s, "spec", None)
        if spec is None or not hasattr(spec, "__len__"):
            continue
        ndim = np.ndim(x)
        if len(spec) > ndim:
            where = "args" + jax.tree_util.keystr(path)
            in_seq = any(isinstance(k, jax.tree_util.SequenceKey) for k in path[1:])
            hint = (" A Python list or tuple is a pytree, so each of its elements is an argument of its own, as "
                    "in JAX: pass np.asarray(...) to give it as one array." if in_seq else "")
            entry_text = ("entry " if entry == "shard_map" else "entry of spec ") + repr(spec_to_jax(spec))
            raise ValueError(
                f"{what} {entry_text} has length {len(spec)}, but {where} has shape "
                f"{np.shape(x)}, of rank {ndim} ({ndim} < {len(spec)}): a spec names at most one mesh axis group "
                f"per dimension of its argument.{hint}")


# -- staged --------------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class Staged:
    """A wrapped program with its arguments placed.

    args: the arguments to call `call` with (placed; static ones as given). flat_args: the
    placed leaves of the dynamic arguments, in order. `lower()` lowers once per platform
    list and keeps the result; `dynamic_args` is what a compiled executable takes.
    """

    wrapped: Wrapped
    args: tuple
    flat_args: list
    _lowered: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def layout(self) -> Layout:
        return self.wrapped.layout

    @property
    def call(self) -> Callable:
        return self.wrapped.call

    @property
    def fn(self) -> Callable:
        return self.wrapped.fn

    @property
    def jax_mesh(self):
        return self.wrapped.jax_mesh

    def context(self):
        return self.wrapped.context()

    @property
    def dynamic_args(self) -> tuple:
        """`args` without jit's static ones: what a `Compiled` executable takes."""
        return _dynamic(self.args, self.layout.static_argnums)

    @property
    def device_ids(self) -> np.ndarray:
        """The JAX device id of each partition (mesh position, row-major) or pmap replica."""
        ids = self.wrapped.device_ids
        if ids is None and self.layout.entry == "pmap":
            import jax

            n = max(np.shape(a)[0] for a in self.flat_args)
            ids = np.asarray([d.id for d in jax.devices()[:n]], dtype=np.int64)
        return ids

    def lower(self, lowering_platforms=None):
        """`call` lowered for these arguments (under the layout's mesh), once per platform list.

        `lowering_platforms` (e.g. ("cuda",)) lowers for other platforms than this one."""
        platforms = tuple(lowering_platforms) if lowering_platforms else None
        if platforms not in self._lowered:
            with self.context():
                if platforms:
                    low = self.call.trace(*self.args).lower(lowering_platforms=platforms)
                else:
                    low = self.call.lower(*self.args)
            self._lowered[platforms] = low
        return self._lowered[platforms]

    def fresh_compile(self):
        """This lowering compiled anew, past JAX's in-memory executables (the lowering's own and JAX's
        cache keyed by the module): what XLA builds from the module now
        (`xla_backend.cache.set_hit_check` compares it with a cached executable)."""
        compat.clear_compiled_executables()
        with self.context():
            # compiler_options (none) keeps the lowering from handing back the executable it holds
            return self.lower().compile(compiler_options={})


def stage(fn: Callable, layout: Layout, args) -> Staged:
    """`fn` wrapped by `layout`'s entry point with `args` placed on its devices (see `wrap`,
    `Wrapped.place`); `.lower()` gives the lowering when asked."""
    return wrap(fn, layout).place(args)
