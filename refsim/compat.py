"""Every difference between supported JAX versions (0.9 … 0.12+) lives here.

Other modules import JAX internals only through this module, so a JAX upgrade
touches one file. It is a leaf: it imports nothing from this project (tests/test_layering.py
holds that line), so any module of refsim, xla_backend, conformance or bench may use it.
"""
from __future__ import annotations

import contextlib
import functools
import re

import numpy as _np


@functools.lru_cache(maxsize=None)
def jax_version() -> tuple[int, ...]:
    import jax

    return tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())


def unreduced_read_error(message: str) -> Exception:
    """The error JAX raises when an unreduced array is read on the host (np.asarray,
    jax.device_get): jax 0.10 raises NotImplementedError ("device_indices_map doesn't work
    with unreduced"), jax 0.12 a JaxRuntimeError (INVALID_ARGUMENT from PjRt)."""
    if jax_version() >= (0, 12):
        import jax

        return jax.errors.JaxRuntimeError(message)
    return NotImplementedError(message)


def supports_unreduced_specs() -> bool:
    """True when the installed JAX's PartitionSpec takes `unreduced=` / `reduced=` axes
    (sharding-in-types' partial sums: jax 0.10.2 and 0.12 have both; jax 0.12 adds
    `unreduced_kind`)."""
    from jax.sharding import PartitionSpec

    try:
        PartitionSpec(unreduced={"x"}, reduced={"y"})
    except TypeError:
        return False
    return True


def xla_divides_by_broadcast_reciprocal() -> bool:
    """True when XLA:CPU computes `a / broadcast(b)` as `a * broadcast(1 / b)` (its algebraic
    simplifier; quotients 1 ulp from the correctly rounded one): jaxlib 0.10 on. jaxlib 0.9.2 keeps
    the divide (a `broadcast_divide_fusion`): every quotient correctly rounded, measured 2026-12-06 on
    a softmax's normalisation (0 of 400 differ; 119 on 0.11.2). refsim's bound walk allows both
    (`xla-reciprocal-division`); tests that need XLA's rewrite as a witness ask this."""
    return jax_version() >= (0, 10)


def reduced_takes_constants() -> bool:
    """True when a `reduced` value takes arithmetic with a constant (``w * 2.0 + 1.0``): jax 0.10
    on. jax 0.9.2's sharding-in-types rule counts the constant as replicated over the reduced axes
    and raises ShardingTypeError ("Inputs cannot be replicated on the same axes that another input
    is reduced on"), measured; a reduced weight in a `dot_general` works on 0.9.2 too."""
    return jax_version() >= (0, 10)


def unreduced_subtracts() -> bool:
    """True when JAX has an unreduced rule for `sub` (``u1 - u2`` of two values unreduced over the
    same axes): jax 0.12; 0.9 … 0.11 raise NotImplementedError ("unreduced rule for sub is not
    implemented"), measured. `add` has one from 0.9 on."""
    return jax_version() >= (0, 12)


def unreduced_kind_of(spec) -> str:
    """How a JAX spec's unreduced partial values combine: "sum" (jax 0.10.2 has only sums; in
    jax 0.12 `P(unreduced=..., unreduced_kind=UnreducedKind.max)` says max or min)."""
    kind = getattr(spec, "unreduced_kind", None)
    return "sum" if kind is None else getattr(kind, "name", str(kind))


def xla_runtime_error(message: str) -> Exception:
    """The error JAX raises when XLA refuses a program at compile or run time (UNIMPLEMENTED,
    INVALID_ARGUMENT): `jax.errors.JaxRuntimeError` (a RuntimeError), jax 0.10 … 0.12."""
    import jax

    return jax.errors.JaxRuntimeError(message)


def reshape_view(a, shape):
    """`a` reshaped to `shape` as a view of the same memory, or None where NumPy would have to
    copy (NumPy >= 2.1: `reshape(copy=False)`; older NumPy: assigning `.shape`, which 2.5
    deprecates)."""
    import numpy as np

    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:
        return None
    except TypeError:  # NumPy < 2.1 has no copy= keyword
        v = a.view()
        try:
            v.shape = shape
        except AttributeError:
            return None
        return v


def no_trace_active() -> bool:
    """True when no JAX trace (jit, grad, vmap, make_jaxpr, ...) is active in this thread: a call
    made now is a top-level call (`jax._src.core.trace_state_clean`, jax 0.10 … 0.12)."""
    from jax._src import core

    return core.trace_state_clean()


def _jax_axis_type(t):
    from jax.sharding import AxisType as JaxAxisType

    return getattr(JaxAxisType, t.name if hasattr(t, "name") else str(t))


def make_abstract_mesh(axis_sizes, axis_names, axis_types=None):
    """A `jax.sharding.AbstractMesh` for the given sizes, names and refsim/JAX axis types
    (an immutable value: equal arguments give one object, from a bounded cache)."""
    try:
        return _cached_abstract_mesh(tuple(axis_sizes), tuple(axis_names),
                                     None if axis_types is None else tuple(axis_types))
    except TypeError:  # an unhashable part: build it (and raise what JAX raises)
        return _make_abstract_mesh(axis_sizes, axis_names, axis_types)


@functools.lru_cache(maxsize=256)
def _cached_abstract_mesh(axis_sizes, axis_names, axis_types):
    return _make_abstract_mesh(axis_sizes, axis_names, axis_types)


def _make_abstract_mesh(axis_sizes, axis_names, axis_types=None):
    from jax.sharding import AbstractMesh

    kw = {}
    if axis_types is not None:
        kw["axis_types"] = tuple(_jax_axis_type(t) for t in axis_types)
    return AbstractMesh(tuple(axis_sizes), tuple(axis_names), **kw)


def context_abstract_mesh(axis_sizes, axis_names, axis_types=None):
    """The abstract mesh `jax.set_mesh` puts in context for a mesh over the default platform.

    It carries the default device's `AbstractDevice` (kind, platform), as `Mesh.abstract_mesh`
    does in jax 0.10 … 0.12, so a `shard_map` / `pmap` the program builds over concrete devices
    passes shard_map's "context mesh should match the mesh passed" check.
    """
    import jax

    device = jax.devices()[0]
    try:  # an immutable value: one object per (sizes, names, types, default device), bounded
        return _cached_context_abstract_mesh(tuple(axis_sizes), tuple(axis_names),
                                             None if axis_types is None else tuple(axis_types), device)
    except TypeError:  # an unhashable part: build it (and raise what JAX raises)
        return _context_abstract_mesh(axis_sizes, axis_names, axis_types, device)


@functools.lru_cache(maxsize=256)
def _cached_context_abstract_mesh(axis_sizes, axis_names, axis_types, device):
    return _context_abstract_mesh(axis_sizes, axis_names, axis_types, device)


def _context_abstract_mesh(axis_sizes, axis_names, axis_types, device):
    import jax
    import numpy as np

    probe = jax.sharding.Mesh(np.array([device]), ("_",)).abstract_mesh
    types = make_abstract_mesh(axis_sizes, axis_names, axis_types).axis_types
    return jax.sharding.AbstractMesh(tuple(axis_sizes), tuple(axis_names), axis_types=types,
                                     abstract_device=probe.abstract_device)


def backends_initialised() -> bool:
    """True once JAX has started its backends in this process (after that, XLA_FLAGS and
    JAX_PLATFORMS are read and fixed): `jax._src.xla_bridge._backends` is non-empty (jax 0.10 …
    0.12). Never imports JAX: a process that has not imported it has no backends."""
    import sys

    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:  # noqa: BLE001 - a JAX whose layout moved: report "not started"
        return False


def distributed_client():
    """This process's client of the `jax.distributed` key-value store (None before
    `jax.distributed.initialize`): `jax._src.distributed.global_state.client` (jax 0.10 … 0.12)."""
    from jax._src import distributed

    return distributed.global_state.client


def make_jax_mesh(devices, axis_names, axis_types=None):
    """A `jax.sharding.Mesh` over an ndarray of JAX devices."""
    from jax.sharding import Mesh

    kw = {}
    if axis_types is not None:
        kw["axis_types"] = tuple(_jax_axis_type(t) for t in axis_types)
    return Mesh(devices, tuple(axis_names), **kw)


# --- interpreter: jaxpr params whose names differ between JAX versions -----------------

def drop_var_type() -> type:
    """The class of a jaxpr's dropped output (`_`): `jax.extend.core.DropVar` (jax 0.10 … 0.12);
    jax 0.9 does not export it there, only as `jax._src.core.DropVar`."""
    try:
        from jax.extend.core import DropVar
    except ImportError:  # jax 0.9
        from jax._src.core import DropVar
    return DropVar


def binds_nonnegative_collective_dims() -> bool:
    """True when JAX counts a negative `scatter_dimension` / `split_axis` / `concat_axis` from the
    end when it binds psum_scatter / all_to_all (jax >= 0.11); jax 0.9 and 0.10 bind it as given and
    their lowering refuses it (StableHLO's verifier: "must be non-negative")."""
    return jax_version() >= (0, 11)


def aval_vma(aval) -> frozenset:
    """The mesh axes an aval varies over (JAX's vma: `aval.vma` or `aval.manual_axis_type.varying`)."""
    vma = getattr(aval, "vma", None)
    if vma is not None:
        return frozenset(vma)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(getattr(mat, "varying", ()) or ())


def scan_split_args(params, args):
    """(consts, init carry, xs) of a `scan` equation's operands.

    jax <= 0.11 binds `num_consts`/`num_carry`; jax 0.12 binds FlatTrees `ft_in`/`ft_out`.
    """
    if "ft_in" in params:
        consts, carry, xs = params["ft_in"].update(list(args)).unpack()
        return list(consts), list(carry), list(xs)
    nc, nk = params["num_consts"], params["num_carry"]
    return list(args[:nc]), list(args[nc:nc + nk]), list(args[nc + nk:])


def shard_map_manual_axes(params) -> frozenset:
    """The axes a `shard_map` equation makes manual (`newly_manual_axes`, older `auto` complement)."""
    if "newly_manual_axes" in params:
        return frozenset(params["newly_manual_axes"])
    if "manual_axes" in params:
        return frozenset(params["manual_axes"])
    mesh = params["mesh"]
    return frozenset(mesh.axis_names) - frozenset(params.get("auto", ()))


def use_abstract_mesh(mesh):
    """Context manager making `mesh` (a jax AbstractMesh) the tracing context mesh."""
    import jax

    return jax.sharding.use_abstract_mesh(mesh)


def all_primitive_names() -> set:
    """Names of every `jax.extend.core.Primitive` instance defined in the installed JAX's modules."""
    import importlib
    import pkgutil
    import sys

    import jax
    from jax.extend.core import Primitive

    import jax._src as src

    for info in pkgutil.walk_packages(src.__path__, "jax._src."):
        name = info.name
        if any(part in name for part in (".tpu", "pallas.mosaic", "mosaic_gpu", "triton", "cudnn",
                                          ".mosaic", "_test", "test_util", "internal_test")):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # optional backends (Triton, Mosaic) may not import on CPU
            continue
    names = set()
    for mod_name, mod in list(sys.modules.items()):
        if not (mod_name == "jax" or mod_name.startswith(("jax.", "jax._src"))) or mod is None:
            continue
        for val in list(vars(mod).values()):
            if isinstance(val, Primitive):
                names.add(val.name)
    del jax
    return names


# --- PRNG key arrays (JAX extended dtypes) -------------------------------------------------
# refsim holds a key array as a NumPy structured array: one field, named after the PRNG
# impl, of the impl's key_shape in uint32. Data movement rules then work on keys unchanged.

def prng_impl_of(dtype):
    """The PRNGImpl of a JAX key dtype (`key<fry>`), or None for an ordinary dtype."""
    if dtype is None or isinstance(dtype, _np.dtype):  # a NumPy dtype is never a JAX key dtype
        return None
    import jax

    try:
        if not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            return None
    except TypeError:
        return None
    return getattr(dtype, "_impl", None)


def key_numpy_dtype(impl):
    """The structured NumPy dtype refsim uses for keys of PRNG `impl`."""
    import numpy as np

    return np.dtype([(impl.name, np.uint32, tuple(impl.key_shape))])


def to_numpy(x):
    """`np.asarray(x)`, except a JAX key array becomes refsim's structured key array
    (`jax.random.key_data` viewed as `key_numpy_dtype(impl)`), as NumPy refuses key dtypes."""
    import numpy as np

    impl = prng_impl_of(getattr(x, "dtype", None))
    if impl is None:
        return np.asarray(x)
    import jax

    data = np.ascontiguousarray(np.asarray(jax.random.key_data(x)))
    key_nd = len(tuple(impl.key_shape))
    return data.view(key_numpy_dtype(impl)).reshape(data.shape[:data.ndim - key_nd])


def has_logical_device_ids(sharding) -> bool:
    """True for a NamedSharding whose devices are renumbered by a private `_logical_device_ids`
    (JAX's efficient reshard between device orders, `dispatch._different_device_order_reshard`,
    jax 0.10 … 0.12): its blocks are not where its mesh and spec alone put them."""
    return getattr(sharding, "_logical_device_ids", None) is not None


def key_base_array(x):
    """The uint32 jax.Array holding a key array's words (`PRNGKeyArray._base_array`, jax 0.10 …
    0.12): read off the devices without running `jax.random.key_data` (a jit)."""
    return x._base_array


def jax_key_dtype(np_dtype):
    """The JAX key dtype a refsim structured key dtype stands for (None for other dtypes)."""
    import numpy as np

    names = getattr(np.dtype(np_dtype), "names", None)
    if not names or len(names) != 1:
        return None
    import jax

    sub = np.dtype(np_dtype)[names[0]]
    try:
        return jax.random.wrap_key_data(np.zeros(sub.shape, np.uint32), impl=names[0]).dtype
    except (ValueError, TypeError, KeyError):
        return None


def physical_dtype(dtype):
    """The NumPy dtype of refsim's value for a jaxpr aval dtype (keys -> structured dtype)."""
    import numpy as np

    if isinstance(dtype, np.dtype):  # a NumPy dtype (not a JAX key dtype) is its own
        return dtype
    impl = prng_impl_of(dtype)
    return key_numpy_dtype(impl) if impl is not None else np.dtype(dtype)


# --- layouts: JAX's own HLO / Shardy text, for comparison tests --------------------------

def jax_hlo_sharding_text(jax_named_sharding, ndim: int) -> str:
    """`str(NamedSharding._to_xla_hlo_sharding(ndim))` (the same private name in 0.9 … 0.12).

    On a one-device mesh jax 0.9 prints a spec that names its axis as a one-tile tiling,
    `{devices=[1,1]<=[1]}` (`{devices=[]<=[1]}` for a scalar), a one-device mesh of Manual axes as
    `{manual}` (measured 2026-12-06, the version matrix's draw), and a scalar unreduced over all
    devices as `{devices=[n]<=[n] last_tile_dims={unreduced}}` (an array of rank r whose dimensions
    are all replicated: `{devices=[1,...,1,n]<=[n] last_tile_dims={unreduced}}`, r ones; the version
    matrix of 2026-12-06 drew it on a rank-1 array); jax 0.10 … 0.12 print these
    layouts as `{replicated}` and `{unreduced}`, the texts given here for every version."""
    text = str(jax_named_sharding._to_xla_hlo_sharding(ndim))
    if _ONE_TILE.match(text):
        return "{replicated}"
    if text == "{manual}" and jax_named_sharding.mesh.size == 1:
        return "{replicated}"   # jax 0.9 on a one-device mesh of Manual axes; 0.10 … 0.12 print {replicated}
    return "{unreduced}" if _ALL_UNREDUCED.match(text) else text


_ONE_TILE = re.compile(r"^\{devices=\[(?:1(?:,1)*)?\]<=\[1\]\}$")   # jax 0.9's one-device tiling
# jax 0.9's value of replicated dimensions unreduced over every device; 0.10+ print `{unreduced}`
_ALL_UNREDUCED = re.compile(r"^\{devices=\[(?:1,)*(\d+)\]<=\[\1\] last_tile_dims=\{unreduced\}\}$")


def xla_parse_hlo_sharding(text: str):
    """XLA's own parse of sharding text (`xla_client.HloSharding.from_string`)."""
    from jax._src.lib import xla_client as xc

    return xc.HloSharding.from_string(text)


def jax_sdy_sharding_text(jax_named_sharding, ndim: int, modify_wrt_axis_types: bool = False) -> str:
    """The printed `#sdy.sharding<mesh<...>, [...]>` attribute JAX builds for a NamedSharding.

    jax 0.9 … 0.12 all return an `SdyArray` from `_to_sdy_sharding` whose `build` (with an
    attribute cache from 0.10 on) needs an MLIR context with the sdy dialect loaded.
    `modify_wrt_axis_types` (jax >= 0.10; see `sdy_marks_unused_explicit_axes`) must be False on
    jax 0.9, which has no such mode.
    """
    from jax._src.interpreters import mlir

    args = (ndim, modify_wrt_axis_types) if sdy_marks_unused_explicit_axes() else (ndim,)
    if modify_wrt_axis_types and len(args) == 1:
        raise ValueError(f"modify_wrt_axis_types=True: jax {'.'.join(map(str, jax_version()))} has no such "
                         f"mode (jax >= 0.10); pass False")
    sdy_array = jax_named_sharding._to_sdy_sharding(*args)
    with mlir.make_ir_context():
        # jax >= 0.10's build takes an attribute cache; jax 0.9's takes nothing
        return str(sdy_array.build({}) if jax_version() >= (0, 10) else sdy_array.build())


def sdy_marks_unused_explicit_axes() -> bool:
    """True when JAX's `NamedSharding._to_sdy_sharding` takes `modify_wrt_axis_types` (jax >= 0.10:
    Explicit axes a spec leaves unused become `replicated={...}`); jax 0.9 has no such mode."""
    return jax_version() >= (0, 10)


# --- debugging: where an equation came from ---------------------------------------------------

def eqn_source_line(eqn) -> str:
    """The user's source line of a jaxpr equation, "file:line:col (function)", or "" if unknown.

    `source_info_util.summarize` (private, the same in jax 0.10 … 0.12) skips JAX's own frames
    as jaxpr pretty-printing does.
    """
    from jax._src import source_info_util

    info = getattr(eqn, "source_info", None)
    if info is None:
        return ""
    try:
        return source_info_util.summarize(info)
    except Exception:  # a hand-built equation may carry no traceback
        return ""


# --- conformance.faults: JAX's lowering-rule tables and the reshard dispatcher ---------------

def lowering_tables():
    """(default table, per-platform tables, entry class) of `jax._src.interpreters.mlir`.

    jax 0.10 … 0.12 keep `_lowerings: {Primitive: LoweringRuleEntry(rule, inline)}` and
    `_platform_specific_lowerings: {platform: {Primitive: LoweringRuleEntry}}`.
    """
    from jax._src.interpreters import mlir

    return mlir._lowerings, mlir._platform_specific_lowerings, mlir.LoweringRuleEntry


def primitive_by_name(name: str):
    """The JAX Primitive object for a collective / shard_map primitive name, or any primitive
    with a default lowering rule (None if absent)."""
    from jax._src import shard_map as _sm
    from jax._src.lax import parallel as _par

    if name == "shard_map":
        return _sm.shard_map_p
    prim = getattr(_par, f"{name}_p", None)
    if prim is None:
        # any other lowered primitive (reduce_sum, sharding_constraint, ...), by its registered name
        from jax._src.interpreters import mlir

        prim = next((p for p in mlir._lowerings if p.name == name), None)
    return prim


def lowering_axis_env(ctx) -> dict:
    """{axis name: size}, in mesh order, of the mesh a lowering rule's collective runs over."""
    axis_ctx = ctx.module_context.axis_context
    mesh = getattr(axis_ctx, "mesh", None)
    if mesh is not None:
        return dict(zip(mesh.axis_names, mesh.axis_sizes))
    env = axis_ctx.axis_env
    return dict(zip(env.names, env.sizes))


def reshard_dispatch_module():
    """The module whose `_cached_logical_device_ids` maps a reshard onto a permuted device
    order (`jax._src.dispatch._different_device_order_reshard`, 0.10 … 0.12)."""
    from jax._src import dispatch

    return dispatch


def lower_fun(fn, multiple_results: bool = False):
    """`jax._src.interpreters.mlir.lower_fun`: lower a traceable function inside a lowering rule."""
    from jax._src.interpreters import mlir

    return mlir.lower_fun(fn, multiple_results=multiple_results)


def ppermute_axes_must_follow_mesh_order() -> bool:
    """True where JAX rejects ppermute / pshuffle / pbroadcast over a tuple of axes out of mesh
    order: 0.12's lowering raises RuntimeError unless ``jax_raise_on_ppermute_sort_diff`` is
    off (its default is on); 0.10 has no such flag and accepts any order."""
    import jax

    return bool(getattr(jax.config, "jax_raise_on_ppermute_sort_diff", False))


def is_jax_partition_spec(x) -> bool:
    """True for a `jax.sharding.PartitionSpec` (its class is named `P` in jax 0.10, so no name test).

    Never imports JAX: if JAX is not loaded, `x` cannot be one of its specs.
    """
    import sys

    jax_sharding = sys.modules.get("jax.sharding")
    return jax_sharding is not None and isinstance(x, jax_sharding.PartitionSpec)


def flatten_axes(name: str, treedef, axis_tree) -> list:
    """`jax._src.api_util.flatten_axes`: broadcast an in_axes prefix over the arguments' tree.

    Its ValueError names the argument as JAX's does (`pmap in_axes[0][0]`), so refsim.pmap
    rejects a bad prefix with JAX's own wording (0.10 … 0.12 share the signature).
    """
    from jax._src.api_util import flatten_axes as _flatten_axes

    return list(_flatten_axes(name, treedef, axis_tree))


# --- refsim.stablehlo: MLIR Python bindings shipped in jaxlib (0.10 … 0.12) -------------------

def mlir_context():
    """A fresh MLIR context with every dialect JAX emits registered (stablehlo, chlo, sdy, mhlo,
    func): `jax._src.interpreters.mlir.make_ir_context`, the same name in jax 0.10 … 0.12."""
    from jax._src.interpreters import mlir

    return mlir.make_ir_context()


def mlir_ir():
    """The `ir` module of jaxlib's MLIR bindings."""
    from jax._src.lib.mlir import ir

    return ir


def stablehlo_dialect():
    """jaxlib's StableHLO dialect bindings (attribute classes DotDimensionNumbers, ...)."""
    from jaxlib.mlir.dialects import stablehlo

    return stablehlo


def exported_platform_index(exported) -> int:
    """The platform index an Exported lowered for several platforms takes as its first module
    argument: the position of the platform JAX runs on among `exported.platforms` (0 where it is
    not among them, as JAX's lowering with the platform safety check disabled)."""
    import jax
    from jax._src import xla_bridge

    here = xla_bridge.canonicalize_platform(jax.default_backend())
    return exported.platforms.index(here) if here in exported.platforms else 0


def exported_out_specs(exported) -> list:
    """Per result of an Exported, the layout it states: (axis names, axis sizes, jax PartitionSpec)
    of its NamedSharding over an abstract mesh (`_out_named_shardings`, jax 0.10 … 0.12), or None
    (unstated, or an HloSharding only)."""
    out = []
    for sh in getattr(exported, "_out_named_shardings", None) or (None,) * len(exported.out_avals):
        mesh, spec = getattr(sh, "mesh", None), getattr(sh, "spec", None)
        if mesh is None or spec is None:
            out.append(None)
            continue
        out.append((tuple(mesh.axis_names), tuple(int(n) for n in mesh.axis_sizes), spec))
    return out


_REFSIM_MAIN = "_refsim_exported_main"


def refined_exported_module(exported, shapes: tuple) -> str:
    """The StableHLO text of an Exported's module for a call with argument shapes `shapes` (one per
    argument of the call, before `module_kept_var_idx`). A module exported with static shapes is
    its own text; a shape-polymorphic one (`tensor<?x8xf32>` arguments, dimension sizes read with
    `get_dimension_size`) is wrapped in a `@main` taking the static shapes, which converts them to
    the polymorphic ones and calls the original, and refined by JAX's shape refinement
    (`mlir.refine_polymorphic_shapes`, as JAX does when it compiles a call of it; jax 0.10 … 0.12)."""
    import re

    text = exported.mlir_module()
    if all(isinstance(d, int) for a in exported.in_avals for d in a.shape):
        return text
    from jax._src.interpreters import mlir

    ir = mlir_ir()
    with mlir_context(), ir.Location.unknown():
        fn = ir.Module.parse(text).body.operations
        main = next(op for op in fn if ir.StringAttr(op.attributes["sym_name"]).value == "main")
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        ins, outs = list(ftype.inputs), list(ftype.results)
        n_lead = len(ins) - len(exported.module_kept_var_idx)      # the platform index, if any
        kept_shapes = [tuple(shapes[i]) for i in exported.module_kept_var_idx]
        static = [str(t) for t in ins[:n_lead]]
        for t, shp in zip(ins[n_lead:], kept_shapes):
            static.append(str(ir.RankedTensorType.get(shp, ir.RankedTensorType(t).element_type)))
        dyn, res = [str(t) for t in ins], [str(t) for t in outs]
        lines = [f"  func.func public @main({', '.join(f'%a{i}: {t}' for i, t in enumerate(static))}) -> "
                 f"({', '.join(res)}) {{"]
        for i, (st, dt) in enumerate(zip(static, dyn)):
            lines.append(f"    %c{i} = stablehlo.convert %a{i} : ({st}) -> {dt}" if st != dt else
                         f"    %c{i} = stablehlo.convert %a{i} : ({st}) -> {st}")
        call_res = f"%r:{len(res)}" if len(res) > 1 else "%r"
        lines.append(f"    {call_res} = func.call @{_REFSIM_MAIN}({', '.join(f'%c{i}' for i in range(len(dyn)))}) : "
                     f"({', '.join(dyn)}) -> ({', '.join(res)})")
        rets = [f"%r#{k}" for k in range(len(res))] if len(res) > 1 else ["%r"] * len(res)
        lines.append(f"    return {', '.join(rets)} : {', '.join(res)}")
        lines.append("  }")
    # the original main becomes a private function; the wrapper is the module's first function
    renamed = re.sub(r"func\.func public @main\(", f"func.func private @{_REFSIM_MAIN}(", text, count=1)
    at = renamed.index(f"func.func private @{_REFSIM_MAIN}(")
    wrapped = renamed[:at] + "\n".join(lines).lstrip() + "\n  " + renamed[at:]
    with mlir_context():
        module = mlir.refine_polymorphic_shapes(ir.Module.parse(wrapped))
        return str(module)


def attribute_names(op) -> list:
    """Names of an operation's attributes: iterating `op.attributes` yields str in jaxlib 0.10 …
    0.12 and NamedAttribute in older MLIR bindings."""
    return [a if isinstance(a, str) else a.name for a in op.attributes]


def compiled_hlo_module(compiled):
    """The compiled per-device (SPMD-partitioned) HLO module of a `jax.stages.Compiled`:
    `runtime_executable().hlo_modules()[0]` (jax 0.10 … 0.12). `.to_string()` gives its text."""
    return compiled.runtime_executable().hlo_modules()[0]


def hlo_module_to_stablehlo_bytes(hlo_module) -> bytes:
    """An XLA HLO module as StableHLO bytecode: jaxlib's `_xla.mlir.hlo_to_stablehlo` of its
    serialised proto (present in jax 0.10 … 0.12)."""
    from jax._src.lib import xla_client as xc

    return xc._xla.mlir.hlo_to_stablehlo(hlo_module.as_serialized_hlo_module_proto())


def hlo_text_to_stablehlo_bytes(hlo_text: str) -> bytes:
    """HLO text (as `HloModule.to_string()` prints it, possibly edited) as StableHLO bytecode:
    parsed by `jaxlib._hlo.hlo_module_from_text`, then converted as `hlo_module_to_stablehlo_bytes`."""
    from jaxlib import _hlo

    return hlo_module_to_stablehlo_bytes(_hlo.hlo_module_from_text(hlo_text))


def stablehlo_verifies(data) -> bool:
    """True when jaxlib's MLIR parses and verifies the StableHLO module `data` (bytecode or text)."""
    try:
        with mlir_context():
            mlir_ir().Module.parse(data)
        return True
    except Exception:  # noqa: BLE001 - MLIRError: e.g. the converter's output fails its own verifier
        return False


def traceback_filtering_off():
    """A context manager with JAX's traceback filtering off in this thread (jax 0.10-0.12:
    `jax._src.config.traceback_filtering`; a null context on a JAX without it). Filtering walks
    every frame of a raised exception's traceback; it changes only the traceback, never the
    exception's class or message."""
    try:
        from jax._src import config
    except ImportError:  # pragma: no cover - a JAX without that module
        return contextlib.nullcontext()
    state = getattr(config, "traceback_filtering", None)
    return state("off") if callable(state) else contextlib.nullcontext()


@contextlib.contextmanager
def tag_compile_errors():
    """Inside: an exception raised while XLA compiles (`jax._src.compiler.backend_compile_and_load`,
    the one call every jit / pmap compile goes through in jax 0.10 ... 0.12) carries
    ``xla_stage = "compiler"``, so a caller can tell a compile failure from a failure at run time."""
    from jax._src import compiler

    original = compiler.backend_compile_and_load

    def compile_and_load(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except Exception as e:
            try:
                e.xla_stage = "compiler"
            except AttributeError:  # an exception type without a __dict__: left untagged
                pass
            raise

    compiler.backend_compile_and_load = compile_and_load
    try:
        yield
    finally:
        compiler.backend_compile_and_load = original


def compile_edited_module(lowered, edit):
    """Compile `lowered` (a `jax.stages.Lowered`) after `edit(text) -> text` rewrote its
    StableHLO: the executable XLA builds from a module other than the one JAX lowered.

    `Lowered._lowering._hlo` (jax 0.10 … 0.12: `MeshComputation` keeps the module it
    compiles there, and its executable in `_executable`) is replaced for this one compile
    and restored afterwards.
    """
    ir = mlir_ir()
    comp = lowered._lowering
    original = comp._hlo
    text = edit(original.operation.get_asm(enable_debug_info=True))
    with original.context:
        edited = ir.Module.parse(text)
    cached = getattr(comp, "_executable", None)
    comp._hlo, comp._executable = edited, None
    try:
        return lowered.compile()
    finally:
        comp._hlo, comp._executable = original, cached


class _CompileCaptured(Exception):
    pass


def capture_compile(lowered, edit=None) -> dict:
    """What XLA would be asked to compile for `lowered` (a `jax.stages.Lowered`), without
    compiling: `lowered.compile()` runs with `jax._src.compiler.compile_or_get_cached` (the one
    call jit / pmap compiles go through, jax 0.10 ... 0.12) replaced by a capture, on a fresh
    copy of its module (`edit(text) -> text` applied, as `compile_edited_module`), so no cached
    executable stands in for the compile. Returns {"module": StableHLO bytecode, "options":
    serialised xla CompileOptions, "device_ids": the device assignment's ids in order,
    "platform", "host_callbacks": how many the program has}."""
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir

    box: dict = {}
    original = compiler.compile_or_get_cached

    def capture(backend, computation, devices, compile_options, host_callbacks, *args, **kwargs):
        box.update(module=mlir.module_to_bytecode(computation), options=compile_options.SerializeAsString(),
                   device_ids=[int(d.id) for d in np.asarray(devices).reshape(-1)],
                   platform=str(backend.platform), host_callbacks=len(host_callbacks or ()))
        raise _CompileCaptured

    compiler.compile_or_get_cached = capture
    try:
        compile_edited_module(lowered, edit or (lambda text: text))
    except _CompileCaptured:
        pass
    finally:
        compiler.compile_or_get_cached = original
    if not box:
        raise RuntimeError("capture_compile: lowered.compile() did not reach XLA's compile; this JAX compiles "
                           "through another call than jax._src.compiler.compile_or_get_cached.")
    return box


def compile_captured(module: bytes, options: bytes, device_ids):
    """Compile a `capture_compile` record on this process's devices; returns XLA's loaded executable."""
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc

    from jax._src.lax import linalg

    # LAPACK's kernels are bound lazily, when JAX lowers a linalg op; a module compiled in a process
    # that lowered none calls unbound kernels (jax.export binds them the same way before running one)
    getattr(linalg, "initialize_lapack", lambda: None)()
    backend = xla_bridge.get_backend()
    by_id = {d.id: d for d in backend.devices()}
    missing = [i for i in device_ids if i not in by_id]
    if missing:
        raise ValueError(f"the program runs on devices {list(device_ids)}; this process has {sorted(by_id)}.")
    opts = xc.CompileOptions.ParseFromString(options)
    with mlir.make_ir_context():
        mod = mlir_ir().Module.parse(module)
        return compiler.backend_compile_and_load(backend, mod, xc.DeviceList(tuple(by_id[i] for i in device_ids)),
                                                 opts, [])


def executable_layout(exe, arg_shapes, out_shapes) -> dict:
    """{"device_ids": partition order, "in_indices" / "out_indices": per argument / output, the
    index tuple of each partition's block (XLA's parameter and output shardings)}."""
    from jax._src import op_shardings
    from jax._src.lib import xla_client as xc

    devs = exe.local_devices()
    n = len(devs)

    def indices(shardings, shapes):
        out = []
        for k, shape in enumerate(shapes):
            s = shardings[k] if shardings is not None and k < len(shardings) else None
            if s is None:
                out.append([tuple(slice(None) for _ in shape)] * n)
            else:
                hs = xc.HloSharding.from_proto(s) if isinstance(s, xc.OpSharding) else s
                out.append([tuple(i) for i in op_shardings.op_sharding_to_indices(hs, tuple(shape), n)])
        return out

    return {"device_ids": [int(d.id) for d in devs],
            "in_indices": indices(exe.get_parameter_shardings(), arg_shapes),
            "out_indices": indices(exe.get_output_shardings(), out_shapes)}


def execute_captured(exe, args, layout) -> list:
    """Run `exe` on global NumPy `args` cut by `layout["in_indices"]`; returns per output the
    stacked (partition, *shard) NumPy values."""
    import jax
    import numpy as np
    from jax._src import sharding_impls

    devs = exe.local_devices()
    params = exe.get_parameter_shardings()
    arrays = []
    for k, a in enumerate(args):
        a = np.asarray(a)
        shards = [jax.device_put(np.array(a[idx]), d) for idx, d in zip(layout["in_indices"][k], devs)]
        if len(devs) == 1:
            sharding = jax.sharding.SingleDeviceSharding(devs[0])
        else:
            sharding = sharding_impls.GSPMDSharding(tuple(devs), params[k])
        arrays.append(jax.make_array_from_single_device_arrays(a.shape, sharding, shards))
    results = exe.execute_sharded(arrays)
    return [np.stack([np.asarray(x) for x in per_device])
            for per_device in results.disassemble_into_single_device_arrays()]


def module_text(data: bytes) -> str:
    """The text of a StableHLO module given as bytecode (in a fresh MLIR context)."""
    from jax._src.interpreters import mlir

    with mlir.make_ir_context():
        return str(mlir_ir().Module.parse(data))


def hlo_module_from_proto(data: bytes):
    """An XLA HloModule from its serialised proto (`HloModule.as_serialized_hlo_module_proto`)."""
    from jaxlib import _hlo

    return _hlo.HloModule.from_serialized_hlo_module_proto(data)


def lowered_kept_args(lowered, n_args: int) -> list:
    """Positions of the flat arguments the lowered module still takes: jit drops unused ones
    (`keep_unused=False`); `MeshComputation.compile_args["kept_var_idx"]` in jax 0.10 … 0.12."""
    kept = lowered._lowering.compile_args.get("kept_var_idx")
    return list(range(n_args)) if kept is None else sorted(kept)


def partition_device_ids(compiled) -> list:
    """JAX device ids of a compiled SPMD program's partitions, in partition-id order (the
    executable's device assignment; `local_devices()` lists it in that order, jax 0.10 … 0.12)."""
    return [d.id for d in compiled.runtime_executable().local_devices()]


def lowered_out_shardings(lowered) -> list:
    """The output shardings a lowered jit program was lowered with (before compiling):
    `MeshComputation.compile_args["out_shardings"]`, jax 0.10 … 0.12."""
    return list(lowered._lowering.compile_args["out_shardings"])
# --- callbacks: JAX's own formatting for jax.debug.print ------------------------------------

def debug_print_callback(fmt, np_printoptions, has_placeholders, logging_record, in_tree, static_args):
    """The flat callable `jax.debug.print`'s `debug_print` primitive runs (jax/_src/debugging.py:
    `_format_print_callback` wrapped by `_make_flat_callback`), so refsim prints exactly JAX's text."""
    import functools

    from jax._src import debugging

    cb = functools.partial(debugging._format_print_callback, fmt, dict(np_printoptions),
                           has_placeholders, logging_record)
    return debugging._make_flat_callback(in_tree, cb, static_args)


def approx_top_k_output_size(input_size, rank, k, recall_target, aggregate_to_topk, size_override) -> int:
    """The reduction-dimension size `lax.approx_max_k` returns (jaxlib's own formula)."""
    from jax._src.lib import _jax

    return int(_jax.approx_top_k_reduction_output_size(input_size, rank, k, recall_target,
                                                       aggregate_to_topk, size_override)[0])


# --- primitives JAX itself lowers by tracing a Python implementation (mlir.lower_fun) ---------

def lowering_decomposition(name: str):
    """The Python function JAX's CPU lowering of primitive `name` traces (`mlir.lower_fun(fn)`),
    called as fn(*operands, **params); None when JAX lowers `name` some other way.

    random_gamma: `random.core._gamma_impl(use_vmap=True)` (Marsaglia-Tsang rejection sampling
    on threefry keys); regularized_incomplete_beta / igamma_grad_a: `lax.special`'s series
    and continued fractions; ragged_dot_general: `lax._ragged_dot_general_impl` (groups expanded
    to masked dense operands, one dot_general). Same names and modules in jax 0.10 … 0.12.
    """
    import functools

    if name == "random_gamma":
        from jax._src.random import core as rcore

        return functools.partial(rcore._gamma_impl, use_vmap=True)
    if name == "call_hi_primitive":  # a hijax primitive: lowered through its `expand` into lojax
        from jax._src import hijax

        return hijax._call_hi_primitive_to_lojax
    if name == "polynomial":  # jax >= 0.12: Horner's rule (a scan past 8 coefficients)
        from jax._src.lax import lax as _lax

        return getattr(_lax, "_polynomial_lower", None)
    if name == "ragged_dot_general":  # lowered via lower_fun unless the ragged_dot instruction flag is on
        from jax._src.lax import lax as _lax

        return _lax._ragged_dot_general_impl
    if name in ("regularized_incomplete_beta", "igamma_grad_a"):
        from jax._src.lax import special

        impl = getattr(special, f"{name}_impl")
        return lambda *args, **params: special._up_and_broadcast(impl)(*args, **params)
    return None



def gspmd_lowering():
    """Context manager lowering with GSPMD's sharding custom calls instead of Shardy
    (`jax._src.config.use_shardy_partitioner(False)`, jax 0.10 … 0.12)."""
    from jax._src import config

    return config.use_shardy_partitioner(False)


# --- eager shard_map: per-device avals with a manual-axis type ---------------------------------

def trace_core():
    """The module that defines JAX's tracing machinery, for a Trace of refsim's own (eager
    refsim.shard_map): `jax._src.core` with `Trace`, `Tracer`, `set_current_trace`,
    `extend_axis_env_nd`, `typeof` and `ShapedArray` (the same names in jax 0.10 … 0.12)."""
    from jax._src import core

    return core


def aval_mat(aval):
    """An aval's manual-axis type (`core.ManualAxisType`: varying / unreduced / reduced), or None."""
    return getattr(aval, "manual_axis_type", None) or getattr(aval, "mat", None)


def aval_with_mat(aval, sharding, varying):
    """`aval` on `sharding` (a manual abstract mesh), varying over `varying` (jax 0.10 … 0.12:
    `ShapedArray.update(sharding=..., manual_axis_type=ManualAxisType(varying=...))`)."""
    from jax._src import core

    return aval.update(sharding=sharding, manual_axis_type=core.ManualAxisType(varying=frozenset(varying)))


def check_vma_context(check: bool):
    """The `config._check_vma` context jax.shard_map traces its body under (it turns on the
    varying-axes type rules of every primitive's abstract evaluation)."""
    from jax._src import config

    return config._check_vma(bool(check))


#: JAX's older public entry points that build the same programs as `jax.shard_map` / `jax.jit`:
#: (module, attribute, the kind of program they build). `jax.experimental.shard_map.shard_map`
#: takes `check_rep` (jax 0.10 … 0.12 pass it on as `check_vma`; older JAX also took `auto=`),
#: `jax.experimental.pjit.pjit` takes jit's arguments, positionally too.
LEGACY_ENTRY_POINTS = (("jax.experimental.shard_map", "shard_map", "shard_map"),
                       ("jax.experimental.pjit", "pjit", "jit"))


def legacy_entry_points() -> list:
    """[(module, attribute, kind, current value)] for each of `LEGACY_ENTRY_POINTS` this JAX has.

    In jax 0.10 … 0.12 both are deprecated attributes that the module's `__getattr__` serves with
    a DeprecationWarning on first access; reading them here must not warn the user, and a JAX that
    has dropped one (ImportError / AttributeError) gives fewer entries."""
    import importlib
    import warnings

    found = []
    for mod_name, attr, kind in LEGACY_ENTRY_POINTS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                mod = importlib.import_module(mod_name)
                value = getattr(mod, attr)
            except (ImportError, AttributeError):
                continue
        found.append((mod, attr, kind, value))
    return found


# -- oracle mode's execution hooks (conformance.oracle.intercept) ---------------------------------
#: The functions of `jax._src.pjit` that every jit execution through Python passes (jax 0.10 … 0.12):
#: `_pjit_call_impl_python(*args, jaxpr=, in_shardings=, out_shardings=, ..., name=, ...)` lowers,
#: compiles (both cached) and runs one execution, returning (outputs, executable, profiler, const
#: args); `_get_fastpath_data(executable, out_tree, args_flat, ...)` hands C++'s dispatch what it
#: needs to run later calls without Python (None: later calls come back to Python);
#: `_run_python_pjit(p, args_flat, fun, args, kwargs)` is a jit object's call (its function and the
#: user's arguments); `jit_p.impl` (`_pjit_call_impl`) runs a jit equation bound outside any trace
#: (grad/vjp/jvp/vmap of a jit applied outside jit, `core.eval_jaxpr`).
JIT_EXECUTION_HOOKS = ("_pjit_call_impl_python", "_get_fastpath_data", "_run_python_pjit")


def pjit_module():
    """`jax._src.pjit`, the module holding `JIT_EXECUTION_HOOKS` and `jit_p`."""
    from jax._src import pjit

    return pjit


def jit_primitive():
    """The primitive of a jit equation (`jit_p`, named "jit" in jax 0.10 … 0.12)."""
    return pjit_module().jit_p


def executable_device_count(executable) -> int:
    """How many devices a compiled jit executable (`pxla.MeshExecutable`) runs on; 1 when unknown."""
    devs = set()
    for sh in (*getattr(executable, "_in_shardings", ()), *getattr(executable, "_out_shardings", ())):
        try:
            devs |= set(sh.device_set)
        except (AttributeError, ValueError, NotImplementedError):
            continue
    if not devs:
        try:
            return len(executable.xla_executable.local_devices())
        except Exception:  # noqa: BLE001 - an executable of another kind: count it as one device
            return 1
    return len(devs)


def test_event_module():
    """`jax._src.util`: JAX's `test_event(name)` calls `util.test_event_listener`, which
    `jax._src.test_util` sets to count events (`count_pjit_cpp_cache_miss`: "jit_cpp_cache_miss",
    `count_jit_tracing_cache_miss`: "trace_to_jaxpr", `count_jit_and_pmap_lowerings`,
    `count_jit_compilation_cache_miss`, ...)."""
    from jax._src import util

    return util


def quiet_jax_config():
    """A context in which JAX neither logs compilations nor explains cache misses, and allows
    device-to-host copies whatever the user's `jax.transfer_guard` says (this thread)."""
    import contextlib

    from jax._src import config

    stack = contextlib.ExitStack()
    for name in ("log_compiles", "explain_cache_misses"):
        state = getattr(config, name, None)
        if state is not None:
            stack.enter_context(state(False))
    guard = getattr(config, "transfer_guard_device_to_host", None)
    if guard is not None:
        stack.enter_context(guard("allow"))
    return stack


def dispatch_module():
    """`jax._src.dispatch`: `_batched_device_put_impl(*xs, devices=, srcs=, copy_semantics=,
    dst_avals=)` runs every `jax.device_put` outside a trace (jax 0.10 … 0.12)."""
    from jax._src import dispatch

    return dispatch


def runtime_token_type():
    """`jax._src.core.Token` (jax 0.10 … 0.12): the runtime token an ordered effect threads
    through its executions (`io_callback(..., ordered=True)`); JAX's dispatch moves it onto the
    next execution's devices with `jax.device_put` (`RuntimeTokenSet.get_token_input`). It
    wraps a zero-size buffer and carries no data."""
    from jax._src import core

    return core.Token


#: The JAX functions (jax 0.10 … 0.12) that assemble one multi-device jax.Array from values given
#: per device without `jax.device_put`'s dispatch, by the name of the code that calls the hook
#: (`placement_hooks`): {code name: the public API the user called}. `pxla.batched_device_put(aval,
#: sharding, xs, devices)` is called by `make_array_from_callback` (xs: the callback's values, one
#: per device) and by `device_put_sharded` / `device_put_replicated` (their inner functions
#: `_device_put_sharded` / `_device_put_replicated`; xs[i] a leading-axis block for devices[i]);
#: `ArrayImpl._check_and_rearrange(arrays, sharding, aval)` orders the single-device arrays of
#: `make_array_from_single_device_arrays` (and of `make_array_from_callback` with a Format) by
#: the sharding's device assignment. Other callers (pmap's argument handling, device_put's own
#: dispatch) are jit executions or device_puts the oracle sees elsewhere.
PLACEMENT_CALLERS = {"make_array_from_callback": "make_array_from_callback",
                     "_device_put_sharded": "device_put_sharded",
                     "_device_put_replicated": "device_put_replicated",
                     "make_array_from_single_device_arrays": "make_array_from_single_device_arrays"}


def placement_hooks() -> tuple:
    """((module, "batched_device_put"), (ArrayImpl, "_check_and_rearrange", is_static)): where
    oracle mode sees the placements of `PLACEMENT_CALLERS`. `_check_and_rearrange` is a method in
    jax 0.10 and a staticmethod in 0.12; ArrayImpl's C++ constructor looks it up on each call."""
    from jax._src import array
    from jax._src.interpreters import pxla

    static = isinstance(array.ArrayImpl.__dict__.get("_check_and_rearrange"), staticmethod)
    return (pxla, "batched_device_put"), (array.ArrayImpl, "_check_and_rearrange", static)


#: What `placement_caller` says for JAX's own runtime-token bookkeeping: an executable with ordered
#: effects assembles its per-device token buffers with `make_array_from_single_device_arrays`
#: (`pxla` `_handle_token_bufs` / `_add_tokens_to_inputs`, jax 0.10 … 0.12).
RUNTIME_TOKEN_PLACEMENT = "runtime token"


def placement_caller(depth: int = 4) -> str | None:
    """The public API (`PLACEMENT_CALLERS`) whose code called the running placement hook, looked
    up the stack up to `depth` frames above the hook's caller (jax._src.array / jax._src.api
    code only); `RUNTIME_TOKEN_PLACEMENT` when JAX's executable machinery (`pxla`) called that
    API for its runtime tokens; None for any other caller."""
    import sys

    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        mod = frame.f_globals.get("__name__", "")
        if mod in ("jax._src.array", "jax._src.api"):
            api = PLACEMENT_CALLERS.get(frame.f_code.co_name)
            if api is not None:
                up = frame.f_back
                if up is not None and up.f_globals.get("__name__", "") == "jax._src.interpreters.pxla":
                    return RUNTIME_TOKEN_PLACEMENT
                return api
        frame = frame.f_back
    return None


def sharding_device_order(sharding) -> list:
    """The devices of a JAX sharding in its device assignment's order (what
    `_check_and_rearrange` orders the single-device arrays by)."""
    return list(sharding._addressable_device_assignment)


def legacy_device_put_sharded():
    """`jax.device_put_sharded` and `jax.device_put_replicated` (deprecated: the public names
    raise AttributeError on jax 0.10 … 0.12; libraries reach them in `jax._src.api`)."""
    from jax._src import api

    return api.device_put_sharded, api.device_put_replicated


def aot_compiled_class():
    """`jax.stages.Compiled`: `jit(f).lower(...).compile()`; its `__call__` runs the executable
    directly (no jit dispatch), so oracle mode hooks it there."""
    from jax._src import stages

    return stages.Compiled


def aot_traced_class():
    """`jax.stages.Traced` (`jit(f).trace(...)`; `jit(f).lower(...)` goes through its `lower`)."""
    from jax._src import stages

    return stages.Traced


def aot_lowered_class():
    """`jax.stages.Lowered`: its `compile` makes the `Compiled`."""
    from jax._src import stages

    return stages.Lowered


def aot_jit_params(traced) -> dict | None:
    """The jit equation's parameters (`jaxpr`, shardings, `name`, ...) a `Traced` lowers, as
    `_pjit_call_impl_python` receives them; None for a program with high-level (hijax) types,
    whose compiled calls convert their arguments first."""
    lo = traced.lojax
    if lo is not traced and getattr(traced.jaxpr, "is_high", False):
        return None
    return dict(lo._params)


def aot_call_is_plain(compiled) -> bool:
    """True when a `Compiled`'s call passes its flattened arguments to the executable unchanged."""
    return not getattr(compiled._params, "is_high", False)


def aot_compiled_device_count(compiled) -> int:
    return executable_device_count(getattr(compiled, "_executable", None))


def clear_jit_dispatch_caches() -> None:
    """Drop C++'s jit dispatch entries (not the compiled executables or traces), so calls of
    programs compiled earlier come back to Python once (`jax.clear_caches` drops more)."""
    pjit = pjit_module()
    for name in ("_cpp_pjit_cache_fun_only", "_cpp_pjit_cache_explicit_attributes"):
        cache = getattr(pjit, name, None)
        if cache is not None:
            cache.clear()


# --- the SPMD partitioner ------------------------------------------------------------------

def partitioners() -> tuple:
    """The SPMD partitioners the installed JAX can compile with: ("shardy", "gspmd") where
    ``jax_use_shardy_partitioner`` can be switched off (jax 0.10 … 0.12), else ("shardy",)."""
    from jax._src import config

    return ("shardy", "gspmd") if hasattr(config, "use_shardy_partitioner") else ("shardy",)


def use_partitioner(name: str):
    """Context manager compiling with partitioner `name` ("shardy" or "gspmd"), by JAX's own
    ``jax_use_shardy_partitioner`` config state (a context manager in jax 0.10 … 0.12)."""
    from jax._src import config

    if name not in partitioners():
        raise ValueError(f"partitioner={name!r}; this JAX (jax {'.'.join(map(str, jax_version()))}) has "
                         f"{partitioners()}.")
    return config.use_shardy_partitioner(name == "shardy")


def persistent_cache_module():
    """JAX's persistent compilation cache module (`jax._src.compilation_cache`, jax 0.10 to 0.12): it
    builds its cache with `get_file_cache(path)` on first use and drops it in `reset_cache()`."""
    from jax._src import compilation_cache

    return compilation_cache


def clear_compiled_executables() -> None:
    """Drop JAX's in-memory executables keyed by the lowered module (`pxla._cached_compilation`,
    jax 0.10 to 0.12), keeping its trace and lowering caches; everything (`jax.clear_caches`) where
    that cache is missing."""
    import jax

    try:
        from jax._src.interpreters import pxla

        pxla._cached_compilation.cache_clear()
    except (ImportError, AttributeError):
        jax.clear_caches()


# -- program classes (conformance.strategies.sharded_programs(classes=...)) ----------------------------
#: jax.checkpoint policies by name; offload ones move residuals to 'pinned_host' (XLA:CPU has the memory
#: kind since jax 0.4.3x, and both supported versions run them).
_REMAT_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                   "save_only_these_names", "save_anything_except_these_names",
                   "offload_dot_with_no_batch_dims", "save_and_offload_only_these_names")


def remat_policies() -> tuple[str, ...]:
    """The `jax.checkpoint_policies` names this JAX has, of those the program classes draw."""
    import jax

    return tuple(p for p in _REMAT_POLICIES if hasattr(jax.checkpoint_policies, p))


def compute_on_host() -> tuple[str | None, str]:
    """(source of a decorator that runs a jitted function with ``compute_on('device_host')``, or None;
    the reason when None). jax 0.10 takes ``compute_on(compute_type)``; jax 0.11+ require
    ``compute_type=`` and ``out_memory_spaces=`` keywords whose host placement XLA:CPU does not run the
    same way, so the program classes leave compute_on out there."""
    import inspect

    from jax.experimental.compute_on import compute_on

    params = inspect.signature(compute_on).parameters
    if list(params) == ["compute_type"]:
        return "jax.experimental.compute_on.compute_on('device_host')", ""
    return None, (f"jax {'.'.join(map(str, jax_version()))}'s compute_on takes {tuple(params)}: "
                  "out_memory_spaces is required, so compute_on is not drawn")
