"""Calls, control flow and manual regions: the walk recurses into the sub-jaxprs.

A call (jit, closed_call, remat, custom_jvp / custom_vjp primal, composite, ...) is its body.
`cond` runs the branch (per device, the branches taken) its index picks; an undecidable index
makes every result undecidable. `while` iterates while the predicate's center holds; an
undecidable predicate makes every carry undecidable from there (the trip count is not
decided). `scan` steps its body. `shard_map` splits centers and bounds by in_specs
(`refsim.interpreter.rules.sharding`), runs the body with one mesh dim per axis, and tiles
the results by out_specs: replicas along an unnamed axis keep position 0's center and the
largest bound of any replica.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.bounds import values as V
from refsim.bounds.registry import register
from refsim.bounds.values import BVal, Unknown, dtype_of
from refsim.interpreter.rules import sharding as S


def _walk():
    from refsim.bounds import walk

    return walk


_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr", "call")


def _body(params):
    for key in _CALL_PARAMS:
        j = params.get(key)
        if j is not None and (hasattr(j, "eqns") or hasattr(getattr(j, "jaxpr", None), "eqns")):
            return j
    return None


@register("jit", "pjit", "closed_call", "call", "eval_jaxpr", "core_call", "remat2", "checkpoint",
          "custom_jvp_call", "custom_jvp_call_jaxpr", "custom_vjp_call", "composite", "compute_on",
          "custom_vmap_call", "program_order", "xla_metadata_call", "custom_partitioning", structural=True)
def _call(bctx, eqn, ins):
    body = _body(eqn.params)
    if body is None:
        return [Unknown(frozenset({eqn.primitive.name}))] * len(eqn.outvars)
    return _walk().run_sub(bctx, body, ins)


@register("polynomial", structural=True)
def _decomposed(bctx, eqn, ins):
    """jax 0.12's `polynomial` (Horner's rule over scalar coefficient operands): XLA runs the jaxpr
    of the function JAX's lowering traces, as refsim's value rule does
    (`refsim.interpreter.rules.decompositions`); the walk goes through that same jaxpr, so every
    multiply and add in it is bounded by its own rule (and the platform's relaxations)."""
    from refsim.interpreter.rules.decompositions import decomposition_jaxpr

    if compat.lowering_decomposition(eqn.primitive.name) is None:
        return [Unknown(frozenset({eqn.primitive.name}))] * len(eqn.outvars)
    types = tuple((tuple(v.aval.shape), v.aval.dtype) for v in eqn.invars)
    closed = decomposition_jaxpr(eqn.primitive.name, types, tuple(sorted(eqn.params.items())))
    return _walk().run_sub(bctx, closed, ins)


def _all_unknown(eqn, ins):
    u = None
    for x in ins:
        if isinstance(x, Unknown):
            u = x if u is None else u | x
    return None if u is None else [u] * len(eqn.outvars)


def _both(fn, *xs: BVal) -> BVal:
    """``fn(*xs)``, and in a dual walk its strict value ``fn`` of the operands' strict values,
    where one of them has its own (`BVal.strict`)."""
    out = fn(*xs)
    views = [V.strict_view(x) for x in xs]
    if any(v is not x for v, x in zip(views, xs)):
        out.strict = fn(*views)
    return out


def _undecidable(x: BVal) -> BVal:
    return _both(lambda x: BVal(x.center, np.full(np.shape(x.center), np.nan), x.dtype), x)


def _select(nm, mask, on_true: BVal, on_false: BVal) -> BVal:
    def sel(a, b):
        m = mask.reshape(mask.shape + (1,) * (max(np.ndim(a), np.ndim(b)) - mask.ndim))
        return np.where(m, a, b)

    def one(on_true, on_false):
        c = sel(on_true.center, on_false.center)
        b = None
        if on_true.bound is not None or on_false.bound is not None:
            b = sel(on_true.full_bound(), on_false.full_bound())
        return BVal(c, b, on_true.dtype, on_true.nonneg and on_false.nonneg)

    return _both(one, on_true, on_false)


def _split(rule, bctx, eqn, ins):
    """A dual walk where a decision (a branch index, a loop predicate) may differ between the walk
    with relaxations and the walk without: the rule once per walk, on each walk's values."""
    relaxed = rule(bctx.relaxed_only(), eqn, ins)
    return _walk().paired(relaxed, rule(bctx.strict(), eqn, [V.strict_view(x) for x in ins]), ins)


def _shadowed(xs) -> bool:
    return any(V.strict_view(x) is not x for x in xs)


@register("cond", structural=True)
def _cond(bctx, eqn, ins):
    unk = _all_unknown(eqn, ins)
    if unk:
        return unk
    index, ops = ins[0], ins[1:]
    if bctx.dual and _shadowed([index]):
        return _split(_cond, bctx, eqn, ins)
    branches = eqn.params["branches"]
    idx = np.clip(np.asarray(index.center).astype(np.int64), 0, len(branches) - 1)
    walk = _walk()
    taken = np.unique(idx)
    outs = None
    for k in taken.tolist():
        res = walk.run_sub(bctx, branches[k], ops)
        if any(isinstance(r, Unknown) for r in res):
            return [r if isinstance(r, Unknown) else Unknown(frozenset({"cond"})) for r in res]
        outs = res if outs is None else [_select(bctx.nm, idx == k, r, o) for r, o in zip(res, outs)]
    if index.bound is not None and np.isnan(index.bound).any():
        outs = [_undecidable(o) for o in outs]
    return outs


@register("while", structural=True)
def _while(bctx, eqn, ins):
    unk = _all_unknown(eqn, ins)
    if unk:
        return unk
    p = eqn.params
    cc, bc = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = ins[:cc], ins[cc:cc + bc], list(ins[cc + bc:])
    walk = _walk()
    while True:
        (pred,) = walk.run_sub(bctx, p["cond_jaxpr"], [*cconsts, *carry])
        if isinstance(pred, Unknown):
            return [pred] * len(carry)
        if bctx.dual and _shadowed([pred]) and not _same_decision(pred, pred.strict):
            # the two walks leave the loop at different trips: each goes on alone from here
            return _split(_while, bctx, eqn, [*cconsts, *bconsts, *carry])
        if pred.bound is not None and np.isnan(pred.bound).any():
            return [_undecidable(c) for c in carry]
        pc = np.asarray(pred.center)
        if not pc.any():
            return carry
        new = walk.run_sub(bctx, p["body_jaxpr"], [*bconsts, *carry])
        if any(isinstance(n, Unknown) for n in new):
            u = next(n for n in new if isinstance(n, Unknown))
            return [u] * len(carry)
        carry = new if pc.all() else [_select(bctx.nm, pc, n, c) for n, c in zip(new, carry)]


def _same_decision(a: BVal, b: BVal) -> bool:
    """True when a loop predicate decides alike in both walks (the same centers, undecidable in both or neither)."""
    und = [x.bound is not None and bool(np.isnan(x.bound).any()) for x in (a, b)]
    return und[0] == und[1] and np.array_equal(np.asarray(a.center), np.asarray(b.center))


def _step(x: BVal, nm, i) -> BVal:
    ix = (slice(None),) * nm + (i,)

    def one(x):
        b = None if x.bound is None else x.full_bound()[ix]
        return BVal(x.center[ix], b, x.dtype, x.nonneg)

    return _both(one, x)


@register("scan", structural=True)
def _scan(bctx, eqn, ins):
    unk = _all_unknown(eqn, ins)
    if unk:
        return unk
    p = eqn.params
    jaxpr, length, reverse = p["jaxpr"], p["length"], p["reverse"]
    consts, carry, xs = compat.scan_split_args(p, ins)
    nm = bctx.nm
    walk = _walk()
    n_carry = len(carry)
    steps = range(length - 1, -1, -1) if reverse else range(length)
    ys_steps = []
    for i in steps:
        out = walk.run_sub(bctx, jaxpr, [*consts, *carry, *[_step(x, nm, i) for x in xs]])
        if any(isinstance(o, Unknown) for o in out):
            u = next(o for o in out if isinstance(o, Unknown))
            return [u] * len(eqn.outvars)
        carry, ys = list(out[:n_carry]), out[n_carry:]
        ys_steps.append(ys)
    if reverse:
        ys_steps.reverse()
    ys_out = []
    for j, v in enumerate(eqn.outvars[n_carry:]):
        dt = dtype_of(v)
        if not ys_steps:
            aval = v.aval
            c = np.zeros((1,) * nm + tuple(aval.shape), V.as_center(np.zeros(0, dt), dt).dtype)
            ys_out.append(BVal(c, None, dt))
            continue
        parts = [s[j] for s in ys_steps]
        ys_out.append(_both(lambda *parts, dt=dt: _stacked(parts, nm, dt), *parts))
    return [*carry, *ys_out]


def _stacked(parts, nm, dt) -> BVal:
    m = np.broadcast_shapes(*(np.shape(q.center)[:nm] for q in parts)) if nm else ()
    cs = np.stack([np.broadcast_to(q.center, m + np.shape(q.center)[nm:]) for q in parts], axis=nm)
    b = None
    if any(q.bound is not None for q in parts):
        b = np.stack([np.broadcast_to(q.full_bound(), m + np.shape(q.center)[nm:]) for q in parts], axis=nm)
    return BVal(cs, b, dt, all(q.nonneg for q in parts))


def _enter(x, mesh, spec, outer_nm):
    if outer_nm == 0:
        return S.enter_global(x, mesh, spec)
    return S.split_by_spec(np.asarray(x), mesh, spec)


def _region_mesh(bctx, param_mesh):
    """The mesh a shard_map body runs on: the enclosing region's when it is the same mesh."""
    pm = S.as_refsim_mesh(param_mesh)
    m = bctx.mesh
    if m is not None and (m.axis_names, m.axis_sizes) == (pm.axis_names, pm.axis_sizes):
        return m
    return pm


@register("shard_map", structural=True)
def _shard_map(bctx, eqn, ins):
    p = eqn.params
    mesh = _region_mesh(bctx, p["mesh"])
    manual = compat.shard_map_manual_axes(dict(p))
    body = getattr(p["jaxpr"], "jaxpr", p["jaxpr"])
    if getattr(p["jaxpr"], "consts", ()):
        return [Unknown(frozenset({"shard_map with constants"}))] * len(eqn.outvars)
    in_specs, out_specs = p["in_specs"], p["out_specs"]
    if any(S.as_refsim_spec(s).unreduced for s in (*in_specs, *out_specs)):
        return [Unknown(frozenset({"unreduced values"}))] * len(eqn.outvars)
    inner = bctx.region(mesh.ndim, mesh)
    args = []
    for x, spec in zip(ins, in_specs):
        if isinstance(x, Unknown):
            args.append(x)
            continue

        def enter(x, spec=spec):
            c = _enter(x.center, mesh, spec, bctx.nm)
            b = None if x.bound is None else _enter(x.full_bound(), mesh, spec, bctx.nm)
            dom = None
            if x.dom is not None:
                dom = _enter(np.broadcast_to(x.dom, np.shape(x.center)).astype(np.float64), mesh, spec,
                             bctx.nm).astype(np.int32)
            return BVal(c, b, x.dtype, x.nonneg, dom, x.origin)

        args.append(_both(enter, x))
    outs = _walk().eval_jaxpr(inner, body, (), args)
    res = []
    for y, spec in zip(outs, out_specs):
        if isinstance(y, Unknown):
            res.append(y)
            continue
        if not _replicas_agree(mesh, manual, y, spec):
            # check_vma=False lets a body return different values along an axis out_specs leaves
            # unnamed; each device then keeps its own (refsim and XLA alike): no single center
            res.append(Unknown(frozenset({"replicas that differ (an axis out_specs leaves unnamed)"})))
            continue
        res.append(_both(lambda y, spec=spec: _leave(bctx, mesh, manual, y, spec), y))
    return res


def _replicas_agree(mesh, manual, y: BVal, spec) -> bool:
    """Whether the body's centers are equal along every manual axis `spec` leaves unnamed (NaN
    equal to NaN): the replicas the out_spec claims, which a check_vma=False body may break."""
    rspec = S.as_refsim_spec(spec)
    unnamed = [mesh.axis_index(a) for a in manual if a not in rspec.used_axes()]
    c = np.asarray(y.center)
    for k in unnamed:
        if k < c.ndim and c.shape[k] > 1:
            first = np.take(c, [0], axis=k)
            same = (c == first) | ((c != c) & (first != first))
            if not np.all(same):
                return False
    return True


def _leave(bctx, mesh, manual, y: BVal, spec) -> BVal:
    """A shard_map body's result `y` tiled by its out_spec (module docstring)."""
    rspec = S.as_refsim_spec(spec)
    unnamed = [mesh.axis_index(a) for a in manual if a not in rspec.used_axes()]
    shape = np.shape(y.center)
    c = y.center[tuple(slice(0, 1) if k in unnamed else slice(None) for k in range(len(shape)))]
    b = None
    if y.bound is not None:
        b = np.broadcast_to(y.full_bound(), shape)
        if unnamed:
            b = np.max(b, axis=tuple(unnamed), keepdims=True)
    dom = None
    if y.dom is not None:
        dom = np.broadcast_to(y.dom, shape)[tuple(slice(0, 1) if k in unnamed else slice(None)
                                                  for k in range(len(shape)))]
        dom = S.tile_by_spec(dom.astype(np.float64), mesh, spec).astype(np.int32)
    c = S.tile_by_spec(c, mesh, spec)
    if b is not None:
        b = S.tile_by_spec(b, mesh, spec)
    if bctx.nm == 0:
        c = c.reshape(c.shape[mesh.ndim:])
        if b is not None:
            b = b.reshape(b.shape[mesh.ndim:])
        if dom is not None:
            dom = dom.reshape(dom.shape[mesh.ndim:])
    return BVal(c, b, y.dtype, y.nonneg, dom)


@register("custom_linear_solve", structural=True)
def _custom_linear_solve(bctx, eqn, ins):
    """`lax.custom_linear_solve`: its value is ``solve(matvec, b)`` (refsim's rule, JAX's impl)."""
    p = eqn.params
    n = p["const_lengths"]
    counts = [n.matvec, n.vecmat, n.solve, n.transpose_solve]
    start = counts[0] + counts[1]
    args = [*ins[start:start + counts[2]], *ins[sum(counts):]]
    unk = [x for x in args if isinstance(x, Unknown)]
    if unk:
        return [unk[0]] * len(eqn.outvars)
    return _walk().run_sub(bctx, p["jaxprs"].solve, args)
