"""The conformance case types: `Program` (any runnable case) and `CollectiveCall`.

A case is data, not a closure: its function is Python source (`source`, defining
``f`` with only ``jax``, ``jnp``, ``np`` and ``P`` = `jax.sharding.PartitionSpec`),
so the function that runs on refsim, the one that runs on XLA and the one in the
standalone reproducer are the same text. `run(api)` calls an engine module with
the entry points the two share (`refsim` or `xla_backend`, docs/interpreter.md): ``shard_map``,
``pmap``, ``jit``, ``device_put``.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np

import refsim
from conformance.cases import repro
from conformance.verdict import compare
from conformance.verdict.reductions import sum_bound_for
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import set_text

ENTRIES = ("shard_map", "pmap", "jit", "device_put")
DEVICE_ORDERS = ("default", "reversed", "transposed", "random")


# -- mesh naming ------------------------------------------------------------------
def device_order(mesh: Mesh) -> str:
    """The named order a mesh's device ids follow: default / reversed / transposed / random.

    "default" is row-major 0..n-1; "reversed" n-1..0; "transposed" the default grid of
    the reversed shape transposed (first axis fastest). A 1-D transposed mesh reads as
    default; anything else (including a subset of ids) is "random".
    """
    ids = np.asarray(mesh.device_ids)
    shape, n = ids.shape, ids.size
    if np.array_equal(ids, np.arange(n).reshape(shape)):
        return "default"
    if np.array_equal(ids, np.arange(n)[::-1].reshape(shape)):
        return "reversed"
    if np.array_equal(ids, np.arange(n).reshape(shape[::-1]).T):
        return "transposed"
    return "random"


def mesh_id(mesh: Mesh) -> str:
    """A stable short name: ``2x4:reversed``; a random order lists its ids (``2:random(1,0)``)."""
    shape = "x".join(str(s) for s in mesh.axis_sizes)
    order = device_order(mesh)
    if order == "random":
        order += "(" + ",".join(str(int(i)) for i in np.asarray(mesh.device_ids).ravel()) + ")"
    return f"{shape}:{order}"


_NAMESPACE_CACHE: dict = {}


def compile_source(source: str) -> Callable:
    """Execute `source` with jax, jnp, np and P in scope and return its ``f``."""
    if source not in _NAMESPACE_CACHE:
        # JAX loads on a case's first run, not on import: the CLI imports cases before it configures the platform
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec as JP

        ns: dict = {"jax": jax, "jnp": jnp, "np": np, "P": JP}
        exec(compile(source, "<conformance case>", "exec"), ns)
        if "f" not in ns:
            raise ValueError(f"case source must define a function named f; got:\n{source}")
        _NAMESPACE_CACHE[source] = ns["f"]
    return _NAMESPACE_CACHE[source]


# A run takes a structure's data sets one after another, so a few dozen wrappers serve it. Each
# keeps its jit objects, and JAX keeps their traces and lowered modules for as long as they live:
# holding a whole run's (~1,500, refsim + XLA) took a process from 1.0 to 1.5 GB.
ENTRY_CALLABLES_MAX = 64
_ENTRY_CALLABLES: "OrderedDict[tuple, Callable]" = OrderedDict()


def _frozen(x):
    """A hashable key of a case field that tells apart values that only compare equal across
    types (a tuple and the PartitionSpec equal to it, a list and a tuple): each value with its
    type, containers element by element. TypeError for an unhashable leaf."""
    t = type(x)
    if t is list or t is tuple:
        return (t, tuple(_frozen(e) for e in x))
    if t is dict:
        return (t, tuple((k, _frozen(v)) for k, v in x.items()))
    hash(x)
    return (t, x)


# -- the case types ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """One runnable case: function source, entry point, mesh, layouts and global inputs.

    entry "shard_map": ``api.shard_map(f, mesh=, in_specs=, out_specs=[, axis_names=])``;
    "pmap": ``api.pmap(f, axis_name=[, devices=])`` over the 1-D mesh's ids (stacked args);
    "jit": ``api.jit(f, in_shardings=, out_shardings=)``; "device_put": args[0] placed by
    ``in_shardings[0]`` then resharded to ``out_shardings`` (another mesh or device order).
    `labels` are the (key, value) pairs that make up the stable `case_id`; `outputs` says per
    output how it is compared ("exact", "exact_unsigned_zero" for min/max, "sum", "mean").
    """

    family: str
    source: str
    entry: str
    mesh: Mesh
    args: tuple
    in_specs: tuple = ()
    out_specs: Any = None
    axis_names: tuple | None = None
    in_shardings: Any = None
    out_shardings: Any = None
    labels: tuple = ()
    outputs: tuple = ("exact",)

    def __post_init__(self):
        if self.entry not in ENTRIES:
            raise ValueError(f"entry={self.entry!r} must be one of {ENTRIES}.")
        if self.entry == "pmap" and self.mesh.ndim != 1:
            raise ValueError(f"entry='pmap' needs a 1-D mesh, got {self.mesh!r}.")

    # -- identity --------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return str(np.asarray(self.args[0]).dtype) if self.args else "none"

    @property
    def case_id(self) -> str:
        """``family[k=v,...,dtype=...,mesh=2x4:reversed]``: stable across runs and data draws."""
        parts = [f"{k}={v}" for k, v in self.labels]
        if self.entry == "pmap" and not any(k == "entry" for k, _ in self.labels):
            parts.append("entry=pmap")
        parts += [f"dtype={self.dtype}", f"mesh={mesh_id(self.mesh)}"]
        return f"{self.family}[{','.join(parts)}]"

    def __repr__(self):
        return f"<{type(self).__name__} {self.case_id}>"

    def describe(self) -> str:
        """Multi-line text: id, mesh (names, shape, device ids), specs/shardings, input shapes."""
        m = self.mesh
        lines = [
            f"case:         {self.case_id}",
            f"entry:        {self.entry}",
            f"mesh:         {dict(m.shape)} device order {device_order(m)}, ids {np.asarray(m.device_ids).tolist()}",
        ]
        if self.entry == "shard_map":
            lines.append(f"in_specs:     {self.in_specs!r}")
            lines.append(f"out_specs:    {self.out_specs!r}")
            if self.axis_names is not None:
                lines.append(f"axis_names:   {set_text(self.axis_names)}")
        if self.in_shardings is not None:
            lines.append(f"in_shardings: {self.in_shardings!r}")
        if self.out_shardings is not None:
            lines.append(f"out_shardings:{self.out_shardings!r}")
        for i, a in enumerate(self.args):
            a = np.asarray(a)
            lines.append(f"arg {i}:        {a.dtype}{list(a.shape)}")
        lines.append("function:")
        lines += ["    " + ln for ln in self.source.strip().splitlines()]
        return "\n".join(lines)

    def __getstate__(self):
        # `fn` (compiled from `source`) is rebuilt on first use; a function made by exec() has no
        # importable name, so a case that already ran could not be sent to a worker process.
        state = dict(self.__dict__)
        state.pop("fn", None)
        state.pop("_structure_key", None)
        return state

    # -- running --------------------------------------------------------------------------
    @functools.cached_property
    def fn(self) -> Callable:
        """The case's function, compiled from `source` (one object per distinct source)."""
        return compile_source(self.source)

    def run(self, api) -> Any:
        """Run on an engine module (`refsim` or `xla_backend`); returns its Array(s)."""
        if self.entry == "device_put":
            placed = api.device_put(self.args[0], self.in_shardings[0])
            return api.device_put(placed, self.out_shardings)
        return self.entry_callable(api)(*self.args)

    def entry_callable(self, api) -> Callable:
        """``api.<entry>(fn, ...)`` for this case's structure (not for "device_put"), built once
        per structure: cases that differ only in `args` share it (a bounded cache, keyed by the
        entry function itself and every field the wrapper is built from), as a JAX user keeps
        one jitted function for many inputs."""
        entry = getattr(api, self.entry)
        try:
            key = (entry, self._structure_key)
            g = _ENTRY_CALLABLES.get(key)
        except TypeError:   # an unhashable field: built for this call only
            return self._build_entry(entry)
        if g is None:
            g = _ENTRY_CALLABLES[key] = self._build_entry(entry)
            if len(_ENTRY_CALLABLES) > ENTRY_CALLABLES_MAX:
                _ENTRY_CALLABLES.popitem(last=False)
        else:
            _ENTRY_CALLABLES.move_to_end(key)
        return g

    @functools.cached_property
    def _structure_key(self) -> tuple:
        # every field the entry's wrapper is built from (the case is frozen: computed once)
        return (self.entry, self.source, _frozen(self.mesh), _frozen(self.in_specs), _frozen(self.out_specs),
                _frozen(self.axis_names), _frozen(self.in_shardings), _frozen(self.out_shardings))

    def _build_entry(self, entry) -> Callable:
        if self.entry == "shard_map":
            kw = {} if self.axis_names is None else {"axis_names": set(self.axis_names)}
            return entry(self.fn, mesh=self.mesh, in_specs=self.in_specs, out_specs=self.out_specs, **kw)
        if self.entry == "pmap":
            kw = {}
            if device_order(self.mesh) != "default":
                kw["devices"] = [int(i) for i in np.asarray(self.mesh.device_ids).ravel()]
            return entry(self.fn, axis_name=self.mesh.axis_names[0], **kw)
        return entry(self.fn, in_shardings=self.in_shardings, out_shardings=self.out_shardings)

    def tolerances(self) -> list:
        """One comparison policy per output (see `conformance.verdict.compare`); exact by default."""
        out = []
        for kind in self.outputs:
            if kind in ("exact", "sum", "mean"):
                # Programs use exact-friendly data, where every reduction order gives the same bits.
                out.append(compare.EXACT)
            elif kind == "exact_unsigned_zero":
                out.append(compare.Exact(signed_zero=False))
            else:
                raise ValueError(f"unknown output kind {kind!r} in {self.case_id}")
        return out

    # -- reproducer -------------------------------------------------------------------------
    def repro(self, expected=None, tolerances=None) -> str:
        """A standalone reproducer file, format v1 (`conformance.cases.repro`): JAX and NumPy only.

        It rebuilds the mesh by device id, runs the case under JAX's own entry point and
        checks every device's shard against `expected` (refsim's result, embedded; computed
        here when None) exactly or inside the embedded sum bound, exiting 1 on a mismatch.
        """
        if expected is None:
            expected = self.run(refsim)
        return repro.source(self, expected, tolerances)


@dataclasses.dataclass(frozen=True, eq=False)
class CollectiveCall(Program):
    """A `Program` that is one collective (`name`) with its JAX parameters (`params`).

    `params` are the keyword values passed to ``jax.lax.<name>`` (``axis_name``,
    ``axis_index_groups``, ``perm``, ``tiled``, ``axis``, ``scatter_dimension``,
    ``split_axis``, ``concat_axis``, ``source``); `tolerances()` derives the rigorous sum
    bound of psum / pmean / psum_scatter from the inputs with an independent NumPy model
    of who participates.
    """

    name: str = ""
    params: Mapping = dataclasses.field(default_factory=dict)

    def tolerances(self) -> list:
        kind = self.outputs[0]
        if kind in ("sum", "mean"):
            return [sum_bound_for(self)]
        if kind == "exact_unsigned_zero":
            return [compare.Exact(signed_zero=False)]
        return [compare.EXACT]
