"""Find the equation where XLA and refsim first disagree, by compiling prefixes of the program.

The search runs over cuts of the region's equation list. The cut after equation k is
checked by compiling the first k+1 equations, unchanged, as one XLA program that returns
the values live across the cut (those a later equation or the output reads) and equation
k's own outputs, and comparing them device by device with refsim's. Before any equation
the cut is the program's arguments (the same data on both sides); after the last it holds
the outputs. Binary search finds adjacent cuts k-1 (all equal) and k (some value differs):
equation k read equal inputs and produced a different value, so it is a diverging
equation, in about log2(n) + 1 compiles. When no divergence is masked later in the
program it is the first one. A prefix XLA fails on (a compile error, or a fatal CHECK that ends
the worker process the default runner compiles in) counts as differing, so the search ends at
the first equation whose inclusion makes XLA fail (`Divergence.crash`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from conformance import validation
from conformance.debug import diff, naming
from conformance.debug import region as region_mod
from conformance.debug.explain import tolerance as T
from conformance.debug.region import (Region, Runner, XlaCrash, as_global, is_probeable, isolated_runner,
                                     refsim_values, trace)
from conformance.debug.region import trace_called
from conformance.oracle.policy import rounds
from conformance.oracle.program import primitive_names
from refsim import compat as _compat


@dataclasses.dataclass(frozen=True)
class ValueReport:
    """One variable compared on every device."""

    name: str
    aval: str
    devices: dict  # device id -> diff.DeviceDiff

    @property
    def matched(self) -> bool:
        return all(d.matched for d in self.devices.values())

    @property
    def differing(self) -> list[int]:
        return sorted(dev for dev, d in self.devices.items() if not d.matched)

    @property
    def max_ulp(self) -> float:
        return max((d.max_ulp for d in self.devices.values()), default=0.0)

    @property
    def max_abs(self) -> float:
        return max((d.max_abs for d in self.devices.values()), default=0.0)


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """An input of the diverging equation: its name, type, layout and where it came from."""

    name: str
    aval: str
    layout: str
    source: str


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The diverging equation: position, primitive, params, source line, inputs and outputs."""

    index: int
    eqn: Any
    text: str
    source: str
    inputs: tuple
    outputs: tuple
    crash: str | None = None

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    @property
    def params(self) -> dict:
        return dict(self.eqn.params)

    @property
    def devices(self) -> dict[int, bool]:
        """device id -> True where every output of the equation matched on that device."""
        out: dict[int, bool] = {}
        for r in self.outputs:
            for dev, d in r.devices.items():
                out[dev] = out.get(dev, True) and d.matched
        return out

    @property
    def affected(self) -> list[int]:
        return sorted(dev for dev, ok in self.devices.items() if not ok)


@dataclasses.dataclass(frozen=True)
class Step:
    """One compiled prefix: the cut after equation `k` (-1: the arguments) and what it found
    (`crash`: XLA's failure on that prefix, which counts as differing)."""

    k: int
    values: int
    differs: bool
    crash: str | None = None


@dataclasses.dataclass(frozen=True)
class BisectResult:
    """The outcome: `ok` when both sides agree, else the `divergence`, with the search log."""

    region: Region
    names: Any
    n_eqns: int
    divergence: Divergence | None
    steps: tuple
    outputs: tuple
    max_ulp: float = 0
    tolerance: str = "exact"  # the rule values were held to, in words

    @property
    def ok(self) -> bool:
        return self.divergence is None

    @property
    def compiles(self) -> int:
        return len(self.steps)

    def report(self, *, max_devices: int = 4) -> str:
        """A text report: the verdict, the equation, its inputs' layouts, each device's match."""
        from conformance.debug import picture

        mesh = self.region.mesh
        if self.ok:
            return (f"MATCH: refsim and XLA agree on all {len(self.outputs)} output(s) of the "
                    f"{self.region.kind} program ({self.n_eqns} equations, mesh {dict(mesh.shape)}).")
        d = self.divergence
        head = (f"CRASH: XLA fails on the program once it includes equation #{d.index} (counting from 0) of "
                f"{self.n_eqns} (found with {self.compiles} compiled prefixes): {d.crash}" if d.crash else
                f"MISMATCH: first diverging equation is #{d.index} (counting from 0) of {self.n_eqns} "
                f"(found with {self.compiles} compiled prefixes; tolerance: {self.tolerance})")
        lines = [
            head,
            f"  primitive: {d.primitive}",
            f"  source:    {d.source or '(unknown)'}",
            "  equation:  " + d.text.replace("\n", "\n             "),
            "  params:",
        ]
        lines += [f"    {k} = {v!r}" for k, v in sorted(d.params.items()) if k != "jaxpr"]
        lines.append("  inputs (equal on every device at the cut before it):")
        lines += [f"    {i.name}: {i.aval}  layout {i.layout}  from {i.source}" for i in d.inputs] or ["    (none)"]
        for r in d.outputs:
            nd = len(r.devices)
            if r.matched:
                lines.append(f"  output {r.name}: {r.aval} matches on all {nd} devices")
                continue
            lines.append(f"  output {r.name}: {r.aval} differs on {len(r.differing)} of {nd} devices "
                         f"{r.differing}; max ULP {r.max_ulp:g}, max abs error {r.max_abs:g}")
            lines.append(picture.render(mesh, r, metric="ulp", format="text").rstrip())
            lines += diff.device_lines(r, self.max_ulp, max_devices)
        lines.append("  devices: " + ", ".join(f"{dev}:{'ok' if ok else 'DIFF'}"
                                               for dev, ok in sorted(d.devices.items())))
        lines.append("  search: " + ", ".join(
            f"{'args' if s.k < 0 else f'#{s.k}'} {'crashes' if s.crash else 'differs' if s.differs else 'equal'}"
            for s in self.steps))
        return "\n".join(lines)

    __str__ = report


def bisect(fn, *args, mesh=None, in_specs=None, out_specs=None, check_vma: bool = True, in_shardings=None,
           out_shardings=None, runner: Runner | None = None, max_ulp: float = 0,
           tolerance: str = "auto", policy: str = "auto") -> BisectResult:
    """Run `fn` on refsim and on XLA; when they differ, find the first diverging equation.

    With `in_specs`/`out_specs` the program is `jax.shard_map(fn, mesh=mesh, ...)` and the
    search runs over its body, per device; with `in_shardings`/`out_shardings` (or a mesh
    alone) it is `jax.jit(fn, ...)` over global values. Without layout keywords `fn` runs as
    given, as `conformance.check` takes it: already under `jax.jit` / `jax.shard_map`
    (`region.trace_called`), its jax.Array arguments where they are placed. `mesh` is a
    jax.sharding.Mesh or a refsim Mesh. `runner(region, args)` compiles and runs a prefix
    (default `isolated_runner`: real XLA on the mesh's devices, in a worker process, so a fatal
    XLA CHECK is reported as the prefix XLA cannot take; `xla_runner` runs in this process);
    tests pass a broken one.
    Values are compared by `tolerance` (`conformance.debug.explain.tolerance`): "auto" (default) holds a
    value computed only by exact primitives (data movement, selection, max / min, conversions, ...)
    bit for bit and any other floating value to |xla - refsim| <= 256 units of roundoff of its
    largest magnitude (16 for narrow floats); "exact" holds every value bit for bit. `max_ulp` > 0
    instead accepts elements within that many ULP (ints / bools: unequal is a difference).
    With tolerance "auto", `policy` ("auto", "spec", "heuristic", as `conformance.check` and
    `conformance.explain` take it) also holds each floating value to the program's allowed set
    where that decides the element and is tighter (`AllowedCuts`).
    """
    validation.check("max_ulp", max_ulp, low=0, what="0: bit-exact, NaN equals NaN")
    if tolerance not in ("auto", "exact"):
        raise ValueError(f"tolerance={tolerance!r}; use 'auto' (exact where exact, else scaled to each value) or "
                         "'exact' (bit for bit).")
    if policy not in ("auto", "spec", "heuristic"):
        raise ValueError(f"policy={policy!r}; use 'auto' (the allowed set under the platform's declared "
                         "relaxations), 'spec' (the allowed set without them) or 'heuristic' (256 ulps of max|value|).")
    if mesh is None and in_specs is None and out_specs is None and in_shardings is None and out_shardings is None:
        region, flat = trace_called(fn, args)
        return bisect_region(region, flat, runner=runner, max_ulp=max_ulp, tolerance=tolerance, policy=policy)
    region, flat = trace(fn, args, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma,
                         in_shardings=in_shardings, out_shardings=out_shardings)
    return bisect_region(region, flat, runner=runner, max_ulp=max_ulp, tolerance=tolerance, policy=policy)


def _rounded_vars(jaxpr) -> set:
    """The variables of `jaxpr` whose value may have been rounded: an output of an equation whose
    primitive (or a primitive of its sub-jaxprs) is not exact (`conformance.oracle.policy`), or
    that reads a rounded variable."""
    out: set = set()
    for e in jaxpr.eqns:
        prims = {e.primitive.name}
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    prims |= set(primitive_names(inner))
        if rounds(prims) or any(not _is_literal(v) and v in out for v in e.invars):
            out.update(v for v in e.outvars if type(v).__name__ != "DropVar")
    return out


def _bound(value: np.ndarray, rounded: bool, tolerance: str, max_ulp: float):
    """The allowed |xla - refsim| of one value: None (ULP / exact comparison) unless it rounds."""
    if max_ulp or tolerance == "exact" or not rounded or not T._floating(np.asarray(value).dtype):
        return None
    return T.allowed(np.asarray(value))


class AllowedCuts:
    """The allowed set of every value a cut compares (docs/comparison.md, "The allowed set"): the
    bound walk (`refsim.bounds`) over the program that returns every probed variable of the body,
    traced as `xla_runner` runs a prefix (shard_map values with the mesh dims in front), under the
    platform's declared relaxations ("auto") or the spec alone ("spec").

    `bound(v, ref, heuristic)` gives the per-element allowed |xla - refsim| of variable v (in
    `as_global` coordinates): where the walk decides the element and its bound is tighter than the
    heuristic's (`heuristic`; None: exact), the element's bound plus refsim's own distance from the
    center (so no result the set allows is refused; at most twice the bound); where undecidable,
    infinite (not judged); elsewhere the heuristic. None where the walk has no bound for v."""

    def __init__(self, centers: dict, bounds: dict, notes: list):
        self.centers, self.bounds, self.notes = centers, bounds, notes

    @classmethod
    def build(cls, region: Region, args, variables: list, policy: str, platform: str = "cpu") -> "AllowedCuts":
        from conformance.debug import region as R
        from conformance.oracle import program as oprog
        from refsim import bounds as rb
        from refsim.bounds import platform as bp
        from xla_backend import staging

        centers, bnds, notes = {}, {}, []
        if not variables:
            return cls(centers, bnds, notes)
        try:
            sub = region.prefix(len(region.jaxpr.eqns), variables)
            fn, out_specs = R._region_program(sub)
            layout = (staging.Layout.shard_map(region.mesh, tuple(region.in_layouts), out_specs,
                                               check_vma=region.check_vma) if out_specs is not None
                      else staging.Layout.jit(tuple(region.in_layouts), None))
            staged = staging.stage(fn, layout, tuple(args))
            with staged.context():
                traced = oprog.trace(staged.call, tuple(staged.args), {})
            flat = [np.asarray(a) for a in traced.flat_args]
            if policy != "spec":   # as conformance.check: the walk's cost is bounded unless the spec is asked for
                from conformance.oracle.policy import allowed_set_max_work
                from refsim.bounds.coverage import work_estimate

                work, limit = work_estimate(traced.closed), allowed_set_max_work()
                if work > limit:
                    return cls(centers, bnds, [f"allowed set not computed: its bound walk would take {work:.2g} "
                                               f"element operations, above {limit:.2g}: values held to the heuristic"])
            relax = frozenset() if policy == "spec" else bp.default_relaxations(platform)
            res = rb.evaluate(traced.closed, flat, relaxations=relax)
        except Exception as e:  # noqa: BLE001 - the heuristic still judges; the note says why
            notes.append(f"allowed set not computed ({type(e).__name__}: {str(e).splitlines()[0][:160]}): "
                         "values held to the heuristic")
            return cls(centers, bnds, notes)
        if len(res.outputs) != len(variables):
            return cls(centers, bnds, ["allowed set not computed: the walk's outputs do not match the values"])
        for v, out in zip(variables, res.outputs):
            if isinstance(out, rb.BVal) and out.floating:
                centers[v] = np.asarray(out.center, np.float64)
                bnds[v] = np.asarray(out.full_bound(), np.float64)
        return cls(centers, bnds, notes)

    def bound(self, v, ref: np.ndarray, heuristic: float | None):
        if v not in self.centers or np.shape(self.centers[v]) != np.shape(ref):
            return None
        c, b = self.centers[v], self.bounds[v]
        r = np.asarray(ref).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            und = np.isnan(b)
            tight = (b == 0) if heuristic is None else (b * _MARGIN <= heuristic)
            governed = ~und & tight
            room = b * _MARGIN + np.where(np.isfinite(r - c), np.abs(r - c), 0.0)
            other = 0.0 if heuristic is None else heuristic
            return np.where(governed, room, np.where(und, np.inf, other))


_MARGIN = 1 + 2.0 ** -40


def bisect_region(region: Region, args: Sequence[np.ndarray], *, runner: Runner | None = None,
                  max_ulp: float = 0, tolerance: str = "auto", policy: str = "auto") -> BisectResult:
    """`bisect` over an already traced Region and its flat arguments."""
    validation.check("max_ulp", max_ulp, low=0, what="0: bit-exact, NaN equals NaN")
    runner = runner or region_mod.planted_runner or isolated_runner   # a planted fault (conformance.faults.inject)
    jaxpr = region.jaxpr
    eqns = list(jaxpr.eqns)
    n = len(eqns)
    names = naming.Names(jaxpr)
    ref = refsim_values(region, args)
    live = _live_sets(jaxpr)
    rounded = _rounded_vars(jaxpr) if tolerance == "auto" and not max_ulp else set()
    words = (f"{max_ulp:g} ULP" if max_ulp else "bit-exact" if tolerance == "exact" or not rounded else
             "exact values bit-exact, rounded floats within 256 (float32) / 16 (narrow) roundoffs of max|value|")
    cuts = None
    if tolerance == "auto" and not max_ulp and policy != "heuristic":
        probed = list(dict.fromkeys(v for k in sorted(live) for v in live[k]))
        cuts = AllowedCuts.build(region, args, probed, policy)
        if cuts.centers:
            words += ("; floats also held to the allowed set " + ("without relaxations" if policy == "spec" else
                      "under the platform's declared relaxations") + " where it decides the element and is tighter")
        words += "".join(f"; {n}" for n in cuts.notes)
    steps: list[Step] = []
    cache: dict[int, list[ValueReport]] = {}

    crashes: dict[int, str] = {}

    def check(k: int) -> bool:
        if k not in cache:
            vars_ = live[k]
            reports: list[ValueReport] = []
            if vars_:
                try:
                    arrays = runner(region.prefix(k + 1, vars_), args)
                except XlaCrash as e:
                    crashes[k] = str(e)
                    cache[k] = []
                    steps.append(Step(k, len(vars_), True, str(e)))
                    return True
                if len(arrays) != len(vars_):
                    raise ValueError(f"runner returned {len(arrays)} values for {len(vars_)} probed variables; "
                                     "a runner must return one refsim.Array per outvar of the region it is given.")
                for v, arr in zip(vars_, arrays):
                    local = tuple(v.aval.shape) if region.kind == "shard_map" else None
                    glob = as_global(region, ref[v], v.aval)
                    bound = _bound(glob, v in rounded, tolerance, max_ulp)
                    if cuts is not None and not max_ulp and tolerance == "auto":
                        per = cuts.bound(v, glob, bound if v in rounded else None)
                        bound = bound if per is None else per
                    devs = diff.compare_shards(glob, arr, max_ulp, local, bound=bound)
                    reports.append(ValueReport(names[v], names.aval(v), devs))
            cache[k] = reports
            steps.append(Step(k, len(vars_), any(not r.matched for r in reports)))
        return k in crashes or any(not r.matched for r in cache[k])

    final = n - 1
    outputs_differ = check(final)
    out_reports = tuple(r for r in cache[final] if _is_outvar(r.name, jaxpr, names))
    if not outputs_differ:
        return BisectResult(region, names, n, None, tuple(steps), out_reports, max_ulp, words)
    lo, hi = -1, final
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid):
            hi = mid
        else:
            lo = mid
    div = _divergence(region, names, hi, cache[hi], cache.get(hi - 1), args)
    if hi in crashes:
        div = dataclasses.replace(div, crash=crashes[hi])
    return BisectResult(region, names, n, div, tuple(steps), out_reports, max_ulp, words)


def _is_outvar(name: str, jaxpr, names) -> bool:
    return any(names[v] == name for v in jaxpr.outvars if not _is_literal(v))


def _is_literal(v) -> bool:
    return hasattr(v, "val") and not hasattr(v, "count") and type(v).__name__ == "Literal"


def _live_sets(jaxpr) -> dict[int, list]:
    """For each cut k (-1..n-1): the probeable variables defined at or before equation k that a
    later equation or the output reads, plus equation k's own outputs, in definition order."""
    eqns = jaxpr.eqns
    n = len(eqns)
    last_use: dict = {}
    for j, e in enumerate(eqns):
        for v in e.invars:
            if not _is_literal(v):
                last_use[v] = j
    for v in jaxpr.outvars:
        if not _is_literal(v):
            last_use[v] = n
    defined: list[tuple[int, Any]] = [(-1, v) for v in jaxpr.invars]
    out: dict[int, list] = {-1: [v for v in jaxpr.invars if is_probeable(v)]}
    for k, e in enumerate(eqns):
        defined += [(k, v) for v in e.outvars if type(v).__name__ != "DropVar"]
        out[k] = [v for j, v in defined if is_probeable(v) and (j == k or last_use.get(v, -2) > k)]
    return out


def _divergence(region: Region, names, k: int, reports, before, args) -> Divergence:
    eqn = region.jaxpr.eqns[k]
    own = {names[v] for v in eqn.outvars if type(v).__name__ != "DropVar"}
    outputs = tuple(r for r in reports if r.name in own)
    producer = {}
    for j, e in enumerate(region.jaxpr.eqns[:k]):
        for v in e.outvars:
            producer[v] = j
    inputs = []
    for v in eqn.invars:
        if _is_literal(v):
            inputs.append(InputInfo(repr(v.val), names.aval(v), "literal (same on every device)", "a literal"))
            continue
        if v in producer:
            p = region.jaxpr.eqns[producer[v]]
            src = f"equation #{producer[v]} ({p.primitive.name})"
        elif v in region.jaxpr.invars:
            src = _argument_source(region, region.jaxpr.invars.index(v), args)
        else:
            src = "a constant"
        inputs.append(InputInfo(names[v], names.aval(v), _layout(region, names, v, before), src))

    return Divergence(k, eqn, names.eqn(eqn), _compat.eqn_source_line(eqn), tuple(inputs), outputs)


def _argument_source(region: Region, i: int, args) -> str:
    shape = tuple(np.shape(args[i]))
    lay = region.in_layouts[i]
    what = "in_spec" if region.kind == "shard_map" else "in_sharding"
    return f"argument {i} (global {np.asarray(args[i]).dtype}{list(shape)}, {what} {lay!r})"


def _layout(region: Region, names, v, before) -> str:
    """shard_map: the block each device holds and the axes it varies over (its vma); jit: where
    XLA placed the value at the cut before the equation (the device ids per block)."""
    if region.kind == "shard_map" and not region.check_vma:
        return f"per-device block {list(v.aval.shape)} (check_vma=False: no varying-axes type)"
    if region.kind == "shard_map":
        vma = sorted(_compat.aval_vma(v.aval), key=region.mesh.axis_names.index)
        axes = "(" + ", ".join(vma) + ")" if vma else "no axis (same block on every device)"
        return f"per-device block {list(v.aval.shape)}, varying over {axes}"
    for r in before or ():
        if r.name == names[v]:
            return "XLA placed " + ", ".join(f"dev {dev}: {_fmt_index(d.index)}"
                                             for dev, d in sorted(r.devices.items()))
    return "global value"


def _fmt_index(index) -> str:
    parts = []
    for i in index:
        if isinstance(i, slice):
            parts.append(":" if i.start is None and i.stop is None else f"{i.start or 0}:{i.stop}")
        else:
            parts.append(str(i))
    return "[" + ", ".join(parts) + "]"
