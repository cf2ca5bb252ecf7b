"""`conformance.check(fn, *args)`: run one call of your own program on refsim and on the live
XLA platform, and compare every output device by device.

    import conformance
    result = conformance.check(train_step, params, batch)          # jax.jit / shard_map / pmap
    result = conformance.check(f, x, mesh=mesh, in_specs=P('x'), out_specs=P())  # plain function
    print(result.report())

`fn` is any JAX callable: built with `jax.shard_map`, `jax.pmap`, or `jax.jit` (with
shardings), or a plain function plus ``mesh=``/``in_specs=``/``out_specs=`` (run as
``jax.jit(jax.shard_map(fn, ...))``) or ``in_shardings=``/``out_shardings=`` (run as
``jax.jit(fn, ...)``). Arguments are placed as given (jax.Arrays keep their shardings); with
a mesh or in_shardings, NumPy arguments are laid out by the specs first. The comparison
policy is `conformance.oracle.policy` (docs/oracle.md). On a disagreement `ConformanceError`
is raised; its message is the mismatch report and `.repro_path` a standalone reproducer.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
import time
from typing import Any

import numpy as np

import refsim
from conformance import validation
from conformance.cases import spec_source
from conformance.oracle import intercept
from conformance.oracle import platform_notes
from conformance.oracle import policy as policy_mod
from conformance.oracle import program as prog
from conformance.oracle import factorizations, reproduce, vectors
from conformance.oracle.program import NotCheckable
from conformance.verdict import allowed as allowed_mod
from conformance.verdict import compare
from conformance.verdict.elements import abs_diff, is_float
from refsim import array as refsim_array
from refsim import compat
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import PartitionSpec
from xla_backend import convert, staging

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

__all__ = ["DEFAULT_TIMEOUT", "CheckResult", "CheckTimeout", "ConformanceError", "NotCheckable", "OutputSummary",
           "XlaError", "check"]

# Seconds `check` waits for XLA's results by default (as `python -m conformance run`'s case timeout).
DEFAULT_TIMEOUT = 300.0


_UNDECIDABLE = re.compile(r"(\d+) undecidable \(")


@dataclasses.dataclass(frozen=True)
class OutputSummary:
    """One output: its shape, dtype, devices, the policy applied, where its layout came from
    ("program": stated by out_specs/out_shardings, "xla": unstated, XLA's), and the largest
    |xla - refsim| over its devices next to the largest difference the policy allows."""

    index: int
    shape: tuple
    dtype: str
    devices: int
    policy: str
    placement: str
    max_abs_diff: float
    allowed: float
    path: str = ""
    ulps: float | None = None

    def line(self) -> str:
        allowed = "0 (exact)" if self.allowed == 0 else f"{self.allowed:.3g}"
        used = "" if self.ulps is None else f" ({self.ulps:.3g} ulp of max|output|)"
        name = f"output {self.index}" + (f" {self.path}" if self.path else "")
        return (f"{name}: {self.dtype}{list(self.shape)} on {self.devices} devices, layout from "
                f"{self.placement}, policy {self.policy}; max |diff| {self.max_abs_diff:.3g}{used}, allowed {allowed}")


@dataclasses.dataclass
class CheckResult:
    """The outcome of `check`: `ok`, the comparison, per-output summaries, provenance and timings."""

    name: str
    entry: str
    comparison: compare.ComparisonResult
    outputs: list
    provenance: dict
    seconds: dict
    repro_path: str | None = None
    notes: list = dataclasses.field(default_factory=list)  # platform_notes: likely documented causes
    #: the allowed set's lines (conformance.verdict.allowed): per output its verdict counts and
    #: worst |xla - exact| / bound, outputs without a bound rule, the relaxations used
    bounds: list = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.comparison.ok

    def __bool__(self) -> bool:
        return self.ok

    @property
    def policies(self) -> list[str]:
        return [o.policy for o in self.outputs]

    @property
    def undecidable(self) -> int:
        """Elements the allowed set could not decide (a comparison or branch closer than its operands'
        bounds): not judged, so an AGREE does not cover them and the report's first line says so."""
        return sum(int(m.group(1)) for b in self.bounds for m in [_UNDECIDABLE.search(b)] if m)

    def report(self) -> str:
        head = "AGREE" if self.ok else "DISAGREE"
        if self.undecidable:
            head += f" ({self.undecidable} element(s) undecidable, not judged)"
        p = self.provenance
        lines = [f"{head}: {self.name} ({self.entry}) on {p.get('platform')} with {p.get('devices')} devices, "
                 f"jax {p.get('jax_version')}; refsim {'independent' if p.get('independent') else 'used JAX fallback'}"]
        lines += ["  " + o.line() for o in self.outputs]
        lines += ["  " + b for b in self.bounds]
        if not self.ok:
            c = self.comparison
            lines.append(f"  MISMATCH ({len(c.mismatches)} found) in {c.outputs} output(s), {c.devices} device "
                         f"shard(s), {c.elements} element(s)")
            lines += compare.mismatch_lines(c.mismatches, 8)
        lines += ["  " + n for n in self.notes]
        if self.repro_path:
            lines.append(f"  reproducer: python {self.repro_path}")
        return "\n".join(lines)

    __str__ = report


class ConformanceError(AssertionError):
    """refsim and XLA disagree on a call; the message is the mismatch report.

    `.result` is the `CheckResult`; `.repro_path` the standalone reproducer (None when the
    program could not be located for one, with the reason in the message).
    """

    def __init__(self, result: CheckResult, note: str = "", explain: str = ""):
        self.result = result
        self.repro_path = result.repro_path
        self.note = note
        #: the last line of the message: where `conformance.explain` localised the disagreement
        #: ("explain: diverged in compiler at stablehlo.scatter (op #12)"), or "" when not run
        self.explain = explain
        #: the `conformance.debug.explain.Explanation` behind that line (None when not run or not finished)
        self.explanation = None
        super().__init__(result.report() + (f"\n  {note}" if note else "") + (f"\n  {explain}" if explain else ""))


def _jax_runtime_error():
    import jax

    return jax.errors.JaxRuntimeError


class XlaError(ConformanceError, RuntimeError):
    """XLA failed on a call refsim traced: it could not compile the program (`stage` "compiler":
    a verifier rejection, a failing pass, a RET_CHECK) or run it (`stage` "backend").

    A `ConformanceError` (the call does not conform: XLA must compile and run what JAX lowers)
    and, through `check`, an instance of `jax.errors.JaxRuntimeError` as well, so code that
    caught XLA's exception still does. `unsupported` is True when XLA says the platform does not
    implement an op (UNIMPLEMENTED) rather than failing on it; `error` is XLA's exception; there
    is no `result` and no reproducer (`repro_path` None): `conformance.explain(fn, *args)` shows
    which stage fails.
    """

    def __init__(self, message: str, *, stage: str, error: BaseException | None = None,
                 unsupported: bool = False, name: str = ""):
        AssertionError.__init__(self, message)
        self._message = message
        self.stage, self.error, self.unsupported, self.name = stage, error, unsupported, name
        self.result = None
        self.repro_path = None

    def __str__(self) -> str:  # JAX's exception class formats its own fields; this message is ours
        return self._message


_XLA_ERROR_TYPES: dict = {}


def xla_error(e: BaseException, name: str) -> XlaError:
    """The classified `XlaError` for XLA's exception `e` raised while compiling or running `name`."""
    runtime = _jax_runtime_error()
    cls = _XLA_ERROR_TYPES.get(runtime)
    if cls is None:  # one subclass per JAX: XlaError and JAX's own exception class
        cls = _XLA_ERROR_TYPES[runtime] = type("XlaError", (XlaError, runtime), {"__module__": __name__,
                                                                                 "__doc__": XlaError.__doc__})
    stage = "compiler" if getattr(e, "xla_stage", None) == "compiler" else "backend"
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    unsupported = "UNIMPLEMENTED" in text
    what = "compile" if stage == "compiler" else "run"
    kind = "the platform does not implement an op of it" if unsupported else f"{stage} crash"
    msg = (f"XLA failed to {what} {name} ({kind}): {type(e).__name__}: {first}\n  refsim traced the call; nothing "
           f"was compared. conformance.explain(fn, *args, ...) shows the stage that fails.")
    return cls(msg, stage=stage, error=e, unsupported=unsupported, name=name)


class CheckTimeout(TimeoutError):
    """XLA did not finish a checked call within `check`'s timeout (a device-side infinite loop, a
    collective waiting for a peer). XLA cannot cancel a running computation: it keeps running
    in the background, holding its devices, and this process cannot exit normally until it ends
    (end the process, e.g. ``os._exit(1)``, once the timeout is reported).
    `.name` is the program, `.timeout` the seconds waited."""

    def __init__(self, name: str, timeout: float):
        self.name, self.timeout = name, timeout
        super().__init__(
            f"check: XLA did not finish {name} within timeout={timeout:g} s (a device-side infinite loop, or a "
            "collective waiting for a peer?). The computation cannot be cancelled: it keeps running in the "
            "background and holds its devices, and this process will not exit normally until it ends; end it "
            "(e.g. os._exit(1)) once this is reported. Pass a larger timeout= if the call is only slow.")


def wait_for_xla(out, name: str, timeout: float | None) -> None:
    """Return when every jax.Array in `out` is computed; `CheckTimeout` after `timeout` seconds
    (None: wait as long as it takes). Polls `jax.Array.is_ready` from this thread: a thread
    blocked in XLA would abort the interpreter at exit, and JAX dispatches asynchronously, so
    the call itself returns at once."""
    import jax

    if timeout is None:
        jax.block_until_ready(out)
        return
    pending = [x for x in jax.tree_util.tree_leaves(out) if callable(getattr(x, "is_ready", None))]
    deadline, pause = time.monotonic() + timeout, 0.0005
    while True:
        pending = [x for x in pending if not x.is_ready()]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise CheckTimeout(name, timeout)
        time.sleep(pause)
        pause = min(0.05, pause * 2)


# -- building the callable -------------------------------------------------------------------------
def _layout(mesh, in_specs, out_specs, check_vma, axis_names, in_shardings, out_shardings):
    """The staging layout the keyword arguments ask for, or None: call `fn` as given."""
    import jax

    spec_mode = mesh is not None or in_specs is not None or out_specs is not None
    shard_mode = in_shardings is not None or out_shardings is not None
    if spec_mode and shard_mode:
        raise ValueError("check: pass either mesh=/in_specs=/out_specs= (shard_map) or "
                         "in_shardings=/out_shardings= (jit), not both.")
    if spec_mode:
        missing = [n for n, v in (("mesh", mesh), ("in_specs", in_specs), ("out_specs", out_specs)) if v is None]
        if missing:
            raise ValueError(f"check: shard_map mode needs mesh=, in_specs= and out_specs=; missing {', '.join(missing)}.")
        if not isinstance(mesh, (Mesh, jax.sharding.Mesh)):
            raise TypeError(f"check: mesh={mesh!r} must be a jax.sharding.Mesh or refsim.Mesh; build one with "
                            "jax.make_mesh(shape, names).")
        # As the user would write it: jax.jit(jax.shard_map(...)), outputs as XLA lays them out,
        # no context mesh.
        return staging.Layout.shard_map(mesh, in_specs, out_specs, check_vma=check_vma, axis_names=axis_names,
                                        pin_outputs=False, use_mesh=False)
    if shard_mode:
        # Arguments without an in_sharding are passed as given (Python scalars stay weakly typed).
        return staging.Layout.jit(in_shardings, out_shardings, place_unsharded=False)
    return None


def _build(fn, args, mesh, in_specs, out_specs, check_vma, axis_names, in_shardings, out_shardings):
    """(callable, placed args, wrap description for the reproducer, mesh context or None, entry)."""
    import jax

    layout = _layout(mesh, in_specs, out_specs, check_vma, axis_names, in_shardings, out_shardings)
    if layout is None:
        return fn, tuple(args), None, None, _entry_of(fn)
    staged = staging.stage(fn, layout, tuple(args))
    w = staged.wrapped
    is_p = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    if layout.entry == "shard_map":
        src = lambda t: reproduce._tree_source(  # noqa: E731
            jax.tree_util.tree_map(lambda s: None if s is None else PartitionSpec.from_jax(s), t,
                                   is_leaf=staging.is_spec), spec_source, is_p)
        wrap = {"kind": "'shard_map'", "mesh": repr(reproduce._mesh_desc(w.jax_mesh)), "in_specs": src(w.jax_in),
                "out_specs": src(w.jax_out), "check_vma": repr(bool(check_vma)),
                "axis_names": repr(None if axis_names is None else tuple(axis_names))}
        return staged.call, staged.args, wrap, None, "shard_map"
    ctx = w.jax_mesh
    wrap = None
    if ctx is not None:
        spec_of = lambda t: reproduce._tree_source(  # noqa: E731
            jax.tree_util.tree_map(lambda s: None if s is None else PartitionSpec.from_jax(s.spec), t,
                                   is_leaf=staging.is_sharding), spec_source, is_p)
        wrap = {"kind": "'jit'", "mesh": repr(reproduce._mesh_desc(ctx)), "in_shardings": spec_of(w.jax_in),
                "out_shardings": spec_of(w.jax_out)}
    return staged.call, staged.args, wrap, ctx, "jit"


def _entry_of(fn) -> str:
    kind = type(fn).__name__
    if kind == "PjitFunction" or (hasattr(fn, "lower") and hasattr(fn, "trace")):
        return "jit"
    name = getattr(fn, "__qualname__", "") or ""
    if "pmap" in name or kind == "PmapFunction":
        return "pmap"
    return "function"


def _name(fn) -> str:
    inner = intercept.unwrapped(fn)
    mod = getattr(inner, "__module__", None) or ""
    qual = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(fn).__name__
    return f"{mod}.{qual}" if mod and mod != "__main__" else qual


_DIFF_BLOCK = 1 << 20  # elements per block of _max_diff: small float64 temporaries, reused


def _max_diff(e, a) -> float:
    """The largest finite |xla - refsim| over the devices (a complex element: its larger part's,
    as the part-by-part policies measure it), in blocks of leading-axis rows (small reused
    temporaries, as compare's)."""
    worst = 0.0
    sa = {int(s.device_id): np.asarray(s.data) for s in a.shards}
    for s in e.shards:
        y = sa.get(int(s.device_id))
        x = np.asarray(s.data)
        # bfloat16 / float8 arrays are of kind "V"
        if y is None or y.shape != x.shape or not (is_float(x.dtype) or x.dtype.kind in "iub") or x.size == 0:
            continue
        if compare.bits_equal(x, y):    # every finite difference is 0: nothing above `worst`
            continue
        x, y = (x.reshape((1,)), y.reshape((1,))) if x.ndim == 0 else (x, y)
        step = max(1, _DIFF_BLOCK // max(1, x.size // x.shape[0]))
        for i in range(0, x.shape[0], step):
            d = abs_diff(x[i:i + step], y[i:i + step])
            d = d[np.isfinite(d)]
            if d.size:
                worst = max(worst, float(d.max()))
    return worst


def _summaries(ref, xla, pols, where, paths, indices=None, cmp=None) -> list:
    """One summary per compared output; `indices`: each one's place among all outputs. With the
    comparison `cmp`, an output held exactly that has no mismatch differs by 0 (every element
    equal, or NaN on both sides): it is not read again."""
    out = []
    differing = None if cmp is None else {m.output for m in cmp.mismatches}
    for k, (e, a, p) in enumerate(zip(ref, xla, pols)):
        scaled = isinstance(p, (policy_mod.ScaledBound, allowed_mod.AllowedSet))
        allowed = float(p.allowed(e.dtype)) if scaled else 0.0
        exact_ok = differing is not None and -1 not in differing and k not in differing and isinstance(p, compare.Exact)
        diff = 0.0 if exact_ok else _max_diff(e, a)
        out.append(OutputSummary(k if indices is None else indices[k], tuple(e.shape), str(np.dtype(e.dtype)),
                                 len(e.shards), p.describe(), where[k] if k < len(where) else "xla", diff, allowed,
                                 paths[k] if k < len(paths) else "", p.ulps_of(diff, e.dtype) if scaled else None))
    return out


# -- float0 outputs ----------------------------------------------------------------------------------
FLOAT0_POLICY = "shape only (float0 carries no data)"


def _is_float0(x) -> bool:
    import jax

    return getattr(x, "dtype", None) == jax.dtypes.float0


def _replace_jaxpr(closed, **changes):
    """`closed` with its jaxpr's fields changed (JAX < 0.11 nests a Jaxpr in a ClosedJaxpr;
    later JAX's Jaxpr carries its consts itself and is its own `.jaxpr`)."""
    j = closed.jaxpr
    new = j.replace(**changes)
    return new if j is closed else closed.replace(jaxpr=new)


def _keep_result_paths(dbg, keep):
    paths = getattr(dbg, "result_paths", None)
    if not isinstance(paths, tuple) or not hasattr(dbg, "_replace"):
        return dbg
    return dbg._replace(result_paths=tuple(paths[k] for k in keep if k < len(paths)))


def _without_outputs(closed, drop: set):
    """`closed` without the outputs at positions `drop`, removed through the top-level jit
    equations (and their out_shardings / out_layouts) that `program.refsim_outputs` looks
    through, so the stated layouts of the other outputs still apply."""
    j = closed.jaxpr
    keep = [k for k in range(len(j.outvars)) if k not in drop]
    eqns = list(j.eqns)
    if (len(eqns) == 1 and eqns[0].primitive.name in ("jit", "pjit")
            and list(eqns[0].outvars) == list(j.outvars)):
        e = eqns[0]
        params = dict(e.params, jaxpr=_without_outputs(e.params["jaxpr"], drop))
        for key in ("out_shardings", "out_layouts"):
            if isinstance(params.get(key), tuple) and len(params[key]) == len(j.outvars):
                params[key] = tuple(params[key][k] for k in keep)
        eqns = [e.replace(params=params, outvars=[e.outvars[k] for k in keep])]
    return _replace_jaxpr(closed, eqns=eqns, outvars=[j.outvars[k] for k in keep],
                          debug_info=_keep_result_paths(j.debug_info, keep))


def _float0_summaries(traced, flat_out, drop, paths) -> list:
    """float0 outputs (tangents of integer inputs) hold no data: JAX builds them on the host
    from the traced type, nothing runs on XLA. They are checked by shape against the trace."""
    avals = traced.closed.out_avals
    out = []
    for k in sorted(drop):
        shape = tuple(np.shape(flat_out[k]))
        if k < len(avals) and tuple(avals[k].shape) != shape:
            raise NotCheckable("float0 output", f"output {k}: XLA's shape {shape}, traced {tuple(avals[k].shape)}")
        out.append(OutputSummary(k, shape, "float0", 0, FLOAT0_POLICY, "host", 0.0, 0.0,
                                 paths[k] if k < len(paths) else ""))
    return out


_NON_FINITE = frozenset({"nan-introduced", "nan-dropped", "inf"})


def _max_abs_float(values) -> float:
    """The largest finite |x| over the floating inputs (refsim.Arrays or ndarrays); 0 if none."""
    worst = 0.0
    for v in values:
        datas = [s.data for s in v.shards] if hasattr(v, "shards") else [v]
        for d in datas:
            d = np.asarray(d)
            if d.size and (is_float(d.dtype) and d.dtype.kind in "fcV"):
                with np.errstate(invalid="ignore", over="ignore"):
                    a = np.abs(d.astype(np.complex128 if d.dtype.kind == "c" else np.float64))
                a = a[np.isfinite(a)]
                if a.size:
                    worst = max(worst, float(a.max()))
    return worst


def _numerically_unstable(inputs, ref, pols, cmp) -> str:
    """Why a disagreement is no verdict, or "": a floating output whose refsim value grew past
    1/u times the largest input (rounding differences amplified beyond the dtype's precision,
    e.g. a conjugate-gradient loop on a singular operator) differs by NaN or infinity on XLA's
    side. Its other outputs (an iteration count) follow from it, so the call is not checkable."""
    biggest = _max_abs_float(inputs)
    if biggest <= 0:
        return ""
    for k, (r, p) in enumerate(zip(ref, pols)):
        if not isinstance(p, policy_mod.ScaledBound):
            continue
        classes = {c for m in cmp.mismatches if m.output == k for c in m.classes}
        limit = biggest / compare.unit_roundoff(r.dtype)
        if classes & _NON_FINITE and p.scale >= limit:
            return (f"output {k}: max|refsim| {p.scale:.3g} is {p.scale / biggest:.3g} times the largest input, "
                    f"past 1/u = {1 / compare.unit_roundoff(r.dtype):.3g} of {np.dtype(r.dtype)}; XLA: "
                    f"{', '.join(sorted(classes & _NON_FINITE))}")
    return ""


def _provenance(ref) -> dict:
    import jax

    info = dict(getattr(ref[0], "info", {}) or {}) if ref else {}
    devs = jax.devices()
    return {"platform": devs[0].platform, "devices": len(devs), "jax_version": jax.__version__,
            "independent": bool(info.get("independent", True)),
            **({"replication": info["replication"]} if info.get("replication") else {})}


def _await(out) -> None:
    """Wait until XLA has computed every array of `out` (JAX dispatches asynchronously): the
    time until then is XLA's, and `finish` reports it as "xla_wait", apart from its own phases.
    An execution failure raises here, as it would where the arrays are read."""
    import jax

    for x in jax.tree_util.tree_leaves(out):
        if callable(getattr(x, "block_until_ready", None)):
            x.block_until_ready()


# -- the one-call check ------------------------------------------------------------------------------
def prepare(call, args: tuple, kwargs: dict, seconds: dict | None = None):
    """Trace the call and take host copies of its inputs (before XLA runs, which may donate
    them). Raises NotCheckable when refsim cannot replay it. `seconds`, when given, gets the
    time spent on the host copies ("host_inputs")."""
    traced = prog.trace(call, args, kwargs)
    prog.check_replayable(traced)
    t0 = time.perf_counter()
    prog.take_host_copies(traced)
    if seconds is not None:
        seconds["host_inputs"] = time.perf_counter() - t0
    return traced


def finish(traced, out, *, name: str, entry: str, policy="auto", ulps: int = policy_mod.DEFAULT_ULPS,
           seconds=None):
    """refsim's side of a call whose XLA result is `out`: evaluate, choose policies, compare.

    Returns (CheckResult, refsim outputs, policies); NotCheckable when refsim cannot evaluate it.
    float0 outputs are checked by shape only and left out of refsim's outputs and the policies.
    """
    import jax

    t0 = time.perf_counter()
    flat_out, paths = jax.tree_util.tree_leaves(out), prog.output_paths(out)
    drop = {k for k, x in enumerate(flat_out) if _is_float0(x)}
    indices = [k for k in range(len(flat_out)) if k not in drop]
    extra = []
    if drop:
        extra = _float0_summaries(traced, flat_out, drop, paths)
        stated = None if traced.stated_out is None else [traced.stated_out[k] for k in indices]
        traced = dataclasses.replace(traced, closed=_without_outputs(traced.closed, drop), stated_out=stated)
        out, paths = [flat_out[k] for k in indices], [paths[k] for k in indices if k < len(paths)]
    t_wait = time.perf_counter()
    _await(out)
    t_host = time.perf_counter()
    xla = prog.xla_outputs(out)
    t_ref = time.perf_counter()
    conditions = factorizations.Conditions()
    try:
        ref, where = prog.refsim_outputs(traced, xla, probe=conditions)
        kinds = [compat.unreduced_kind_of(getattr(getattr(x, "sharding", None), "spec", None))
                 for x in jax.tree_util.tree_leaves(out)]
        ref, xla, where = prog.sum_unreduced(traced, ref, xla, where, kinds)
    except NotCheckable:
        raise
    except Exception as e:  # noqa: BLE001 - a refsim-side failure is reported, never hidden
        raise NotCheckable("refsim error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    t_pol = time.perf_counter()
    mode, policy = policy, ("auto" if isinstance(policy, str) and policy in policy_mod.AUTO_POLICIES else policy)
    pols = policy_mod.choose(ref, traced.primitives, policy, ulps)
    bound_notes, bounds_result = [], None
    if policy == "auto":
        xla, pols = vectors.apply(traced.closed, ref, xla, pols, ulps)
        pols = factorizations.apply(traced.closed, ref, xla, pols, conditions, ulps)
        pols, bound_notes, bounds_result = policy_mod.allowed_set(traced.closed, traced.flat_args, ref, pols, mode)
    t_cmp = time.perf_counter()
    cmp = compare.compare(ref, xla, tolerances=pols)
    if bounds_result is not None and not cmp.ok:
        pols, cmp = _explain_bounds(traced, ref, pols, xla, cmp, bounds_result)
    if policy == "auto" and not cmp.ok:
        why = _numerically_unstable(traced.flat_args, ref, pols, cmp)
        if why:
            raise NotCheckable("numerically unstable", why)
    t_sum = time.perf_counter()
    if prog.is_shard_map_program(traced) and entry != "pmap":
        entry = {"function": "shard_map", "jit": "jit(shard_map)"}.get(entry, entry)
    summaries = sorted(_summaries(ref, xla, pols, where, paths, indices, cmp) + extra, key=lambda o: o.index)
    t_end = time.perf_counter()
    secs = dict(seconds or {})
    secs.update(xla_wait=t_host - t_wait, host_outputs=t_ref - t_host, refsim=t_pol - t_ref, policy=t_cmp - t_pol,
                compare=t_sum - t_cmp, summaries=t_end - t_sum, refsim_and_compare=t_end - t0)
    res = CheckResult(name=name, entry=entry, comparison=cmp, outputs=summaries,
                      provenance=_provenance(ref), seconds=secs)
    res.notes = platform_notes.notes(res.provenance["platform"], traced.closed.jaxpr, res.ok)
    res.bounds = _bound_lines(pols, xla, paths, indices, bound_notes)
    return res, ref, pols


# -- the allowed set's report (conformance.verdict.allowed) ------------------------------------------
def _explain_bounds(traced, ref, pols, xla, cmp, result):
    """On a disagreement of an allowed-set output: which ops dominate the failing elements'
    bounds (a walk in explain mode), written into the policies' text and compared again
    (the verdict is the same; the mismatch text names the derivation)."""
    allowed = allowed_mod
    failing = {m.output for m in cmp.mismatches}
    if not any(isinstance(p, allowed.AllowedSet) and k in failing for k, p in enumerate(pols)):
        return pols, cmp
    try:
        texts = allowed.explain_disagreements(traced.closed, traced.flat_args, pols, xla,
                                              relaxations=result.relaxations)
    except Exception:  # noqa: BLE001 - the verdict stands without the derivation
        return pols, cmp
    if not texts:
        return pols, cmp
    pols = [dataclasses.replace(p, derivation=texts[k]) if k in texts else p for k, p in enumerate(pols)]
    return pols, compare.compare(ref, xla, tolerances=pols)


def _bound_lines(pols, xla, paths, indices, notes) -> list:
    lines = []
    for v in allowed_mod.verdicts(pols, xla):
        k = v.index
        idx = indices[k] if indices is not None and k < len(indices) else k
        v.index = idx
        lines.append(v.line(paths[k] if k < len(paths) else ""))
    return lines + list(notes)


# -- device_put: a reshard is data movement, exact ------------------------------------------------
def device_put_hosts(xs) -> list:
    """Each device_put input on the host (taken before XLA may donate it): its global value,
    or for an array unreduced over some mesh axes its devices' partial sums (a refsim.Array)."""
    import jax

    out = []
    for x in xs:
        if isinstance(x, jax.Array):
            prog.check_unreduced_kind(x)
            if getattr(getattr(x.sharding, "spec", None), "unreduced", None):
                try:
                    out.append(prog.host_array(x))
                except (TypeError, ValueError, NotImplementedError) as e:
                    raise NotCheckable("refsim error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
                continue
            if not x.is_fully_addressable:
                raise NotCheckable("multi-process array", "a device_put input spans devices of other processes")
            if compat.prng_impl_of(x.dtype) is not None:
                try:
                    out.append(np.asarray(prog.host_array(x)))   # refsim's structured key array
                    continue
                except TypeError:
                    out.append(compat.to_numpy(x))
                    continue
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
                raise NotCheckable("non-array argument", f"device_put of a {x.dtype} array")
        if isinstance(x, np.ndarray) and not isinstance(x, np.generic):
            # a NumPy value is not donated; it is read before the put returns: no copy
            out.append(x)
            continue
        out.append(_Host(np.array(x, copy=True), x) if _laid_out_on_mesh(x) else np.array(x, copy=True))
    return out


class _Host(np.ndarray):
    """A device_put input's global value that remembers the NamedSharding it was laid out by:
    moved into an unreduced layout, each device keeps what it held (`refsim.device_put`)."""

    def __new__(cls, value, x):
        obj = np.asarray(value).view(cls)
        obj.sharding = x.sharding
        return obj

    def __array_finalize__(self, obj):
        self.sharding = getattr(obj, "sharding", None)


def _laid_out_on_mesh(x) -> bool:
    """True when `x` is a jax.Array laid out by a NamedSharding over a concrete mesh."""
    import jax

    return isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.NamedSharding) and isinstance(x.sharding.mesh, jax.sharding.Mesh)


def finish_device_put(hosts, targets, ys) -> tuple[CheckResult, list]:
    """(result, refsim's arrays): `jax.device_put` of `hosts` (global values) to `targets` gave
    `ys`: each device must hold its block of the value, where the target states a NamedSharding
    laid out by it ("program"), else by the sharding XLA gave the result ("xla"). Exact."""
    import jax

    ref, xla, where = [], [], []
    t_wait = time.perf_counter()
    _await(ys)
    secs = {"xla_wait": time.perf_counter() - t_wait, "host_outputs": 0.0, "refsim": 0.0}
    for h, t, y in zip(hosts, targets, ys):
        t_a = time.perf_counter()
        t = getattr(t, "sharding", t)                         # a Format: its sharding
        stated = isinstance(t, jax.sharding.NamedSharding) and isinstance(t.mesh, jax.sharding.Mesh)
        prog.check_unreduced_kind(y)
        try:
            sh = convert.from_jax_sharding(t if stated else y.sharding)
            got = prog.host_array(y, copy=False)       # read in place: compared before the caller gets it
        except (TypeError, ValueError, NotImplementedError) as e:
            raise NotCheckable("output layout not comparable", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
        t_b = time.perf_counter()
        try:
            # an unreduced input keeps its partial sums; a _Host keeps the layout it had
            # read in place (refsim.array.put without a copy): `h` is read only until this check ends
            ref.append(refsim_array.put(h if h.dtype == got.dtype or isinstance(h, refsim.Array)
                                        else h.astype(got.dtype), sh, copy=False))
        except (ValueError, TypeError) as e:                # e.g. a target with unreduced axes
            raise NotCheckable("refsim error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
        secs["host_outputs"] += t_b - t_a
        secs["refsim"] += time.perf_counter() - t_b
        xla.append(got)
        where.append("program" if stated else "xla")
    pols = [compare.EXACT] * len(ref)
    t_cmp = time.perf_counter()
    cmp = compare.compare(ref, xla, tolerances=pols)
    t_sum = time.perf_counter()
    summaries = _summaries(ref, xla, pols, where, [""] * len(ref) if len(ref) == 1 else [f"[{k}]" for k in range(len(ref))],
                           cmp=cmp)
    secs.update(compare=t_sum - t_cmp, summaries=time.perf_counter() - t_sum)
    return CheckResult(name="device_put", entry="device_put", comparison=cmp, outputs=summaries,
                       provenance=_provenance(ref), seconds=secs), ref


# -- placements: one jax.Array assembled from values given per device -------------------------------
#: The placements oracle mode checks besides `jax.device_put` (`refsim.compat.PLACEMENT_CALLERS`).
PLACEMENTS = ("make_array_from_callback", "make_array_from_single_device_arrays", "device_put_sharded",
              "device_put_replicated")


def placement_hosts(values, devices) -> list:
    """[(device id, host copy)] of the values a placement puts on `devices` (one each, in order),
    taken before the placement runs."""
    out = []
    for v, d in zip(values, devices):
        data = np.asarray(v)
        out.append((int(d.id), np.array(data, copy=True)))
    return out


def finish_placement(api: str, sharding, shape, dtype, hosts, result) -> tuple[CheckResult, list]:
    """(result, refsim's array) of a placement `api` (`PLACEMENTS`) that made `result` from the
    per-device values `hosts` ([(device id, block)]) under `sharding`. Exact, device by device:

    * ``device_put_sharded(shards, devices)`` / ``device_put_replicated(x, devices)``: the stack of
      the blocks along a new leading axis (each block one row: a shard, or `x` itself) laid out by
      the sharding JAX builds (one row per device, devices in the order given): refsim's
      `device_put` of that global value;
    * ``make_array_from_callback`` / ``make_array_from_single_device_arrays``: device d holds the
      block given for d (the callback's value for d's index, the array that was on d), at the
      index refsim's layout gives d: `refsim.make_array_from_single_device_arrays`.

    `result` is the jax.Array JAX made, or, for `make_array_from_single_device_arrays`, the
    [(device id, block)] its device assignment holds (`_check_and_rearrange`'s order)."""
    try:
        sh = refsim_array.without_trailing_nones(convert.from_jax_sharding(sharding), len(tuple(shape)))
    except (TypeError, ValueError, NotImplementedError) as e:
        raise NotCheckable("output layout not comparable", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    dtype = np.dtype(compat.physical_dtype(dtype))
    blocks = {d: (h if h.dtype == dtype else h.astype(dtype)) for d, h in hosts}
    t0 = time.perf_counter()
    try:
        if api in ("device_put_sharded", "device_put_replicated"):
            ref = refsim_array.put(np.concatenate([blocks[d] for d, _ in hosts], axis=0), sh, copy=False)
        else:
            ref = refsim.make_array_from_single_device_arrays(tuple(shape), sh, blocks, dtype=dtype)
    except (ValueError, TypeError) as e:
        raise NotCheckable("refsim error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    t1 = time.perf_counter()
    if isinstance(result, list):
        xla = refsim.make_array_from_single_device_arrays(tuple(shape), sh, {d: np.asarray(b) for d, b in result},
                                                          dtype=dtype)
    else:
        _await([result])
        xla = prog.host_array(result, copy=False)
    t2 = time.perf_counter()
    pols = [compare.EXACT]
    cmp = compare.compare([ref], [xla], tolerances=pols)
    t3 = time.perf_counter()
    summaries = _summaries([ref], [xla], pols, ["program"], [""], cmp=cmp)
    secs = {"refsim": t1 - t0, "host_outputs": t2 - t1, "compare": t3 - t2, "summaries": time.perf_counter() - t3}
    return CheckResult(name=api, entry="placement", comparison=cmp, outputs=summaries,
                       provenance=_provenance([ref]), seconds=secs), [ref]


def write_device_put_reproducer(hosts, targets, ref, repro_dir) -> tuple[str | None, str]:
    """(path, note): the reproducer of a device_put that disagreed (`reproduce.device_put_source`)
    written to `repro_dir` (a folder or a function returning one), or (None, why it could not be)."""
    try:
        text = reproduce.device_put_source(hosts, targets, ref)
    except reproduce.NotReproducible as e:
        return None, f"no reproducer: {e}"
    directory = repro_dir() if callable(repro_dir) else repro_dir
    return reproduce.write(directory or tempfile.mkdtemp(prefix="conformance-device-put-"), "device_put", text), ""


def write_reproducer(fn, name, args, kwargs, ref, pols, wrap, repro_dir, traced=None,
                     out_shardings=None, prefix: str = "conformance-check-") -> tuple[str | None, str]:
    """(path, note): the reproducer written to `repro_dir`, or (None, why it could not be).

    The reproducer imports `fn` from its module when it has a module-level name; else (a
    closure, a local, a JAX-internal function, `fn` None) it holds the program `traced` as
    `jax.export` serialized it, with `out_shardings` (XLA's outputs' shardings). `repro_dir`: a
    folder, a function returning one, or None: a fresh temporary folder named `prefix`...,
    made only when there is a reproducer to write (no empty folders are left behind)."""
    text, why = None, []
    if fn is not None:
        try:
            text = reproduce.source(fn, name, args, kwargs, ref, pols, wrap=wrap)
        except reproduce.NotReproducible as e:
            why.append(str(e))
    if text is None and traced is not None:
        try:
            text = reproduce.exported_source(traced, name, ref, pols, out_shardings)
        except reproduce.NotReproducible as e:
            why.append(str(e))
    if text is None:
        return None, "no reproducer: " + ("; ".join(why) or "nothing to rebuild the program from")
    directory = repro_dir() if callable(repro_dir) else repro_dir
    return reproduce.write(directory or tempfile.mkdtemp(prefix=prefix), name, text), ""


def _run_xla(call, placed, kwargs, label):
    """`call(*placed, **kwargs)` on XLA; XLA's own failure is raised as a classified `XlaError`."""
    with compat.tag_compile_errors():
        try:
            return call(*placed, **kwargs)
        except _jax_runtime_error() as e:
            raise xla_error(e, label) from e


def check(fn, *args, mesh=None, in_specs=None, out_specs=None, check_vma: bool = True, axis_names=None,
          in_shardings=None, out_shardings=None, policy="auto", ulps: int = policy_mod.DEFAULT_ULPS,
          repro_dir: str | None = None, name: str | None = None, timeout: float | None = DEFAULT_TIMEOUT,
          **kwargs) -> CheckResult:
    """Run ``fn(*args, **kwargs)`` on XLA and on refsim and compare every output, device by device.

    Returns a `CheckResult` when they agree; raises `ConformanceError` (message: the mismatch
    report; `.repro_path`: a standalone reproducer written to `repro_dir`, default a fresh
    temporary folder) when they disagree, and `NotCheckable` (`.reason`) when refsim cannot
    replay the program (a host callback, side effects, a primitive refsim has no rule for).
    XLA failing to compile or run the call raises `XlaError` (a ConformanceError and a
    jax.errors.JaxRuntimeError; `.stage` "compiler" or "backend").
    An exception of the program itself (``fn(*args)`` raises it under JAX too) reaches the
    caller as itself. `policy`: "auto" (exact where the result is exact, else ``ulps`` units of
    roundoff of the output's largest magnitude; docs/oracle.md), "exact", or `conformance.verdict.compare`
    policies. `timeout`: seconds to wait for XLA's results (default `DEFAULT_TIMEOUT`; None: no
    limit), else `CheckTimeout` naming the program (the computation keeps running: see there).
    The public `conformance.check` (`conformance.debug.explain.on_check.check`) adds
    `explain=` / `explain_timeout=`: the message of a disagreement ends with explain's stage and op.
    Other keyword arguments are passed to `fn`.
    """
    import jax

    validation.check_seconds("timeout", timeout, none=True, what="seconds to wait for XLA's results",
                             none_means="for no limit")
    call, placed, wrap, ctx_mesh, entry = _build(fn, args, mesh, in_specs, out_specs, check_vma, axis_names,
                                                 in_shardings, out_shardings)
    label = name or _name(fn)
    scope = jax.set_mesh(ctx_mesh) if ctx_mesh is not None else contextlib.nullcontext()
    with scope, intercept.unchecked():          # in oracle mode, not checked a second time
        t0 = time.perf_counter()
        untraceable, host = None, {}
        try:
            traced = prepare(call, placed, kwargs, host)
        except NotCheckable as e:
            if e.reason != "trace failed":
                raise
            untraceable = e
        if untraceable is not None:
            # The program's own error (a bug in fn, a bad argument) is what the call raises under
            # JAX too: the caller gets it as itself, from the call. A call that runs works eagerly
            # but cannot be traced to one jaxpr: not checkable.
            wait_for_xla(call(*placed, **kwargs), label, timeout)
            raise untraceable
        t1 = time.perf_counter()
        out = _run_xla(call, placed, kwargs, label)
        try:
            wait_for_xla(out, label, timeout)
        except _jax_runtime_error() as e:  # an execution failure surfaces when the results are awaited
            raise xla_error(e, label) from e
        t2 = time.perf_counter()
        res, ref, pols = finish(traced, out, name=label, entry=entry, policy=policy, ulps=ulps,
                                seconds={"trace": t1 - t0 - host.get("host_inputs", 0.0), **host, "xla": t2 - t1})
    if res.ok:
        return res
    xla_out_shardings = [getattr(x, "sharding", None) for x in jax.tree_util.tree_leaves(out)]
    path, note = write_reproducer(fn, label, placed, kwargs, ref, pols, wrap, repro_dir, traced=traced,
                                  out_shardings=xla_out_shardings)
    res.repro_path = path
    raise ConformanceError(res, note)
