"""`sharded_programs()`: random well-typed JAX programs over the lax op set, under drawn shardings.

Where `programs()` draws templates around one collective, this draws whole programs the way a
fuzzer of the SPMD partitioner would (NNSmith / Csmith for shardings): a straight-line graph of
`OPS` (elementwise arithmetic and comparisons, transcendentals, dot_general / einsum with drawn
batch and contracting dimensions, reductions, cumulative and windowed reductions, sorts,
gathers and scatters in every out-of-bounds mode, dynamic and strided slices, pads with negative
and interior padding, reshapes across sharded dimensions, FFT, convolution, scan / while / cond,
a custom_jvp function, shard_map regions with collectives) whose typed values (shape, dtype,
sharding) flow from op to op, so every draw traces. The program runs under ``jax.jit`` with
drawn in/out shardings over a drawn mesh (any device order, size-1 and prime axes, Auto or
Explicit axis types), with ``with_sharding_constraint`` / ``jax.sharding.reshard`` at drawn
points (also on dimensions the mesh axis does not divide), optionally under ``jax.grad``,
``jax.vjp`` or ``jax.vmap``, compiled by a drawn partitioner (Shardy or GSPMD).

A draw is a `ShardedProgram` (a `conformance.cases.Program`): its function is source text, so
refsim, XLA and the reproducer run the same function. Its data is exact-friendly; the value
model (`conformance.strategies._sharded_graph`) says per output whether every correct
implementation gives the same bits (compared exactly, the sign of a zero aside) or how far two
correct results may be apart (`ErrorBound`, around refsim's value).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import refsim
from conformance.cases import Program
from conformance.strategies import _validate as v
from conformance.strategies import _program_classes as pc
from conformance.strategies._program_classes import BACKWARD_CLASSES, CLASSES
from conformance.strategies._sharded_graph import BOOL, F32, I32, Builder, spec_text
from conformance.strategies._sharded_ops import KINKED, NOT_DIFFERENTIABLE, OPS
from conformance.strategies.meshes import meshes
from conformance.strategies.specs import _check_mesh
from conformance.verdict.compare import Exact, SumBound
from conformance.verdict.compare import as_outputs
from refsim import compat as _compat
from refsim.layouts.mesh import AxisType, Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec

__all__ = ["AXIS_TYPES", "CLASSES", "ErrorBound", "OPS", "PATTERNS", "SHARDED_DTYPES", "ShardedProgram", "TRANSFORMS",
           "sharded_programs"]

TRANSFORMS = ("none", "grad", "vjp", "vmap")
AXIS_TYPES = ("auto", "explicit")
SHARDED_DTYPES = (F32, I32, BOOL)
#: The sharding patterns an op's main operand can have where the op uses it (coverage table columns).
PATTERNS = ("replicated", "sharded", "multi-axis", "uneven", "compiler")
# Relative bound of a derivative's outputs: the value model tracks forward values only.
GRAD_RTOL = 2.0 ** -10


# -- the comparison policy of outputs that may round ------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ErrorBound(SumBound):
    """Within `bound` of refsim's value, element by element; NaN and infinities where refsim has
    them. It is a `SumBound` (the comparator's and the reproducers' bounded check) whose
    reference is refsim's result and whose bound is the value model's error bound."""

    bound: float = 0.0
    what: str = ""
    #: its arrays are elementwise in `exact` (compare checks all devices at once)
    elementwise_arrays = True

    @classmethod
    def around(cls, expected, bound: float, what: str = "") -> "ErrorBound":
        """The policy for one output: `expected` is refsim's Array (one reference per device)."""
        ref = {int(s.device_id): np.asarray(s.data) for s in expected.shards}
        return cls(n=1, exact=ref, abs_sum={d: np.abs(x) for d, x in ref.items()}, bound=float(bound), what=what)

    def describe(self) -> str:
        return f"within {self.bound:.3g} of refsim" + (f" ({self.what})" if self.what else "")

    def allowed(self, out_dtype) -> float:
        """The allowed |diff| (what `conformance.verdict.allowed` holds elements to where the value
        model is tighter than the allowed set)."""
        return self.bound

    def why(self, exact: bool) -> str:
        return f"error bound: {self.describe()}"

    def exact_elements(self, device_id: int, out_dtype) -> np.ndarray:
        return np.zeros(np.shape(self.exact[device_id]), bool)

    def reference_and_bound(self, device_id: int, out_dtype):
        ref = np.asarray(self.exact[device_id]).astype(np.float64)
        return ref, np.full(ref.shape, self.bound)

    def allowed_nonfinite(self, device_id: int, out_dtype):
        ref = np.asarray(self.exact[device_id]).astype(np.float64)
        return np.isposinf(ref), np.isneginf(ref), np.isnan(ref)


# -- the case ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class ShardedProgram(Program):
    """A drawn sharded program: a jit `Program` compiled with `partitioner`, whose outputs are
    compared by `policies` (per output ``("exact", 0)``, ``("abs", bound)`` or ``("rel", rtol)``
    relative to the output's largest magnitude). `op_patterns` lists (op, sharding pattern) for
    every op in program order; `transform` and `axis_types` say how it was built."""

    partitioner: str = "shardy"
    transform: str = "none"
    axis_types: str = "auto"
    policies: tuple = ()
    op_patterns: tuple = ()
    graph: object = None
    #: the jit's donate_argnums (the "donation" class): both engines consume these arguments
    donate_argnums: tuple = ()

    @property
    def program_class(self) -> str:
        """How the op graph is called (`CLASSES`: "plain", "scan_layers", "remat", ...)."""
        return self.graph.program_class[0] if self.graph is not None else "plain"

    @property
    def ops(self) -> tuple:
        """The distinct ops of the program, in order of first use."""
        return tuple(dict.fromkeys(op for op, _ in self.op_patterns))

    def run(self, api):
        """Run on an engine under `partitioner` (refsim ignores it; XLA compiles with it)."""
        with _compat.use_partitioner(self.partitioner):
            out = self._run_chain(api) if self.program_class == "jit_chain_orders" else super().run(api)
        if getattr(api, "__name__", "") == "refsim":
            self.__dict__["_refsim_out"] = out   # the reference the error bounds are around
        return out

    def _run_chain(self, api) -> tuple:
        """A ``jit_chain_orders`` program: `fn` (one step) jitted once per drawn mesh, the arguments
        placed by `in_shardings`, then moved by ``api.device_put`` into each later call's shardings:
        the same specs (``g``'s argument types on Explicit axes) on that call's mesh, so the carry
        moves from the layout the call before gave it to another layout on another device order."""
        meshes = pc.chain_meshes(self.graph.program_class, self.mesh)
        steps = pc.chain_specs(self.graph.program_class, len(self.graph.outs))
        args = [api.device_put(a, s) for a, s in zip(self.args, self.in_shardings)]
        outs = []
        for k, (m, specs) in enumerate(zip(meshes, steps)):
            ins = tuple(NamedSharding(m, s.spec) for s in self.in_shardings)
            if k:
                args = [api.device_put(a, s) for a, s in zip(args, ins)]
            o = api.jit(self.fn, in_shardings=ins, out_shardings=tuple(NamedSharding(m, _pspec(sp)) for sp in specs))(
                *args)
            args[0] = o[0]
            outs += list(o[1:])
        return (args[0], *outs)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_refsim_out", None)
        return state

    @functools.cached_property
    def _structure_key(self) -> tuple:
        return Program._structure_key.func(self) + (self.donate_argnums,)

    def _build_entry(self, entry):
        if self.donate_argnums:
            return entry(self.fn, in_shardings=self.in_shardings, out_shardings=self.out_shardings,
                         donate_argnums=self.donate_argnums)
        return super()._build_entry(entry)

    def tolerances(self) -> list:
        """Per output: exact (either sign of a zero), or the tighter of the value model's
        `ErrorBound` around refsim's value and the allowed set, element by element
        (`conformance.strategies._sharded_allowed.refine`)."""
        from conformance.strategies._sharded_allowed import refine

        pols = self.value_model_tolerances()
        return refine(self, as_outputs(self.__dict__["_refsim_out"]), pols,
                      [kind != "exact" for kind, _ in self.policies])

    def value_model_tolerances(self) -> list:
        """Per output: exact (either sign of a zero), or an `ErrorBound` around refsim's value
        (the value model alone: what a run of an exported bundle, which has no jaxpr, holds it to)."""
        if "_refsim_out" not in self.__dict__:
            self.run(refsim)
        outs = as_outputs(self.__dict__["_refsim_out"])
        pols = []
        for out, (kind, value) in zip(outs, self.policies):
            if kind == "exact":
                pols.append(Exact(signed_zero=False))
            elif kind == "abs":
                pols.append(ErrorBound.around(out, 2 * value, "the value model's error bound, both sides"))
            else:
                scale = max([float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
                             for x in (np.asarray(s.data, np.float64) for s in out.shards)] + [1.0])
                pols.append(ErrorBound.around(out, value * scale, f"{value:.3g} x the largest |value| of a derivative"))
        return pols

    def repro(self, expected=None, tolerances=None) -> str:
        """The v1 reproducer, set up for this program's partitioner (its axis types are the mesh's)."""
        text = super().repro(expected, tolerances)
        if self.donate_argnums:
            text = text.replace("return jax.jit(program, in_shardings=",
                                f"return jax.jit(program, donate_argnums={self.donate_argnums!r}, in_shardings=", 1)
        in_kinds, out_kinds = _stated_kinds(self)
        if in_kinds or out_kinds:   # the jit's own shardings in memory kinds (the host_offload class)
            text = text.replace("IN_SHARDINGS = ", f"IN_MEMORY_KINDS = {in_kinds!r}\nOUT_MEMORY_KINDS = "
                                                   f"{out_kinds!r}\nIN_SHARDINGS = ", 1)
            text = text.replace(
                "outs = named(OUT_SHARDINGS) if isinstance(OUT_SHARDINGS, P) else tuple(map(named, OUT_SHARDINGS))",
                "outs = tuple(named(s).with_memory_kind(k) for s, k in zip(OUT_SHARDINGS, OUT_MEMORY_KINDS))", 1)
            text = text.replace("in_shardings=tuple(map(named, IN_SHARDINGS))",
                                "in_shardings=tuple(named(s).with_memory_kind(k) for s, k in "
                                "zip(IN_SHARDINGS, IN_MEMORY_KINDS))", 1)
        if self.program_class == "jit_chain_orders":
            text = _chain_repro(self, text)
        head = "from jax.sharding import PartitionSpec as P\n"
        extra = ""
        if self.partitioner == "gspmd":
            extra += "jax.config.update('jax_use_shardy_partitioner', False)   # the case ran under GSPMD\n"
        # an Explicit mesh is written as AXIS_TYPES by the v1 format itself (conformance.cases.repro)
        return text.replace(head, head + extra, 1)

    def describe(self) -> str:
        return (super().describe() + f"\npartitioner:  {self.partitioner}\naxis types:   {self.axis_types}\n"
                f"transform:    {self.transform}\nclass:        {self.program_class}")


# -- drawing ----------------------------------------------------------------------------------------
def _exact_data(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    """Exact-friendly data as `conformance.strategies.arrays` draws it (k * 2**e, |k| <= 16, e >= -2)."""
    if dtype == BOOL:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype == I32:
        return rng.integers(-16, 17, size=shape).astype(np.int32)
    return (rng.integers(-16, 17, size=shape) * 2.0 ** rng.integers(-2, 1, size=shape)).astype(np.float32)


def _arg_shape(b: Builder, spec: tuple, max_elements: int) -> tuple:
    """A shape that `spec` divides (jit in_shardings must), sides small, size-1 dims possible."""
    shape = []
    budget = max_elements
    for k, ax in enumerate(spec):
        n = b.axis_size(ax)
        rest = len(spec) - k - 1
        top = max(1, budget // (n * 2 ** rest))
        mult = b.draw_int(1, min(3, top)) if n > 1 else b.draw_int(1, min(6, max(1, budget // 2 ** rest)))
        shape.append(n * mult)
        budget = max(1, budget // (n * mult))
    return tuple(shape)


def _sinks(lines: list, names: list) -> list:
    """The values no later line reads (the program's live results)."""
    out = []
    for i, line in enumerate(lines):
        name = line.split(" = ", 1)[0]
        for nm in [n.strip() for n in name.split(",")]:
            if not any(re.search(rf"\b{nm}\b", later.split(' = ', 1)[1]) for later in lines[i + 1:]):
                out.append(nm)
    return [n for n in out if n in names]


@st.composite
def _draw(draw, mesh_s, ops, min_ops, max_ops, max_inputs, max_elements, transforms, axis_types, partitioners,
          dtypes, classes=("plain",)):
    m: Mesh = draw(mesh_s)
    types = draw(st.sampled_from(axis_types))
    explicit = types == "explicit"
    if explicit:
        m = Mesh(m.axis_sizes, m.axis_names, device_ids=m.device_ids, axis_types=(AxisType.Explicit,) * m.ndim)
    drawable = [c for c in classes if c != "shard_map_nested" or m.ndim >= 2] or ["plain"]
    klass = draw(st.sampled_from(drawable)) if len(drawable) > 1 else drawable[0]
    choices = [t for t in transforms if not (explicit and t == "vmap")] or ["none"]
    if klass in BACKWARD_CLASSES and F32 in dtypes and {"grad", "vjp"} & set(choices):
        choices = [t for t in choices if t in ("grad", "vjp")]   # remat / custom_vjp act in the backward pass
    if klass == "jit_chain_orders":
        choices = ["none"]   # top-level calls: no transform wraps them
    transform = draw(st.sampled_from(choices))
    backward = transform in ("grad", "vjp")
    usable = [o for o in ops if not (backward and o in NOT_DIFFERENTIABLE)] or list(ops)
    if klass == "shard_map_nested" and explicit:
        # inside a manual region JAX refuses a reduced value combined with a constant (jax 0.10: an
        # AssertionError, 0.12: "Inputs cannot be replicated on the same axes that another input is
        # reduced on"), which these two ops draw: the default run on 0.10.2 at seed 30, the 0.12 hunts
        usable = [o for o in usable if o not in ("unreduced_add", "reduced_dot")] or usable
        if backward:
            # the pullback of `x.at[idx].get(out_sharding=...)` in a manual region closes over its
            # Explicit-typed indices: JAX raises NotImplementedError on 0.10 and 0.12 alike ("Closing
            # over inputs to shard_map where the input is sharded on `Explicit` axes"), and without
            # out_sharding a ShardingTypeError; the 0.12 shard_map_nested hunt drew three such programs
            usable = [o for o in usable if o != "at_get"] or usable
    manual = ()
    gmesh = m
    if klass == "shard_map_nested":   # g runs inside a manual region over `manual`, drawn over the other axes
        names = list(draw(st.permutations(m.axis_names)))
        manual = tuple(names[:draw(st.integers(1, m.ndim - 1))])
        rest = [a for a in m.axis_names if a not in manual]
        gmesh = Mesh(tuple(m.axis_size(a) for a in rest), tuple(rest),
                     axis_types=tuple(m.axis_types[m.axis_names.index(a)] for a in rest))
    b = Builder(draw, gmesh, explicit=explicit, backward=backward, max_elements=max_elements, op_names=usable)
    whole = b if gmesh is m else Builder(draw, m, explicit=explicit, backward=backward, max_elements=max_elements,
                                         op_names=usable)
    length = draw(st.integers(1, 4)) if klass == "scan_layers" else 1

    # inputs: specs first, then shapes they divide (jit's in_shardings must divide)
    n_in = draw(st.integers(1, max_inputs))
    batch = draw(st.integers(1, 3)) if transform == "vmap" else None
    arg_dtypes, in_specs, body_shapes, full_shapes, in_axes = [], [], [], [], []
    for i in range(n_in):
        dt = draw(st.sampled_from(dtypes))
        if i == 0 and backward and F32 in dtypes:
            dt = F32
        rank = draw(st.integers(0, 4))
        if rank == 4:
            rank = draw(st.integers(3, 4))
        spec = b.draw_spec((0,) * rank, dividing=False)
        stacked = klass == "scan_layers" and i > 0
        body = _arg_shape(b, spec, max_elements // ((batch or 1) * (length if stacked else 1)) or 1)
        outer = pc.stacked_spec(_klass_stub(klass, manual), i, spec)
        shape = ((length,) + body if stacked else (body[0] * pc.manual_size(m, manual),) + body[1:]
                 if manual and body else body)
        full_spec, ax = outer, None
        if batch is not None and (i == 0 or draw(st.booleans())):
            ax = draw(st.integers(0, len(shape)))
            free = [a for a in m.axis_names if all(a not in s for s in outer) and batch % m.axis_size(a) == 0]
            bspec = (draw(st.sampled_from(free)),) if free and draw(st.booleans()) else ()
            full_spec = outer[:ax] + (bspec,) + outer[ax:]
            shape = shape[:ax] + (batch,) + shape[ax:]
        arg_dtypes.append(dt)
        in_specs.append(full_spec)
        full_shapes.append(shape)
        body_shapes.append(body)
        in_axes.append(ax)
        b.add_arg(f"a{i}", body, dt, spec)

    # the op graph, with sharding constraints / reshards at drawn points
    n_ops = draw(st.integers(min_ops, max_ops))
    for _ in range(n_ops):
        if draw(st.integers(0, 3)) == 0:
            a = b.pick(lambda x: not x.manual)
            if explicit:
                b.reshard(a, b.draw_spec(a.shape, dividing=True))
            else:
                b.constrain(a, b.draw_spec(a.shape, dividing=False, allow_unconstrained=True))
        for _attempt in range(8):
            name = draw(st.sampled_from(usable))
            b.kinked = name in KINKED
            if OPS[name](b):
                break
    computed = [x.name for x in b.pool if not x.name.startswith("a")]
    outs_names = _sinks(b.lines, computed) or [b.pool[-1].name]
    outs_names = outs_names[-4:]
    outs = [next(x for x in b.pool if x.name == nm) for nm in outs_names]

    fargs = [i for i, dt in enumerate(arg_dtypes) if dt == F32]
    if backward and (not fargs or not any(x.dtype == F32 for x in outs)):
        transform = "none"
    graph = Graph(helpers=tuple(b.helpers.items()), lines=tuple(b.lines), line_ops=tuple(b.used),
                  outs=tuple((x.name, x.shape, x.dtype, x.err) for x in outs),
                  args=tuple((dt, body_shapes[i], in_axes[i]) for i, dt in enumerate(arg_dtypes)),
                  batch=batch, transform=transform)
    graph = dataclasses.replace(graph, program_class=_draw_class(draw, whole, klass, graph, in_specs, manual,
                                                                 length))
    source, policies, final, op_patterns = assemble(graph)
    if klass == "host_offload":   # the jit's own in/out shardings in drawn memory kinds
        kinds = st.sampled_from(pc.MEMORY_KINDS)
        in_kinds = tuple(draw(kinds) for _ in arg_dtypes)
        out_kinds = tuple(draw(kinds) for _ in final)
        graph = dataclasses.replace(graph, program_class=graph.program_class + (("in_kinds", in_kinds),
                                                                                ("out_kinds", out_kinds)))

    # layouts and data
    part = draw(st.sampled_from(partitioners))
    in_sh = tuple(NamedSharding(m, _pspec(s)) for s in in_specs)
    out_sh = tuple(NamedSharding(m, _pspec(whole.draw_spec(shape, dividing=True))) for shape, _ in final)
    if klass == "donation":   # an output XLA may write into a donated buffer: same shape, dtype and sharding
        free = list(pc.params(graph.program_class)["donated"])
        out_sh = list(out_sh)
        for k, (shape, dt) in enumerate(final):
            i = next((i for i in free if tuple(full_shapes[i]) == tuple(shape) and arg_dtypes[i] == dt), None)
            if i is not None and draw(st.integers(0, 3)):
                out_sh[k] = in_sh[i]
                free.remove(i)
        out_sh = tuple(out_sh)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    data = tuple(_exact_data(rng, s, dt) for s, dt in zip(full_shapes, arg_dtypes))
    return make_case(graph, mesh=m, args=data, in_shardings=in_sh, out_shardings=out_sh, partitioner=part,
                     axis_types=types)


_PPERMUTE_AXES = re.compile(r"\bppermute\([^,]+, \(")


def _klass_stub(klass: str, manual: tuple) -> tuple:
    return (klass, ("manual", manual)) if klass == "shard_map_nested" else (klass,)


def _draw_class(draw, b: Builder, klass: str, graph: "Graph", in_specs: list, manual: tuple, length: int) -> tuple:
    """The drawn program class with its parameters (`conformance.strategies._program_classes`)."""
    if klass == "scan_layers":
        return (klass, ("length", length), ("carry_spec", _g_spec(in_specs[0], graph.args[0][2])),
                ("explicit", b.explicit))
    if klass == "remat":
        policy = draw(st.sampled_from(("none",) + _compat.remat_policies()))
        live = [graph.lines[i].split(" = ", 1)[0] for i in live_lines(graph)]
        live = [nm for nm in live if "," not in nm]
        names = tuple(draw(st.lists(st.sampled_from(live), unique=True, max_size=4))) if live else ()
        return (klass, ("policy", policy), ("prevent_cse", draw(st.booleans())), ("names", names))
    if klass == "custom_vjp":
        return (klass, ("mode", draw(st.sampled_from(pc.VJP_MODES))))
    if klass == "host_offload":
        n = len(graph.args)
        host = tuple(i for i in range(n) if draw(st.booleans()))
        on, _why = _compat.compute_on_host()
        use = on if on is not None and draw(st.integers(0, 3)) == 0 else ""
        outs = draw(st.booleans()) or not host   # something goes through host memory
        return (klass, ("host_args", host), ("host_outs", outs), ("compute_on", use))
    if klass == "shard_map_nested":
        return (klass, ("manual", manual), ("manual_size", pc.manual_size(b.mesh, manual)), ("explicit", b.explicit),
                ("arg_specs", tuple(_g_spec(s, a[2]) for s, a in zip(in_specs, graph.args))))
    if klass == "donation":
        n = len(graph.args)
        donated = tuple(sorted(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))))
        return (klass, ("donated", donated), ("specs", tuple(_g_spec(in_specs[i], graph.args[i][2]) for i in donated)),
                ("explicit", b.explicit))
    if klass == "jit_chain":
        carry = graph.args[0]
        shapes = [carry[1]] + [s for _, s, _, _ in graph.outs]
        steps = tuple(tuple(spec_text(b.draw_spec(s, dividing=True)) for s in shapes)
                      for _ in range(draw(st.integers(2, 3))))
        return (klass, ("steps", steps), ("carry_spec", _g_spec(in_specs[0], carry[2])), ("explicit", b.explicit))
    if klass == "jit_chain_orders":
        shapes = [graph.args[0][1]] + [s for _, s, _, _ in graph.outs]
        n = draw(st.integers(2, 3))
        steps = tuple(tuple(b.draw_spec(s, dividing=True) for s in shapes) for _ in range(n))
        ids = [int(i) for i in np.asarray(b.mesh.device_ids).ravel()]
        # a ppermute over a tuple of axes needs them in mesh order (jax 0.11+ raise otherwise, 0.9 / 0.10
        # permute wrongly: docs/found-bugs.md 38): such a program keeps the mesh's axis order
        fixed = any(_PPERMUTE_AXES.search(line) for line in graph.lines)
        orders = tuple((tuple(b.mesh.axis_names) if fixed else tuple(draw(st.permutations(b.mesh.axis_names))),
                        tuple(draw(st.permutations(ids)))) for _ in range(n - 1))
        return (klass, ("steps", steps), ("orders", orders), ("carry_spec", in_specs[0]), ("explicit", b.explicit))
    return (klass,)


def _g_spec(full_spec: tuple, vmap_axis) -> tuple:
    """The spec of g's argument inside a vmap (the batch dimension dropped)."""
    spec = tuple(full_spec)
    return spec if vmap_axis is None else spec[:vmap_axis] + spec[vmap_axis + 1:]


# -- a drawn graph as source text -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Graph:
    """A drawn program before it is text: `g`'s body `lines` (with the (op, sharding pattern) of
    each in `line_ops`), its outputs (name, shape, dtype, error bound), its arguments (dtype,
    shape inside `g`, vmap axis or None), the vmap batch size and the transform `f` applies."""

    helpers: tuple
    lines: tuple
    line_ops: tuple
    outs: tuple
    args: tuple
    batch: int | None
    transform: str
    #: how `g` is called: (class name, (param, value), ...), see `conformance.strategies._program_classes`
    program_class: tuple = ("plain",)


def _assigned(line: str) -> list:
    return [n.strip() for n in line.split(" = ", 1)[0].split(",")]


def live_lines(graph: Graph) -> list:
    """Indices of the lines the outputs depend on (dead code dropped, as XLA would drop it)."""
    need = {name for name, *_ in graph.outs}
    keep = []
    for i in range(len(graph.lines) - 1, -1, -1):
        line = graph.lines[i]
        if need & set(_assigned(line)):
            keep.append(i)
            need |= set(re.findall(r"\b[av]\d+\b", line.split(" = ", 1)[1]))
    return sorted(keep)


def _policy(err: float) -> tuple:
    if err == 0:
        return ("exact", 0.0)
    return ("abs", err) if math.isfinite(err) else ("rel", GRAD_RTOL)


def assemble(graph: Graph) -> tuple:
    """(source, policies, output (shape, dtype) list, (op, pattern) of the live lines) of `graph`."""
    keep = live_lines(graph)
    lines = [graph.lines[i] for i in keep]
    op_patterns = tuple(graph.line_ops[i] for i in keep)
    n_in = len(graph.args)
    args = ", ".join(f"a{i}" for i in range(n_in))
    wrapped = pc.wrap(graph.program_class, tuple(lines), tuple((dt, s) for dt, s, _ in graph.args), graph.outs)
    body = "\n".join("    " + ln for ln in wrapped.lines)
    ret = ", ".join(name for name, *_ in graph.outs) + ("," if len(graph.outs) == 1 else "")
    text = "\n".join(lines)
    src = [h for name, h in graph.helpers if re.search(rf"\b{name}\(", text)]
    src.append(f"def g({args}):\n{body}\n    return ({ret})\n")
    if wrapped.source:
        src.append(wrapped.source)
    g = wrapped.fn
    outs = wrapped.outs
    h_args = tuple((dt, s, ax) for (dt, s), (_, _, ax) in zip(wrapped.args, graph.args))
    policies, final = [], []
    fargs = [i for i, (dt, _, _) in enumerate(graph.args) if dt == F32]
    fouts = [k for k, (_, _, dt, _) in enumerate(outs) if dt == F32]
    if graph.transform == "none":
        src.append(f"def f({args}):\n    return {g}({args})\n")
        for _, shape, dt, err in outs:
            policies.append(_policy(err))
            final.append((shape, dt))
    elif graph.transform == "vmap":
        axes = tuple(ax for _, _, ax in graph.args)
        src.append(f"def f({args}):\n    return jax.vmap({g}, in_axes={axes!r})({args})\n")
        for _, shape, dt, err in outs:
            policies.append(_policy(err))
            final.append(((graph.batch,) + tuple(shape), dt))
    else:
        dargs = ", ".join(f"a{i}" for i in fargs)
        if graph.transform == "grad":
            terms = " + ".join(
                f"jnp.sum(o[{k}] * (jnp.arange({math.prod(outs[k][1])}, dtype=jnp.float32)"
                f".reshape({tuple(outs[k][1])!r}) % 3 + 1))" for k in fouts) or "jnp.float32(0)"
            src.append(f"def f({args}):\n    def loss({dargs}):\n        o = {g}({args})\n        return {terms}\n"
                       f"    return jax.grad(loss, argnums={tuple(range(len(fargs)))!r})({dargs})\n")
        else:
            picks = ", ".join(f"o[{k}]" for k in fouts)
            src.append(f"def f({args}):\n    def h({dargs}):\n        o = {g}({args})\n        return ({picks},)\n"
                       f"    outs, pull = jax.vjp(h, {dargs})\n    return outs + pull(outs)\n")
            for k in fouts:
                policies.append(_policy(outs[k][3]))
                final.append((outs[k][1], F32))
        for i in fargs:
            policies.append(("rel", GRAD_RTOL))
            final.append((h_args[i][1], F32))
    return "\n\n".join(src), tuple(policies), final, op_patterns


def make_case(graph: Graph, *, mesh, args, in_shardings, out_shardings, partitioner, axis_types) -> "ShardedProgram":
    """The `ShardedProgram` of `graph` with these layouts and data."""
    source, policies, final, op_patterns = assemble(graph)
    if len(out_shardings) != len(final):
        raise ValueError(f"out_shardings has {len(out_shardings)} entries for {len(final)} outputs.")
    labels = (("ops", "+".join(dict.fromkeys(op for op, _ in op_patterns)) or "none"),
              *((("class", graph.program_class[0]),) if graph.program_class[0] != "plain" else ()),
              ("transform", graph.transform), ("types", axis_types), ("partitioner", partitioner))
    donate = tuple(pc.params(graph.program_class)["donated"]) if graph.program_class[0] == "donation" else ()
    if graph.program_class[0] == "jit_chain_orders":   # each output where its call put it
        meshes = pc.chain_meshes(graph.program_class, mesh)
        specs = pc.chain_specs(graph.program_class, len(graph.outs))
        out_shardings = (NamedSharding(meshes[-1], _pspec(specs[-1][0])),) + tuple(
            NamedSharding(meshes[k], _pspec(sp)) for k in range(len(specs)) for sp in specs[k][1:])
    in_kinds, out_kinds = pc.memory_kinds(graph.program_class)
    in_shardings = pc.with_memory_kinds(tuple(in_shardings), in_kinds)
    out_shardings = pc.with_memory_kinds(tuple(out_shardings), out_kinds)
    return ShardedProgram(family="sharded", source=source, entry="jit", mesh=mesh, args=tuple(args),
                          in_shardings=tuple(in_shardings), out_shardings=tuple(out_shardings), labels=labels,
                          outputs=("exact",) * len(policies), partitioner=partitioner, transform=graph.transform,
                          axis_types=axis_types, policies=policies, op_patterns=op_patterns, graph=graph,
                          donate_argnums=donate)


_JIT_RUN = """    if KIND == "jit":
        outs = named(OUT_SHARDINGS) if isinstance(OUT_SHARDINGS, P) else tuple(map(named, OUT_SHARDINGS))
        with jax.set_mesh(mesh):
            return jax.jit(program, in_shardings=tuple(map(named, IN_SHARDINGS)), out_shardings=outs)(*args)
"""
_CHAIN_RUN = """    if KIND == "jit":   # jit_chain_orders: `program` jitted on each mesh of CHAIN, values moved by device_put
        args, outs = [jax.device_put(a, named(s)) for a, s in zip(args, IN_SHARDINGS)], []
        devs = {d.id: d for d in jax.devices()}
        for k, (names, ids, specs) in enumerate(CHAIN):
            shape = tuple(MESH_SHAPE[AXIS_NAMES.index(a)] for a in names)
            grid = np.array([devs[int(i)] for i in ids], dtype=object).reshape(shape)
            types = globals().get("AXIS_TYPES")
            kw = {} if types is None else {"axis_types": tuple(getattr(jax.sharding.AxisType, types[0])
                                                               for _ in names)}
            m = jax.sharding.Mesh(grid, names, **kw)
            on = lambda s, m=m: jax.sharding.NamedSharding(m, s)
            ins = tuple(map(on, IN_SHARDINGS))
            if k:   # into the next call's shardings: another layout on another device order
                args = [jax.device_put(a, s) for a, s in zip(args, ins)]
            with jax.set_mesh(m):
                o = jax.jit(program, in_shardings=ins, out_shardings=tuple(map(on, specs)))(*args)
            args[0], outs = o[0], outs + list(o[1:])
        return (args[0], *outs)
"""


def _chain_repro(case, text: str) -> str:
    """The v1 reproducer of a ``jit_chain_orders`` case: CHAIN (per call: axis names, device ids in
    row-major order, out specs) and a `run` that makes the calls as `ShardedProgram.run` does."""
    meshes = pc.chain_meshes(case.graph.program_class, case.mesh)
    steps = pc.chain_specs(case.graph.program_class, len(case.graph.outs))
    rows = [f"    ({tuple(m.axis_names)!r}, {[int(i) for i in np.asarray(m.device_ids).ravel()]!r}, "
            f"({''.join(spec_text(sp) + ', ' for sp in specs)})),"
            for m, specs in zip(meshes, steps)]
    if _JIT_RUN not in text:
        raise AssertionError("the v1 reproducer's jit block changed; update _JIT_RUN")
    text = text.replace(_JIT_RUN, _CHAIN_RUN, 1)
    return text.replace("IN_SHARDINGS = ", "CHAIN = [\n" + "\n".join(rows) + "\n]\nIN_SHARDINGS = ", 1)


def _stated_kinds(case) -> tuple:
    """(in, out) memory kinds of `case`'s jit shardings, or ((), ()) where all are device memory."""
    kind = lambda s: getattr(s, "memory_kind", None) or "device"  # noqa: E731
    ins = tuple(kind(s) for s in case.in_shardings)
    outs = tuple(kind(s) for s in case.out_shardings)
    return ((), ()) if set(ins + outs) <= {"device"} else (ins, outs)


def _pspec(spec: tuple) -> PartitionSpec:
    return PartitionSpec(*[None if not ax else ax[0] if len(ax) == 1 else tuple(ax) for ax in spec])


def sharded_programs(mesh=None, *, ops=tuple(OPS), min_ops: int = 1, max_ops: int = 6, max_inputs: int = 2,
                     max_elements: int = 256, transforms=TRANSFORMS, axis_types=AXIS_TYPES, partitioners=None,
                     dtypes=SHARDED_DTYPES, max_devices: int = 8,
                     classes=("plain",)) -> st.SearchStrategy[ShardedProgram]:
    """Random well-typed sharded programs (`ShardedProgram`, a jit `conformance.cases.Program`).

    mesh: a refsim Mesh, a strategy drawing one, or None for `meshes(max_devices=max_devices)`
    (1-4 axes, sizes 1, 2, 3, 4, 5, 8, every device order). ops: names from `OPS` the graph
    draws from (each program draws `min_ops`..`max_ops` of them, plus sharding constraints at
    drawn points); max_inputs: arguments per program; max_elements: the largest array size;
    transforms: "none", "grad", "vjp", "vmap"; axis_types: "auto", "explicit" (sharding in
    types: reshards and ``out_sharding=`` instead of constraints); partitioners: "shardy",
    "gspmd" (default: those the installed JAX has, `refsim.compat.partitioners`); dtypes of the
    arguments: "float32", "int32", "bool"; classes: how the graph is called (`CLASSES`: "plain",
    "scan_layers", "remat", "custom_vjp", "custom_jvp", "host_offload", "shard_map_nested",
    "jit_chain", "donation", "jit_chain_orders"; docs/strategies.md, "Program classes"). Shrinks towards one op
    on one small argument.

    >>> sharded_programs(ops=("cumsum", "pad"), max_ops=2).example().case_id  # doctest: +SKIP
    'sharded[ops=with_sharding_constraint+cumsum,transform=none,types=auto,partitioner=gspmd,dtype=float32,mesh=2x3:default]'
    """
    if mesh is None:
        v.check_int("max_devices", max_devices, min_value=1)
        mesh_s = meshes(max_devices=max_devices)
    else:
        mesh_s = _check_mesh(mesh)
    names = v.check_options("ops", ops, tuple(OPS))
    v.check_int("min_ops", min_ops, min_value=1)
    v.check_int("max_ops", max_ops, min_value=1, max_value=64)
    v.check_order("min_ops", min_ops, "max_ops", max_ops)
    v.check_int("max_inputs", max_inputs, min_value=1, max_value=8)
    v.check_int("max_elements", max_elements, min_value=1, max_value=2 ** 16)
    trs = v.check_options("transforms", transforms, TRANSFORMS)
    tys = v.check_options("axis_types", axis_types, AXIS_TYPES)
    have = _compat.partitioners()
    parts = have if partitioners is None else v.check_options("partitioners", partitioners, ("shardy", "gspmd"))
    for p in parts:
        if p not in have:
            raise InvalidArgument(f"partitioners contains {p!r}, which this JAX cannot switch to (it has {have}); "
                                  f"pass partitioners={have!r} or leave it None.")
    dts = v.check_options("dtypes", dtypes, SHARDED_DTYPES)
    kls = v.check_options("classes", classes, CLASSES)
    if kls == ("shard_map_nested",) and mesh is not None and not v.is_strategy(mesh) and mesh.ndim < 2:
        raise InvalidArgument(f"classes=('shard_map_nested',) needs a mesh of at least 2 axes (one manual, one "
                              f"for the nested region), got {mesh!r}; pass a 2-axis mesh or add another class.")
    if kls == ("shard_map_nested",) and mesh is None:
        mesh_s = meshes(min_axes=2, max_devices=max_devices)   # one manual axis and one for g's own regions
    if trs == ("vmap",) and tys == ("explicit",):
        raise InvalidArgument("transforms=('vmap',) with axis_types=('explicit',) draws nothing: vmap programs use "
                              "Auto axes; add 'auto' to axis_types or another transform.")
    if set(trs) <= {"grad", "vjp"} and F32 not in dts:
        raise InvalidArgument(f"transforms={trs!r} differentiate float32 arguments, but dtypes={dts!r} has none; "
                              "add 'float32' to dtypes.")
    if set(names) <= {"with_sharding_constraint"} and tys == ("explicit",) or \
            set(names) <= {"reshard"} and tys == ("auto",):
        raise InvalidArgument(f"ops={names!r} cannot be drawn with axis_types={tys!r}: with_sharding_constraint "
                              "is drawn on Auto meshes and reshard on Explicit ones; add the other op or axis type.")
    return _draw(mesh_s, names, min_ops, max_ops, max_inputs, max_elements, trs, tys, parts, dts, kls)
