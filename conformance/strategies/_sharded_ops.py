"""The op table of `conformance.strategies.sharded_programs`: one small drawer per op.

Each drawer takes the `Builder`, picks operands the value model allows (shape, dtype, range,
exactness), draws its parameters, emits one line of source and returns True, or returns False
when no value in the pool fits (the builder then draws another op). The model's rules are
stated where they are used: what keeps a result exact, how far two correct results may be
apart (`Val.err`), and which sharding types an Explicit mesh lets an op take.
"""
from __future__ import annotations

import math

import numpy as np

from conformance.strategies._sharded_graph import (
    BOOL, F32, I32, Builder, Val, float_result, int_result, model_of, spec_text, sum_result, ulp,
)

MAX_RANK = 4


# -- shared helpers ---------------------------------------------------------------------------------
def _num(v: Val) -> bool:
    return v.dtype in (F32, I32) and v.fine and not v.manual


def _flt(v: Val) -> bool:
    return v.dtype == F32 and v.fine and not v.manual


def _exact_num(v: Val) -> bool:
    return _num(v) and v.exact


def _ranked(v: Val, lo: int = 1) -> bool:
    return v.ndim >= lo


def _lit(x, dtype: str) -> str:
    """A scalar literal of `dtype` (weak-typed Python scalars would follow the operand anyway)."""
    if dtype == F32:
        return repr(float(x))
    if dtype == I32:
        return repr(int(x))
    return repr(bool(x))


def _jdt(dtype: str) -> str:
    return {F32: "jnp.float32", I32: "jnp.int32", BOOL: "jnp.bool_"}[dtype]


def _fits(b: Builder, shape) -> bool:
    return len(shape) <= MAX_RANK and all(s >= 1 for s in shape) and math.prod(shape) <= b.max_elements


def _keep_spec(b: Builder, v: Val):
    """The spec an elementwise result of `v` has: `v`'s (a type on Explicit, a hint on Auto)."""
    return v.spec


def _result(dtype: str, lo, hi, frac=0, err=0.0, rounds=False) -> dict:
    if dtype == F32:
        return float_result(lo, hi, frac, err, rounds=rounds)
    if dtype == I32:
        return int_result(lo, hi)
    return dict(lo=0.0, hi=1.0, frac=0, err=0.0)


def _partner(b: Builder, a: Val, *, exact: bool = False) -> tuple[str, Val | None]:
    """A second operand for an elementwise op on `a`: a value of the same shape and dtype, a
    scalar value, or a small literal (then the Val is None)."""
    ok = (lambda v: v is not a and v.dtype == a.dtype and (v.shape == a.shape or v.shape == ())
          and v.fine and not v.manual and (v.exact or not exact))
    v = b.pick(ok) if b.draw_int(0, 2) and any(ok(v) for v in b.pool) else None
    if v is not None:
        v = b.same_spec(v, a)
        return v.name, v
    c = b.choice([1, 2, -1, 3, 0.5, -0.25] if a.dtype == F32 else [1, 2, -1, 3, -5])
    return _lit(c, a.dtype), None


def _const_model(text: str, dtype: str) -> Val:
    x = float(text == "True") if text in ("True", "False") else float(text)
    frac = 0 if x == int(x) else 2
    return Val(text, (), dtype, x, x, frac, 0.0, ())


# -- elementwise ----------------------------------------------------------------------------------
def _unary(name: str, fmt: str, model):
    def op(b: Builder) -> bool:
        a = b.pick(_num)
        if a is None:
            return False
        m = model(a)
        if m is None:
            return False
        b.emit(name, fmt.format(a=a.name), a.shape, a.dtype, main=a, spec=_keep_spec(b, a), **m)
        return True
    return op


def _neg(a):
    return dict(lo=-a.hi, hi=-a.lo, frac=a.frac, err=a.err)


def _abs(a):
    lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
    return dict(lo=lo, hi=a.mag, frac=a.frac, err=a.err)


def _square(a):
    m = a.mag
    if a.dtype == I32:
        return int_result(0, m * m)
    return float_result(0.0, m * m, None if a.frac is None else 2 * a.frac, 2 * m * a.err + a.err ** 2)


def _cube(a):
    m = a.mag
    if a.dtype == I32:
        return int_result(-m ** 3, m ** 3)
    return float_result(-m ** 3, m ** 3, None if a.frac is None else 3 * a.frac, 3 * m * m * a.err + 3 * m * a.err ** 2
                        + a.err ** 3)


def _rounding(a):
    if not a.exact or a.dtype != F32:
        return None   # a step function: only exact inputs give the same result everywhere
    return dict(lo=math.floor(a.lo), hi=math.ceil(a.hi), frac=0, err=0.0)


def _sign(a):
    if not a.exact:
        return None
    return dict(lo=-1.0, hi=1.0, frac=0, err=0.0)


def _relu(a):
    return dict(lo=max(a.lo, 0.0), hi=max(a.hi, 0.0), frac=a.frac, err=a.err)


def _binary(name: str):
    sym = {"add": "+", "sub": "-", "mul": "*"}[name]

    def op(b: Builder) -> bool:
        a = b.pick(_num)
        if a is None:
            return False
        text, v = _partner(b, a)
        o = v if v is not None else _const_model(text, a.dtype)
        if name == "add":
            lo, hi, frac = a.lo + o.lo, a.hi + o.hi, _maxfrac(a, o)
            err = a.err + o.err
        elif name == "sub":
            lo, hi, frac = a.lo - o.hi, a.hi - o.lo, _maxfrac(a, o)
            err = a.err + o.err
        else:
            ps = [a.lo * o.lo, a.lo * o.hi, a.hi * o.lo, a.hi * o.hi]
            lo, hi = min(ps), max(ps)
            frac = None if a.frac is None or o.frac is None else a.frac + o.frac
            err = a.mag * o.err + o.mag * a.err + a.err * o.err
        b.emit(name, f"{a.name} {sym} {text}", a.shape, a.dtype, main=a, spec=_keep_spec(b, a),
               **_result(a.dtype, lo, hi, frac, err))
        return True
    return op


def _maxfrac(a: Val, o: Val):
    return None if a.frac is None or o.frac is None else max(a.frac, o.frac)


def _div(b: Builder) -> bool:
    a = b.pick(_num)
    if a is None:
        return False
    if a.dtype == I32:
        k = b.choice([2, 3, 5, 7])
        kind = b.choice(["floor_divide", "remainder", "lax_div", "lax_rem"])
        expr = {"floor_divide": f"{a.name} // {k}", "remainder": f"jnp.remainder({a.name}, {k})",
                "lax_div": f"jax.lax.div({a.name}, jnp.int32({k}))",
                "lax_rem": f"jax.lax.rem({a.name}, jnp.int32({k}))"}[kind]
        lo, hi = (a.lo / k - 1, a.hi / k + 1) if "div" in kind else (-(k - 1), k - 1)
        b.emit("div", expr, a.shape, I32, main=a, spec=_keep_spec(b, a), **int_result(math.floor(lo), math.ceil(hi)))
        return True
    text, v = _partner(b, a)
    if v is None:
        d = abs(float(text)) or 1.0
        b.emit("div", f"{a.name} / {abs(float(text)) or 1.0!r}", a.shape, F32, main=a, spec=_keep_spec(b, a),
               **float_result(a.lo / d if a.lo < 0 else a.lo / (d + 1e9), a.hi / d, None, a.err / d, rounds=True))
        return True
    # the divisor is at least 1, so the quotient's error is bounded by the dividend's
    err = a.err + a.mag * v.err
    b.emit("div", f"{a.name} / (jnp.abs({text}) + 1)", a.shape, F32, main=a, spec=_keep_spec(b, a),
           **float_result(min(a.lo, 0.0), max(a.hi, 0.0), None, err, rounds=True))
    return True


def _rem(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.dtype == F32 and v.exact)
    if a is None:
        return False
    c = b.choice([2.0, 3.0, 0.75, 1.5])
    if b.boolean():
        expr, lo, hi = f"jnp.remainder({a.name}, {c!r})", 0.0, c
    else:
        expr, lo, hi = f"jax.lax.rem({a.name}, jnp.float32({c!r}))", -c, c
    frac = None if a.frac is None else max(a.frac, 2)
    b.emit("rem", expr, a.shape, F32, main=a, spec=_keep_spec(b, a), lo=lo, hi=hi, frac=frac, err=0.0)
    return True


def _maxmin(name: str):
    fn = {"max": "jnp.maximum", "min": "jnp.minimum"}[name]

    def op(b: Builder) -> bool:
        a = b.pick(_num)
        if a is None:
            return False
        text, v = _partner(b, a)
        o = v if v is not None else _const_model(text, a.dtype)
        if name == "max":
            lo, hi = max(a.lo, o.lo), max(a.hi, o.hi)
        else:
            lo, hi = min(a.lo, o.lo), min(a.hi, o.hi)
        b.emit(name, f"{fn}({a.name}, {text})", a.shape, a.dtype, main=a, spec=_keep_spec(b, a),
               lo=lo, hi=hi, frac=_maxfrac(a, o), err=max(a.err, o.err))
        return True
    return op


def _compare(b: Builder) -> bool:
    a = b.pick(_exact_num)
    if a is None:
        return False
    text, _ = _partner(b, a, exact=True)
    sym = b.choice(["<", "<=", ">", ">=", "==", "!="])
    b.emit("compare", f"{a.name} {sym} {text}", a.shape, BOOL, main=a, spec=_keep_spec(b, a), lo=0.0, hi=1.0)
    return True


def _select(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v))
    if a is None:
        return False
    preds = [v for v in b.pool if v.dtype == BOOL and v.shape == a.shape and not v.manual]
    if preds and b.boolean():
        p = b.same_spec(b.choice(preds), a)
        pred = p.name
    else:
        src = b.pick(lambda v: _exact_num(v) and v.shape == a.shape)
        if src is None:
            return False
        src = b.same_spec(src, a)
        pred = f"{src.name} > {_lit(b.choice([0, 1, -1]), src.dtype)}"
    text, v = _partner(b, a)
    o = v if v is not None else _const_model(text, a.dtype)
    if v is None:
        text = f"jnp.full_like({a.name}, {text})"
    b.emit("select", f"jnp.where({pred}, {a.name}, {text})", a.shape, a.dtype, main=a, spec=_keep_spec(b, a),
           lo=min(a.lo, o.lo), hi=max(a.hi, o.hi), frac=_maxfrac(a, o), err=max(a.err, o.err))
    return True


def _clamp(b: Builder) -> bool:
    a = b.pick(_num)
    if a is None:
        return False
    lo = b.choice([-4, -1, 0, 2])
    hi = lo + b.choice([0, 1, 3, 8])
    if b.boolean():
        expr = f"jax.lax.clamp({_jdt(a.dtype)}({lo}), {a.name}, {_jdt(a.dtype)}({hi}))"
    else:
        expr = f"jnp.clip({a.name}, {lo}, {hi})"
    b.emit("clamp", expr, a.shape, a.dtype, main=a, spec=_keep_spec(b, a),
           lo=float(lo), hi=float(hi), frac=a.frac, err=a.err)
    return True


def _logical(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype == BOOL and not v.manual)
    if a is None:
        return False
    kind = b.choice(["and", "or", "xor", "not"])
    if kind == "not":
        b.emit("logical", f"jnp.logical_not({a.name})", a.shape, BOOL, main=a, spec=_keep_spec(b, a), lo=0.0, hi=1.0)
        return True
    o = b.pick(lambda v: v.dtype == BOOL and v.shape == a.shape and not v.manual) or a
    o = b.same_spec(o, a)
    b.emit("logical", f"jnp.logical_{kind}({a.name}, {o.name})", a.shape, BOOL, main=a, spec=_keep_spec(b, a),
           lo=0.0, hi=1.0)
    return True


def _bitwise(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype == I32 and not v.manual)
    if a is None:
        return False
    kind = b.choice(["&", "|", "^", "~", "shift_left", "shift_right_arithmetic", "shift_right_logical"])
    if kind == "~":
        expr = f"~{a.name}"
    elif kind.startswith("shift"):
        expr = f"jax.lax.{kind}({a.name}, jnp.int32({b.draw_int(0, 5)}))"
    else:
        o = b.pick(lambda v: v.dtype == I32 and v.shape in (a.shape, ()) and not v.manual) or a
        o = b.same_spec(o, a)
        expr = f"{a.name} {kind} {o.name}"
    # bit operations leave any int32 (the model keeps no range for them)
    b.emit("bitwise", expr, a.shape, I32, main=a, spec=_keep_spec(b, a), **int_result(-2.0 ** 31, 2.0 ** 31))
    return True


# -- transcendentals: (jnp source with {a}, Lipschitz constant on the domain, range, refsim accuracy name)
def _transcendental(name: str, fmt: str, lip, rng, acc: str):
    def op(b: Builder) -> bool:
        a = b.pick(lambda v: _flt(v) and v.mag <= 1e4)
        if a is None:
            return False
        from refsim.interpreter.accuracy import ACCURACY

        lo, hi = rng(a)
        mag = max(abs(lo), abs(hi), 1e-30)
        ulps = ACCURACY[acc].refsim_vs_xla_f32 + ACCURACY[acc].refsim_vs_correct + 2
        err = lip(a) * a.err + ulps * ulp(mag)
        b.emit(name, fmt.format(a=a.name), a.shape, F32, main=a, spec=_keep_spec(b, a),
               lo=lo, hi=hi, frac=None, err=err)
        return True
    return op


_TRANSCENDENTALS = {
    "exp": ("jnp.exp(jnp.clip({a}, -8.0, 4.0))", lambda a: math.exp(4), lambda a: (0.0, math.exp(4)), "exp"),
    "log": ("jnp.log(jnp.abs({a}) + 1)", lambda a: 1.0, lambda a: (0.0, math.log(a.mag + 1)), "log"),
    "sin": ("jnp.sin({a})", lambda a: 1.0, lambda a: (-1.0, 1.0), "sin"),
    "cos": ("jnp.cos({a})", lambda a: 1.0, lambda a: (-1.0, 1.0), "cos"),
    "tanh": ("jnp.tanh({a})", lambda a: 1.0, lambda a: (-1.0, 1.0), "tanh"),
    "logistic": ("jax.nn.sigmoid({a})", lambda a: 0.25, lambda a: (0.0, 1.0), "logistic"),
    "sqrt": ("jnp.sqrt(jnp.abs({a}) + 1)", lambda a: 0.5, lambda a: (1.0, math.sqrt(a.mag + 1)), "sqrt"),
    "rsqrt": ("jax.lax.rsqrt(jnp.abs({a}) + 1)", lambda a: 0.5, lambda a: (0.0, 1.0), "rsqrt"),
    "atan": ("jnp.arctan({a})", lambda a: 1.0, lambda a: (-math.pi / 2, math.pi / 2), "atan"),
    "erf": ("jax.scipy.special.erf({a})", lambda a: 1.2, lambda a: (-1.0, 1.0), "erf"),
    "expm1": ("jnp.expm1(jnp.clip({a}, -8.0, 4.0))", lambda a: math.exp(4), lambda a: (-1.0, math.exp(4)), "expm1"),
    "log1p": ("jnp.log1p(jnp.abs({a}))", lambda a: 1.0, lambda a: (0.0, math.log1p(a.mag)), "log1p"),
}


def _atan2(b: Builder) -> bool:
    a = b.pick(lambda v: _flt(v) and v.exact)
    if a is None:
        return False
    o = b.pick(lambda v: _flt(v) and v.exact and v.shape == a.shape) or a
    o = b.same_spec(o, a)
    b.emit("atan2", f"jnp.arctan2({a.name}, {o.name})", a.shape, F32, main=a, spec=_keep_spec(b, a),
           lo=-math.pi, hi=math.pi, frac=None, err=4 * ulp(math.pi))
    return True


# -- linear algebra -------------------------------------------------------------------------------
def _dot_dims(b: Builder, a: Val, o: Val):
    """Drawn (contracting, batch) dimension pairs of a dot_general of `a` and `o` (sizes equal)."""
    pairs = [(i, j) for i in range(a.ndim) for j in range(o.ndim) if a.shape[i] == o.shape[j]]
    if not pairs:
        return None
    order = b.draw_permutation(len(pairs))
    used_a, used_o, contract, batch = set(), set(), [], []
    for k in order[: b.draw_int(1, min(3, len(pairs)))]:
        i, j = pairs[k]
        if i in used_a or j in used_o:
            continue
        used_a.add(i)
        used_o.add(j)
        (batch if b.draw_int(0, 2) == 0 else contract).append((i, j))
    if not contract and not batch:
        return None
    return contract, batch


def _dot_shape(a: Val, o: Val, contract, batch) -> tuple:
    ca, co = {i for i, _ in contract}, {j for _, j in contract}
    ba, bo = [i for i, _ in batch], [j for _, j in batch]
    return (tuple(a.shape[i] for i in ba) + tuple(a.shape[i] for i in range(a.ndim) if i not in ca and i not in ba)
            + tuple(o.shape[j] for j in range(o.ndim) if j not in co and j not in bo))


def _dot_model(a: Val, o: Val, k: int) -> dict:
    if a.dtype == I32:
        return int_result(-a.mag * o.mag * k, a.mag * o.mag * k)
    prod = Val("p", (), F32, -a.mag * o.mag, a.mag * o.mag,
               None if a.frac is None or o.frac is None else a.frac + o.frac,
               a.mag * o.err + o.mag * a.err + a.err * o.err)
    return sum_result(prod, k)


def _dot_like(name: str):
    def op(b: Builder) -> bool:
        a = b.pick(lambda v: _num(v) and v.ndim >= 1)
        if a is None:
            return False
        o = b.pick(lambda v: _num(v) and v.ndim >= 1 and v.dtype == a.dtype and
                   any(s in a.shape for s in v.shape)) or a
        dims = _dot_dims(b, a, o)
        if dims is None:
            return False
        contract, batch = dims
        shape = _dot_shape(a, o, contract, batch)
        if not _fits(b, shape):
            return False
        k = math.prod(a.shape[i] for i, _ in contract)
        main = a
        a, o = b.replicated(a), b.replicated(o)
        out_kw, spec = _out_sharding(b, shape)
        if name == "dot_general":
            dn = ((tuple(i for i, _ in contract), tuple(j for _, j in contract)),
                  (tuple(i for i, _ in batch), tuple(j for _, j in batch)))
            expr = f"jax.lax.dot_general({a.name}, {o.name}, {dn!r}{out_kw})"
        else:
            expr = f"jnp.einsum({_einsum_spec(a, o, contract, batch)!r}, {a.name}, {o.name}{out_kw})"
        b.emit(name, expr, shape, a.dtype, main=main, spec=spec, **_dot_model(a, o, k))
        return True
    return op


def _einsum_spec(a: Val, o: Val, contract, batch) -> str:
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    la = [next(letters) for _ in range(a.ndim)]
    lo_ = [next(letters) for _ in range(o.ndim)]
    for i, j in contract + batch:
        lo_[j] = la[i]
    ca, co = {i for i, _ in contract}, {j for _, j in contract}
    ba, bo = [i for i, _ in batch], [j for _, j in batch]
    out = ([la[i] for i in ba] + [la[i] for i in range(a.ndim) if i not in ca and i not in ba]
           + [lo_[j] for j in range(o.ndim) if j not in co and j not in bo])
    return f"{''.join(la)},{''.join(lo_)}->{''.join(out)}"


def _matmul(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim in (1, 2, 3))
    if a is None:
        return False
    k = a.shape[-1]
    o = b.pick(lambda v: _num(v) and v.dtype == a.dtype and v.ndim in (1, 2) and v.shape[0] == k)
    if o is None and a.ndim < 2:
        return False
    shape = a.shape[:-1] + ((a.shape[-2],) if o is None else o.shape[1:])
    if not _fits(b, shape):
        return False
    main = a
    a = b.replicated(a)
    if o is None:
        # a @ a^T-like product: contract the last dimension with itself
        o_val, expr_o = a, f"jnp.swapaxes({a.name}, -1, -2)"
    else:
        o_val = b.replicated(o)
        expr_o = o_val.name
    out_kw, spec = _out_sharding(b, shape)
    b.emit("matmul", f"jnp.matmul({a.name}, {expr_o}{out_kw})", shape, a.dtype, main=main, spec=spec,
           **_dot_model(a, o_val, k))
    return True


def _out_sharding(b: Builder, shape: tuple):
    """On an Explicit mesh: a drawn ``out_sharding=`` (the ops that take it) and the result's type."""
    if not b.explicit or not b.boolean():
        return "", None
    spec = b.draw_spec(shape, dividing=True)
    return f", out_sharding={spec_text(spec)}", spec


# -- reductions -------------------------------------------------------------------------------------
def _axes(b: Builder, v: Val, *, single: bool = False):
    if single:
        return (b.draw_int(0, v.ndim - 1),)
    perm = b.draw_permutation(v.ndim)
    return tuple(sorted(perm[: b.draw_int(1, v.ndim)]))


def _reduced_shape(v: Val, axes, keepdims: bool) -> tuple:
    return tuple((1 if keepdims else None) if d in axes else s for d, s in enumerate(v.shape) if keepdims or d not in axes)


def _reduction(name: str):
    def op(b: Builder) -> bool:
        pred = {"sum": _num, "mean": _flt, "prod": _num, "reduce_max": _num, "reduce_min": _num,
                "any_all": lambda v: v.dtype == BOOL and not v.manual}[name]
        a = b.pick(lambda v: pred(v) and v.ndim >= 1)
        if a is None:
            return False
        axes = _axes(b, a)
        keep = b.boolean()
        shape = _reduced_shape(a, axes, keep)
        n = math.prod(a.shape[d] for d in axes)
        ax = axes[0] if len(axes) == 1 else axes
        main = a
        a = b.replicated(a)
        kd = ", keepdims=True" if keep else ""
        if name == "sum":
            expr, m = f"jnp.sum({a.name}, axis={ax!r}{kd})", sum_result(a, n)
        elif name == "mean":
            s = sum_result(a, n)
            exact = s["err"] == 0 and n & (n - 1) == 0
            frac = None if s["frac"] is None or not exact else s["frac"] + int(math.log2(n))
            m = float_result(a.lo, a.hi, frac, s["err"] / n, rounds=not exact)
            expr = f"jnp.mean({a.name}, axis={ax!r}{kd})"
        elif name == "prod":
            if a.mag ** n > 2.0 ** 20 or n > 8:
                return False
            hi = a.mag ** n
            if a.dtype == I32:
                m = int_result(-hi, hi)
            else:
                frac = None if a.frac is None else a.frac * n
                m = float_result(-hi, hi, frac, n * a.err * a.mag ** (n - 1) + n * ulp(hi) * bool(
                    frac is None or hi * 2.0 ** frac > 2.0 ** 24))
            expr = f"jnp.prod({a.name}, axis={ax!r}{kd})"
        elif name in ("reduce_max", "reduce_min"):
            fn = "jnp.max" if name == "reduce_max" else "jnp.min"
            expr, m = f"{fn}({a.name}, axis={ax!r}{kd})", model_of(a)
        else:
            fn = b.choice(["jnp.any", "jnp.all"])
            expr, m = f"{fn}({a.name}, axis={ax!r}{kd})", dict(lo=0.0, hi=1.0)
        b.emit(name, expr, shape, BOOL if name == "any_all" else a.dtype, main=main, **m)
        return True
    return op


def _argminmax(name: str):
    def op(b: Builder) -> bool:
        a = b.pick(lambda v: _exact_num(v) and v.ndim >= 1)
        if a is None:
            return False
        d = b.draw_int(0, a.ndim - 1)
        keep = b.boolean()
        main = a
        a = b.replicated(a)
        shape = _reduced_shape(a, (d,), keep)
        kd = ", keepdims=True" if keep else ""
        b.emit(name, f"jnp.{name}({a.name}, axis={d}{kd})", shape, I32, main=main,
               **int_result(0, a.shape[d] - 1))
        return True
    return op


def _logsumexp(b: Builder) -> bool:
    a = b.pick(lambda v: _flt(v) and v.ndim >= 1 and v.mag <= 64)
    if a is None:
        return False
    axes = _axes(b, a)
    n = math.prod(a.shape[d] for d in axes)
    main = a
    a = b.replicated(a)
    shape = _reduced_shape(a, axes, False)
    hi = a.hi + math.log(n)
    err = a.err + (n + 8) * ulp(max(abs(a.lo), abs(hi), 1.0)) * 4
    ax = axes[0] if len(axes) == 1 else axes
    b.emit("logsumexp", f"jax.nn.logsumexp({a.name}, axis={ax!r})", shape, F32, main=main,
           lo=a.lo, hi=hi, frac=None, err=err)
    return True


def _softmax(b: Builder) -> bool:
    a = b.pick(lambda v: _flt(v) and v.ndim >= 1 and v.mag <= 64)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main = a
    a = b.replicated(a)
    n = a.shape[d]
    b.emit("softmax", f"jax.nn.softmax({a.name}, axis={d})", a.shape, F32, main=main,
           lo=0.0, hi=1.0, frac=None, err=2 * a.err + (n + 8) * 4 * ulp(1.0))
    return True


# -- cumulative and windowed ------------------------------------------------------------------------
def _cumulative(name: str):
    def op(b: Builder) -> bool:
        pred = _flt if name == "cumlogsumexp" else _num
        a = b.pick(lambda v: pred(v) and v.ndim >= 1 and (name != "cumlogsumexp" or v.mag <= 64))
        if a is None:
            return False
        d = b.draw_int(0, a.ndim - 1)
        n = a.shape[d]
        main = a
        a = b.replicated(a)
        rev = b.boolean()
        if name == "cumsum":
            m = sum_result(a, n)
        elif name == "cumprod":
            if a.mag ** n > 2.0 ** 20 or n > 8:
                return False
            hi = max(a.mag ** n, a.mag)
            frac = None if a.frac is None else a.frac * n
            m = (int_result(-hi, hi) if a.dtype == I32 else
                 float_result(-hi, hi, frac, n * a.err * max(a.mag, 1.0) ** (n - 1)
                              + n * ulp(hi) * bool(frac is None or hi * 2.0 ** frac > 2.0 ** 24)))
        elif name == "cumlogsumexp":
            hi = a.hi + math.log(n)
            m = dict(lo=a.lo, hi=hi, frac=None, err=a.err + (n + 8) * 4 * ulp(max(abs(a.lo), abs(hi), 1.0)))
        else:
            m = model_of(a)
        if b.boolean() or name == "cumlogsumexp":
            expr = f"jax.lax.{name}({a.name}, axis={d}, reverse={rev})"
        else:
            expr = f"jnp.{name}({a.name}, axis={d})" if name in ("cumsum", "cumprod") else \
                f"jax.lax.{name}({a.name}, axis={d}, reverse={rev})"
        b.emit(name, expr, a.shape, a.dtype, main=main, spec=None, **m)
        return True
    return op


def _window_out(n: int, w: int, s: int, lo: int, hi: int, bd: int, wd: int) -> int:
    padded = (n - 1) * bd + 1 + lo + hi
    eff = (w - 1) * wd + 1
    return 0 if padded < eff else (padded - eff) // s + 1


def _reduce_window(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim >= 1)
    if a is None:
        return False
    # init is always the monoid's identity: XLA may assume it is (JAX documents the same for
    # lax.reduce), so another init (StableHLO would put it in the holes of a base-dilated window)
    # draws undefined behaviour, and JAX has no reverse-mode rule for it
    kind = b.choice(["add", "max", "min"])
    dims, strides, pads, bdil, wdil, shape = [], [], [], [], [], []
    for n in a.shape:
        w = b.draw_int(1, min(3, n + 1))
        s = b.draw_int(1, 2)
        lo, hi = b.draw_int(0, 1), b.draw_int(0, 1)
        bd = 1 if b.backward else b.choice([1, 1, 2])
        # JAX's max / min pooling VJP (select_and_gather) takes no window dilation
        wd = 1 if b.backward and kind in ("max", "min") else b.choice([1, 1, 2])
        out = _window_out(n, w, s, lo, hi, bd, wd)
        if out < 1:
            w, s, lo, hi, bd, wd, out = 1, 1, 0, 0, 1, 1, n
        dims.append(w)
        strides.append(s)
        pads.append((lo, hi))
        bdil.append(bd)
        wdil.append(wd)
        shape.append(out)
    if not _fits(b, tuple(shape)):
        return False
    main = a
    a = b.replicated(a)
    k = math.prod(dims)
    # init as a Python scalar: JAX recognises the monoid (reduce_window_sum / _max / _min, which
    # have derivatives) only for a concrete identity
    flt = a.dtype == F32
    if kind == "add":
        init = "0.0" if flt else "0"
        m = sum_result(a, k)
        fn = "jax.lax.add"
    else:
        init = ("-np.inf" if kind == "max" else "np.inf") if flt else \
            ("-2147483648" if kind == "max" else "2147483647")
        m = model_of(a)
        if any(lo or hi for lo, hi in pads) or any(d > 1 for d in bdil):
            # windows may hold only padding: the init value (±inf, or int32's extremes)
            m = dict(lo=-math.inf, hi=math.inf, frac=a.frac, err=a.err) if flt else int_result(-2.0 ** 31, 2.0 ** 31)
        fn = f"jax.lax.{kind}"
    expr = (f"jax.lax.reduce_window({a.name}, {init}, {fn}, {tuple(dims)!r}, "
            f"{tuple(strides)!r}, {tuple(pads)!r}, base_dilation={tuple(bdil)!r}, window_dilation={tuple(wdil)!r})")
    b.emit("reduce_window", expr, tuple(shape), a.dtype, main=main, **m)
    return True


# -- sorting ----------------------------------------------------------------------------------------
def _sort(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype in (F32, I32) and v.ndim >= 1 and not v.manual and v.mag < math.inf)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main = a
    a = b.replicated(a)
    if b.boolean():
        expr = f"jnp.sort({a.name}, axis={d}, descending={b.boolean()})"
    else:
        expr = f"jax.lax.sort({a.name}, dimension={d})"
    b.emit("sort", expr, a.shape, a.dtype, main=main, **model_of(a))
    return True


def _argsort(b: Builder) -> bool:
    a = b.pick(lambda v: _exact_num(v) and v.ndim >= 1)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main = a
    a = b.replicated(a)
    b.emit("argsort", f"jnp.argsort({a.name}, axis={d}, stable=True, descending={b.boolean()})", a.shape, I32,
           main=main, **int_result(0, a.shape[d] - 1))
    return True


def _sort_multi(b: Builder) -> bool:
    k = b.pick(lambda v: _exact_num(v) and v.ndim >= 1)
    if k is None:
        return False
    o = b.pick(lambda v: v.shape == k.shape and v.dtype in (F32, I32) and not v.manual) or k
    d = b.draw_int(0, k.ndim - 1)
    main = k
    k, o = b.replicated(k), b.replicated(o)
    b.emit_multi("sort_multi", f"jax.lax.sort(({k.name}, {o.name}), dimension={d}, num_keys=1)",
                 [(k.shape, k.dtype, None, model_of(k)), (o.shape, o.dtype, None, model_of(o))], main=main)
    return True


def _top_k(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype in (F32, I32) and v.ndim >= 1 and not v.manual and v.mag < math.inf)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    kk = b.draw_int(1, a.shape[d])
    main = a
    a = b.replicated(a)
    shape = a.shape[:d] + (kk,) + a.shape[d + 1:]
    axis = "" if d == a.ndim - 1 and b.boolean() else f", axis={d}"
    vals, idx = b.emit_multi("top_k", f"jax.lax.top_k({a.name}, {kk}{axis})",
                             [(shape, a.dtype, None, model_of(a)), (shape, I32, None, int_result(0, a.shape[d] - 1))],
                             main=main)
    if not a.exact:
        # ties among values that differ by rounding may order differently: keep only the values
        b.pool.remove(idx)
    return True


# -- indexing ---------------------------------------------------------------------------------------
def _indices(b: Builder, n: int, count: int, *, oob: bool) -> list:
    lo, hi = (-n - 2, n + 1) if oob else (-n, n - 1)
    return [b.draw_int(lo, hi) for _ in range(count)]


def _norm(i: int, n: int) -> int:
    return i + n if i < 0 else i


def _idx_text(idx) -> str:
    return f"jnp.array({list(idx)!r}, dtype=jnp.int32)"


def _gather(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    kind = b.choice(["take0", "take_axis", "index2d", "pairs", "mixed_slice"])
    main = a
    a = b.replicated(a)
    n0 = a.shape[0]
    m = b.draw_int(1, 4)
    if kind == "take0":
        expr, shape = f"{a.name}[{_idx_text(_indices(b, n0, m, oob=False))}]", (m,) + a.shape[1:]
    elif kind == "take_axis" and a.ndim >= 2:
        d = b.draw_int(1, a.ndim - 1)
        idx = _idx_text(_indices(b, a.shape[d], m, oob=False))
        expr = f"{a.name}[{', '.join([':'] * d + [idx])}]"
        shape = a.shape[:d] + (m,) + a.shape[d + 1:]
    elif kind == "index2d":
        m2 = b.draw_int(1, 3)
        vals = _indices(b, n0, m * m2, oob=False)
        expr = f"{a.name}[{_idx_text(vals)}.reshape({m}, {m2})]"
        shape = (m, m2) + a.shape[1:]
    elif kind == "pairs" and a.ndim >= 2:
        i0, i1 = _indices(b, n0, m, oob=False), _indices(b, a.shape[1], m, oob=False)
        expr, shape = f"{a.name}[{_idx_text(i0)}, {_idx_text(i1)}]", (m,) + a.shape[2:]
    elif kind == "mixed_slice" and a.ndim >= 2:
        n1 = a.shape[1]
        st_, sp = b.draw_int(0, n1 - 1), b.draw_int(1, 2)
        expr = f"{a.name}[{_idx_text(_indices(b, n0, m, oob=False))}, {st_}::{sp}]"
        shape = (m, len(range(st_, n1, sp))) + a.shape[2:]
    else:
        expr, shape = f"{a.name}[{_idx_text(_indices(b, n0, m, oob=False))}]", (m,) + a.shape[1:]
    if not _fits(b, shape):
        return False
    b.emit("gather", expr, shape, a.dtype, main=main, **model_of(a))
    return True


def _at_get(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    mode = b.choice(["fill", "clip", "promise_in_bounds"])
    d = b.draw_int(0, a.ndim - 1)
    m = b.draw_int(1, 4)
    idx = _indices(b, a.shape[d], m, oob=mode != "promise_in_bounds")
    main = a
    a = b.replicated(a)
    where = ", ".join([":"] * d + [_idx_text(idx)])
    extra = ""
    model = model_of(a)
    if mode == "fill":
        fill = b.choice([None, -1, 7])
        oob_any = any(not (-a.shape[d] <= i < a.shape[d]) for i in idx)
        if fill is not None:
            extra = f", fill_value={_lit(fill, a.dtype)}"
            if oob_any:
                model = dict(model, lo=min(model["lo"], fill), hi=max(model["hi"], fill))
        elif oob_any:
            # the default fill: NaN for floats, the dtype's extreme for ints, True for bools
            model = dict(model, lo=-math.inf, hi=math.inf) if a.dtype == F32 else (
                int_result(-2.0 ** 31, 2.0 ** 31) if a.dtype == I32 else model)
            if a.dtype == F32:
                model = dict(lo=-math.inf, hi=math.inf, frac=a.frac, err=a.err)
    shape = a.shape[:d] + (m,) + a.shape[d + 1:]
    out_kw, spec = _out_sharding(b, shape)
    b.emit("at_get", f"{a.name}.at[{where}].get(mode={mode!r}{extra}{out_kw})", shape, a.dtype, main=main,
           spec=spec, **model)
    return True


def _take_along_axis(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    m = b.draw_int(1, 4)
    shape = a.shape[:d] + (m,) + a.shape[d + 1:]
    if not _fits(b, shape):
        return False
    vals = _indices(b, a.shape[d], math.prod(shape), oob=False)
    main = a
    a = b.replicated(a)
    b.emit("take_along_axis", f"jnp.take_along_axis({a.name}, {_idx_text(vals)}.reshape({shape!r}), axis={d})",
           shape, a.dtype, main=main, **model_of(a))
    return True


def _scatter(kind: str):
    def op(b: Builder) -> bool:
        pred = (lambda v: v.ndim >= 1 and not v.manual and v.dtype in (F32, I32)) if kind != "set" else \
            (lambda v: v.ndim >= 1 and not v.manual)
        if kind in ("add", "mul"):
            pred = (lambda v: v.ndim >= 1 and _num(v))
        a = b.pick(pred)
        if a is None:
            return False
        d = b.draw_int(0, a.ndim - 1) if b.boolean() else 0
        n = a.shape[d]
        mode = b.choice(["drop", "clip", "promise_in_bounds"])
        m = b.draw_int(1, 4)
        idx = _indices(b, n, m, oob=mode != "promise_in_bounds")
        targets = [min(max(_norm(i, n), 0), n - 1) if mode == "clip" else _norm(i, n) for i in idx]
        live = [t for t in targets if 0 <= t < n]
        if kind == "set" and len(set(live)) != len(live):
            # duplicate targets leave which update wins unspecified: draw distinct ones
            idx = sorted(set(idx), key=idx.index)
            seen, kept = set(), []
            for i in idx:
                t = min(max(_norm(i, n), 0), n - 1) if mode == "clip" else _norm(i, n)
                if 0 <= t < n and t in seen:
                    continue
                seen.add(t)
                kept.append(i)
            idx, m = kept, len(kept)
            targets = [min(max(_norm(i, n), 0), n - 1) if mode == "clip" else _norm(i, n) for i in idx]
            live = [t for t in targets if 0 <= t < n]
        unique = bool(live) and len(set(targets)) == len(targets) and all(0 <= t < n for t in targets)
        if kind == "mul" and b.backward and not unique:
            return False   # JAX differentiates scatter_mul only with unique_indices=True
        ushape = a.shape[:d] + (m,) + a.shape[d + 1:]
        upd = b.pick(lambda v: v.shape == ushape and v.dtype == a.dtype and not v.manual and v.fine)
        if upd is None:
            upd = b.pick(lambda v: v.shape == () and v.dtype == a.dtype and not v.manual and v.fine)
        c = b.choice([2, -1, 3])
        u = _const_model(_lit(c, a.dtype), a.dtype) if upd is None else upd
        utext = _lit(c, a.dtype) if upd is None else upd.name
        main = a
        a = b.replicated(a)
        if upd is not None:
            upd = b.replicated(upd)
            utext = upd.name
        flags = ""
        if unique and (b.boolean() or (kind == "mul" and b.backward)):
            flags += ", unique_indices=True"
        if idx == sorted(idx) and all(i >= 0 for i in idx) and b.boolean():
            flags += ", indices_are_sorted=True"
        where = ", ".join([":"] * d + [_idx_text(idx)])
        dup = max([live.count(t) for t in live] or [1])
        lo, hi = min(a.lo, u.lo), max(a.hi, u.hi)
        if kind == "set":
            model = dict(lo=lo, hi=hi, frac=_maxfrac(a, u), err=max(a.err, u.err))
        elif kind == "add":
            s = sum_result(Val("s", (), a.dtype, lo, hi, _maxfrac(a, u), max(a.err, u.err)), dup + 1)
            model = s
        elif kind == "mul":
            hi_m = max(a.mag, 1.0) * max(u.mag, 1.0) ** dup
            if hi_m > 2.0 ** 20:
                return False
            frac = None if a.frac is None or u.frac is None else a.frac + dup * u.frac
            model = _result(a.dtype, -hi_m, hi_m, frac, (dup + 1) * (a.err + u.err) * hi_m, rounds=frac is None)
        else:
            model = dict(lo=lo, hi=hi, frac=_maxfrac(a, u), err=max(a.err, u.err))
        if a.dtype == BOOL:
            model = dict(lo=0.0, hi=1.0)
        b.emit(f"scatter_{kind}", f"{a.name}.at[{where}].{kind}({utext}, mode={mode!r}{flags})", a.shape, a.dtype,
               main=main, **model)
        return True
    return op


def _start(b: Builder, n: int, size: int) -> str:
    """A start index: a literal (out of range ones are clamped), or one computed from data."""
    ints = [v for v in b.pool if v.dtype == I32 and v.exact and not v.manual and v.size >= 1 and v.mag < 2 ** 30]
    if ints and b.draw_int(0, 3) == 0:
        v = b.replicated(b.choice(ints))
        return f"jnp.clip({v.name}.ravel()[0], -2, {n + 1})"
    return str(b.draw_int(-2, n - size + 2))


def _dynamic_slice(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    sizes = tuple(b.draw_int(1, n) for n in a.shape)
    starts = [_start(b, n, s) for n, s in zip(a.shape, sizes)]
    main = a
    a = b.replicated(a)
    b.emit("dynamic_slice", f"jax.lax.dynamic_slice({a.name}, ({', '.join(starts)},), {sizes!r})", sizes, a.dtype,
           main=main, **model_of(a))
    return True


def _dynamic_update_slice(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    u = b.pick(lambda v: v is not a and v.dtype == a.dtype and v.ndim == a.ndim and not v.manual
               and all(x <= y for x, y in zip(v.shape, a.shape)))
    main = a
    if u is None:
        sizes = tuple(b.draw_int(1, n) for n in a.shape)
        c = b.choice([5, -2])
        u_text = f"jnp.full({sizes!r}, {_lit(c, a.dtype)}, {_jdt(a.dtype)})"
        u_model = _const_model(_lit(c, a.dtype), a.dtype)
    else:
        sizes = u.shape
        u = b.replicated(u)
        u_text, u_model = u.name, u
    a = b.replicated(a)
    starts = [_start(b, n, s) for n, s in zip(a.shape, sizes)]
    model = dict(lo=min(a.lo, u_model.lo), hi=max(a.hi, u_model.hi), frac=_maxfrac(a, u_model),
                 err=max(a.err, u_model.err))
    if a.dtype == BOOL:
        model = dict(lo=0.0, hi=1.0)
    b.emit("dynamic_update_slice", f"jax.lax.dynamic_update_slice({a.name}, {u_text}, ({', '.join(starts)},))",
           a.shape, a.dtype, main=main, **model)
    return True


def _slice(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    parts, shape = [], []
    for n in a.shape:
        step = b.choice([1, 1, 2, 3, -1, -2])
        start = b.draw_int(-n, n - 1) if b.boolean() else None
        stop = b.draw_int(-n, n) if b.boolean() else None
        k = len(range(*slice(start, stop, step).indices(n)))
        if k < 1:
            start, stop, k = None, None, len(range(*slice(None, None, step).indices(n)))
        parts.append(f"{'' if start is None else start}:{'' if stop is None else stop}:{step}")
        shape.append(k)
    main = a
    a = b.replicated(a)
    if b.boolean() and all(p.split(":")[2] in ("1", "2", "3") for p in parts):
        # lax.slice: non-negative starts and limits with strides
        lims = []
        for p, n in zip(parts, a.shape):
            s0, s1, st_ = p.split(":")
            st_ = int(st_)
            lo, hi, _ = slice(int(s0) if s0 else None, int(s1) if s1 else None, st_).indices(n)
            lims.append((lo, max(hi, lo + 1), st_))
        shape = [len(range(lo, hi, st_)) for lo, hi, st_ in lims]
        expr = (f"jax.lax.slice({a.name}, {tuple(x[0] for x in lims)!r}, {tuple(x[1] for x in lims)!r}, "
                f"{tuple(x[2] for x in lims)!r})")
    else:
        expr = f"{a.name}[{', '.join(parts)}]"
    b.emit("slice", expr, tuple(shape), a.dtype, main=main, **model_of(a))
    return True


# -- structural -------------------------------------------------------------------------------------
def _pad(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    cfg, shape = [], []
    for n in a.shape:
        interior = b.choice([0, 0, 1, 2])
        full = n + max(n - 1, 0) * interior
        lo = b.draw_int(-min(full - 1, 3), 3)
        hi = b.draw_int(-min(full - 1 + min(lo, 0), 3), 3)
        out = lo + hi + full
        if out < 1:
            lo, hi, out = 0, 0, full
        cfg.append((lo, hi, interior))
        shape.append(out)
    if not _fits(b, tuple(shape)):
        return False
    c = b.choice([0, -3, 1])
    main = a
    a = b.replicated(a)
    model = model_of(a)
    model = dict(model, lo=min(model["lo"], c), hi=max(model["hi"], c))
    if a.dtype == BOOL:
        model = dict(lo=0.0, hi=1.0)
    b.emit("pad", f"jax.lax.pad({a.name}, jnp.array({_lit(c, a.dtype)}, {_jdt(a.dtype)}), {cfg!r})", tuple(shape),
           a.dtype, main=main, **model)
    return True


def _jnp_pad(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    mode = b.choice(["constant", "edge", "reflect", "symmetric", "wrap"])
    widths, shape = [], []
    for n in a.shape:
        top = 2 if mode in ("constant", "edge", "wrap") else min(2, n - 1)
        lo, hi = b.draw_int(0, max(top, 0)), b.draw_int(0, max(top, 0))
        widths.append((lo, hi))
        shape.append(n + lo + hi)
    if not _fits(b, tuple(shape)):
        return False
    main = a
    a = b.replicated(a)
    b.emit("jnp_pad", f"jnp.pad({a.name}, {widths!r}, mode={mode!r})", tuple(shape), a.dtype, main=main,
           **(dict(model_of(a), lo=min(a.lo, 0.0), hi=max(a.hi, 0.0)) if mode == "constant" else model_of(a)))
    return True


def _concatenate(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    same = lambda v: (v.dtype == a.dtype and v.ndim == a.ndim and not v.manual  # noqa: E731
                      and all(x == y for k, (x, y) in enumerate(zip(v.shape, a.shape)) if k != d))
    parts = [a]
    for _ in range(b.draw_int(1, 2)):
        parts.append(b.pick(same) or a)
    shape = a.shape[:d] + (sum(p.shape[d] for p in parts),) + a.shape[d + 1:]
    if not _fits(b, shape):
        return False
    main = a
    parts = [b.replicated(p) for p in parts]
    model = dict(lo=min(p.lo for p in parts), hi=max(p.hi for p in parts),
                 frac=None if any(p.frac is None for p in parts) else max(p.frac for p in parts),
                 err=max(p.err for p in parts))
    if a.dtype == BOOL:
        model = dict(lo=0.0, hi=1.0)
    b.emit("concatenate", f"jnp.concatenate([{', '.join(p.name for p in parts)}], axis={d})", shape, a.dtype,
           main=main, **model)
    return True


def _divisors(n: int) -> list:
    return [k for k in range(2, n) if n % k == 0]


def _reshape(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual and v.size >= 1)
    if a is None:
        return False
    kinds = ["flatten"]
    if any(_divisors(n) for n in a.shape) and a.ndim < MAX_RANK:
        kinds.append("split")
    if a.ndim >= 2:
        kinds.append("merge")
    kind = b.choice(kinds)
    if kind == "split":
        d = b.choice([k for k, n in enumerate(a.shape) if _divisors(n)])
        f = b.choice(_divisors(a.shape[d]))
        shape = a.shape[:d] + (f, a.shape[d] // f) + a.shape[d + 1:]
    elif kind == "merge":
        d = b.draw_int(0, a.ndim - 2)
        shape = a.shape[:d] + (a.shape[d] * a.shape[d + 1],) + a.shape[d + 2:]
    else:
        shape = (a.size,)
    main = a
    a = b.replicated(a)
    out_kw, spec = _out_sharding(b, shape)
    if b.boolean() or out_kw:
        expr = f"jnp.reshape({a.name}, {shape!r}{out_kw})"
    else:
        expr = f"{a.name}.reshape({shape!r})"
    b.emit("reshape", expr, shape, a.dtype, main=main, spec=spec, **model_of(a))
    return True


def _transpose(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 2 and not v.manual)
    if a is None:
        return False
    perm = tuple(b.draw_permutation(a.ndim))
    spec = None if a.spec is None else tuple(a.spec[p] for p in perm)
    b.emit("transpose", f"jnp.transpose({a.name}, {perm!r})", tuple(a.shape[p] for p in perm), a.dtype, main=a,
           spec=spec, **model_of(a))
    return True


def _broadcast(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.ndim < MAX_RANK)
    if a is None:
        return False
    main = a
    a = b.replicated(a)
    if b.boolean() or a.ndim == 0:
        k = b.draw_int(1, 3)
        shape = (k,) + a.shape
        expr = f"jnp.broadcast_to({a.name}, {shape!r})"
    else:
        # broadcast_in_dim: keep the operand's dims in order, insert one, grow size-1 dims
        pos = b.draw_int(0, a.ndim)
        k = b.draw_int(1, 3)
        out = list(a.shape)
        out.insert(pos, k)
        dims = tuple(i if i < pos else i + 1 for i in range(a.ndim))
        for i, n in enumerate(a.shape):
            if n == 1 and b.boolean():
                out[dims[i]] = b.draw_int(2, 3)
        shape = tuple(out)
        expr = f"jax.lax.broadcast_in_dim({a.name}, {shape!r}, {dims!r})"
    if not _fits(b, shape):
        return False
    b.emit("broadcast", expr, shape, a.dtype, main=main, **model_of(a))
    return True


def _squeeze(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and 1 in v.shape)
    if a is None:
        return False
    d = b.choice([k for k, n in enumerate(a.shape) if n == 1])
    main = a
    a = b.replicated(a)
    b.emit("squeeze", f"jnp.squeeze({a.name}, axis={d})", a.shape[:d] + a.shape[d + 1:], a.dtype, main=main,
           **model_of(a))
    return True


def _expand_dims(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.ndim < MAX_RANK)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim)
    main = a
    a = b.replicated(a)
    b.emit("expand_dims", f"jnp.expand_dims({a.name}, {d})", a.shape[:d] + (1,) + a.shape[d:], a.dtype, main=main,
           **model_of(a))
    return True


def _rev(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    dims = tuple(sorted(set(b.draw_int(0, a.ndim - 1) for _ in range(b.draw_int(1, a.ndim)))))
    main = a
    a = b.replicated(a)
    expr = f"jax.lax.rev({a.name}, {dims!r})" if b.boolean() else f"jnp.flip({a.name}, {dims!r})"
    b.emit("rev", expr, a.shape, a.dtype, main=main, **model_of(a))
    return True


def _iota(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim >= 1)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    n = a.shape[d]
    iota = f"jax.lax.broadcasted_iota({_jdt(a.dtype)}, {a.shape!r}, {d})"
    lo, hi = a.lo, a.hi + n - 1
    b.emit("iota", f"{a.name} + {iota}", a.shape, a.dtype, main=a, spec=_keep_spec(b, a),
           **_result(a.dtype, lo, hi, a.frac, a.err))
    return True


def _roll(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    shift = b.draw_int(-a.shape[d] - 1, a.shape[d] + 1)
    main = a
    a = b.replicated(a)
    b.emit("roll", f"jnp.roll({a.name}, {shift}, axis={d})", a.shape, a.dtype, main=main, **model_of(a))
    return True


def _tile_repeat(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 1 and not v.manual)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    r = b.draw_int(2, 3)
    shape = a.shape[:d] + (a.shape[d] * r,) + a.shape[d + 1:]
    if not _fits(b, shape):
        return False
    main = a
    a = b.replicated(a)
    if b.boolean():
        reps = tuple(r if k == d else 1 for k in range(a.ndim))
        expr, op = f"jnp.tile({a.name}, {reps!r})", "tile"
    else:
        expr, op = f"jnp.repeat({a.name}, {r}, axis={d})", "repeat"
    b.emit(op, expr, shape, a.dtype, main=main, **model_of(a))
    return True


def _triangle(b: Builder) -> bool:
    a = b.pick(lambda v: v.ndim >= 2 and _num(v))
    if a is None:
        return False
    fn = b.choice(["tril", "triu"])
    k = b.draw_int(-1, 1)
    main = a
    a = b.replicated(a)
    b.emit("tril_triu", f"jnp.{fn}({a.name}, {k})", a.shape, a.dtype, main=main,
           **dict(model_of(a), lo=min(a.lo, 0.0), hi=max(a.hi, 0.0)))
    return True


# -- conversions ------------------------------------------------------------------------------------
def _convert(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.fine)
    if a is None:
        return False
    if a.dtype == BOOL:
        to = b.choice([F32, I32])
        b.emit("convert", f"{a.name}.astype({_jdt(to)})", a.shape, to, main=a, spec=_keep_spec(b, a),
               lo=0.0, hi=1.0, frac=0, err=0.0)
        return True
    kinds = ["bfloat16", "float16", "bool"]
    if a.dtype == F32 and a.exact and a.mag < 2.0 ** 30:
        kinds.append("int32")
    if a.dtype == I32:
        kinds.append("float32")
    kind = b.choice(kinds)
    if kind == "bool":
        if not a.exact:
            return False
        b.emit("convert", f"{a.name}.astype(jnp.bool_)", a.shape, BOOL, main=a, spec=_keep_spec(b, a), lo=0.0, hi=1.0)
    elif kind == "int32":
        b.emit("convert", f"{a.name}.astype(jnp.int32)", a.shape, I32, main=a, spec=_keep_spec(b, a),
               **int_result(math.floor(a.lo), math.ceil(a.hi)))
    elif kind == "float32":
        b.emit("convert", f"{a.name}.astype(jnp.float32)", a.shape, F32, main=a, spec=_keep_spec(b, a),
               **float_result(a.lo, a.hi, 0, 0.0))
    else:
        bits = 8 if kind == "bfloat16" else 11
        if a.dtype == I32:
            back, dt = "jnp.int32", I32
        else:
            back, dt = "jnp.float32", F32
        if kind == "float16" and a.mag > 60000:
            return False
        mag = a.mag
        exact = a.exact and a.frac is not None and mag * 2.0 ** a.frac <= 2.0 ** bits and (kind != "float16" or
                                                                                          a.frac <= 14)
        if dt == I32 and not exact:
            return False   # float -> int of a rounded value: a step function of the rounding
        err = 0.0 if exact else a.err + mag * 2.0 ** -(bits - 1)
        b.emit("convert", f"{a.name}.astype(jnp.{kind}).astype({back})", a.shape, dt, main=a,
               spec=_keep_spec(b, a), lo=a.lo, hi=a.hi, frac=a.frac, err=err)
    return True


def _bitcast(b: Builder) -> bool:
    a = b.pick(lambda v: not v.manual and v.dtype in (F32, I32) and v.exact)
    if a is None:
        return False
    if a.dtype == F32:
        # zeros normalised first: the sign of a zero is left open by several ops (x + 0 folding)
        expr = f"jax.lax.bitcast_convert_type(jnp.where({a.name} == 0, jnp.float32(0), {a.name}), jnp.int32)"
        b.emit("bitcast", expr, a.shape, I32, main=a, spec=_keep_spec(b, a), **int_result(-2.0 ** 31, 2.0 ** 31))
    else:
        # mantissa bits under exponent 0: floats in [1, 2) with 23 fraction bits
        expr = f"jax.lax.bitcast_convert_type(({a.name} & 0x7FFFFF) | 0x3F800000, jnp.float32)"
        b.emit("bitcast", expr, a.shape, F32, main=a, spec=_keep_spec(b, a), lo=1.0, hi=2.0, frac=23, err=0.0)
    return True


# -- fft and convolution ----------------------------------------------------------------------------
def _fft(b: Builder) -> bool:
    a = b.pick(lambda v: _flt(v) and v.ndim >= 1 and v.mag <= 2 ** 12)
    if a is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    n = a.shape[d]
    main = a
    a = b.replicated(a)
    kind = b.choice(["real", "imag", "roundtrip", "ifft_real"])
    if kind == "roundtrip":
        expr = f"jnp.fft.irfft(jnp.fft.rfft({a.name}, axis={d}), n={n}, axis={d})"
        lo, hi = a.lo, a.hi
    elif kind == "ifft_real":
        expr = f"jnp.real(jnp.fft.ifft({a.name}, axis={d}))"
        lo, hi = -a.mag, a.mag
    else:
        expr = f"jnp.{kind}(jnp.fft.fft({a.name}, axis={d}))"
        lo, hi = -n * a.mag, n * a.mag
    err = n * a.err + 16 * n * max(a.mag, 1.0) * (math.log2(n) + 1) * 2.0 ** -24
    b.emit("fft", expr, a.shape, F32, main=main, lo=lo, hi=hi, frac=None, err=err)
    return True


def _conv(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim in (3, 4) and v.dtype == F32)
    if a is None:
        return False
    sp = a.ndim - 2
    nhwc = b.boolean()
    c = a.shape[-1] if nhwc else a.shape[1]
    groups = b.choice([g for g in (1, 2, 3) if c % g == 0])
    o_feat = groups * b.draw_int(1, 2)
    spatial_in = a.shape[1:-1] if nhwc else a.shape[2:]
    ks, strides, pads, ldil, rdil, out_sp = [], [], [], [], [], []
    for n in spatial_in:
        k = b.draw_int(1, min(3, n + 2))
        s = b.draw_int(1, 2)
        lo, hi = b.draw_int(0, 1), b.draw_int(0, 1)
        ld = 1 if b.backward else b.choice([1, 1, 2])
        rd = b.choice([1, 1, 2])
        out = _window_out(n, k, s, lo, hi, ld, rd)
        if out < 1:
            k, s, lo, hi, ld, rd, out = 1, 1, 0, 0, 1, 1, n
        ks.append(k), strides.append(s), pads.append((lo, hi)), ldil.append(ld), rdil.append(rd), out_sp.append(out)
    shape = (a.shape[0],) + (tuple(out_sp) + (o_feat,) if nhwc else (o_feat,) + tuple(out_sp))
    if not _fits(b, shape):
        return False
    rshape = (o_feat, c // groups) + tuple(ks)
    letters = "HW"[:sp] if sp == 2 else "H"
    dn = (f"NC{letters}", f"OI{letters}", f"NC{letters}") if not nhwc else \
        (f"N{letters}C", f"OI{letters}", f"N{letters}C")
    main = a
    a = b.replicated(a)
    kernel = f"(jnp.arange({math.prod(rshape)}, dtype=jnp.float32).reshape({rshape!r}) % 3 - 1)"
    expr = (f"jax.lax.conv_general_dilated({a.name}, {kernel}, {tuple(strides)!r}, {pads!r}, "
            f"lhs_dilation={tuple(ldil)!r}, rhs_dilation={tuple(rdil)!r}, dimension_numbers={dn!r}, "
            f"feature_group_count={groups})")
    terms = (c // groups) * math.prod(ks)
    model = sum_result(a, terms)
    b.emit("conv", expr, shape, F32, main=main, **model)
    return True


# -- control flow -----------------------------------------------------------------------------------
def _scan(b: Builder) -> bool:
    xs = b.pick(lambda v: _num(v) and v.ndim >= 1)
    if xs is None:
        return False
    n = xs.shape[0]
    main = xs
    xs = b.replicated(xs)
    body = b.choice(["add", "max", "halve"])
    rev = b.boolean()
    fn = {"add": "c + x", "max": "jnp.maximum(c, x)", "halve": "c * 0.5 + x" if xs.dtype == F32 else "c // 2 + x"}[body]
    expr = (f"jax.lax.scan(lambda c, x: ({fn}, c * 2), jnp.zeros({xs.shape[1:]!r}, {xs.name}.dtype), "
            f"{xs.name}, reverse={rev})")
    if body == "max":
        cm = dict(lo=min(xs.lo, 0.0), hi=max(xs.hi, 0.0), frac=xs.frac, err=xs.err)
    elif body == "add":
        cm = sum_result(xs, n)
    else:
        s = sum_result(xs, n)
        cm = dict(s, frac=None if xs.frac is None else xs.frac + n) if xs.dtype == F32 else s
        if xs.dtype == F32:
            cm = float_result(-2 * xs.mag, 2 * xs.mag, cm["frac"], 2 * xs.err + (n + 1) * ulp(2 * xs.mag))
    ys = dict(cm, lo=2 * cm["lo"], hi=2 * cm["hi"], err=2 * cm["err"])
    b.emit_multi("scan", expr, [(xs.shape[1:], xs.dtype, None, cm), (xs.shape, xs.dtype, None, ys)], main=main)
    return True


def _fori_loop(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim >= 1)
    if a is None:
        return False
    trips = b.draw_int(0, 3)
    d = b.draw_int(0, a.ndim - 1)
    body = b.choice(["flip_add", "roll", "scale"])
    if body == "flip_add":
        fn = f"jnp.flip(c, {d}) + i.astype(c.dtype)"
        m = _result(a.dtype, a.lo, a.hi + trips, a.frac, a.err)
    elif body == "roll":
        fn = f"jnp.roll(c, 1, axis={d})"
        m = model_of(a)
    else:
        fn = "c * 2 - 1"
        hi = (a.mag + 1) * 2 ** trips
        if hi > 2 ** 20:
            return False
        m = _result(a.dtype, -hi, hi, a.frac, a.err * 2 ** trips)
    main, a = a, b.replicated(a)
    b.emit("fori_loop", f"jax.lax.fori_loop(0, {trips}, lambda i, c: {fn}, {a.name})", a.shape, a.dtype, main=main, **m)
    return True


def _while_loop(b: Builder) -> bool:
    if b.backward:
        return False   # reverse-mode differentiation of while_loop is not defined
    a = b.pick(lambda v: _exact_num(v) and v.ndim >= 1)
    if a is None:
        return False
    limit = b.draw_int(1, 4)
    bound = b.choice([50, 100])
    main, a = a, b.replicated(a)
    expr = (f"jax.lax.while_loop(lambda s: (s[0] < {limit}) & (jnp.max(s[1]) < {bound}), "
            f"lambda s: (s[0] + 1, s[1] * 2 + 1), (jnp.int32(0), {a.name}))[1]")
    hi = (a.mag + 1) * 2 ** limit
    b.emit("while_loop", expr, a.shape, a.dtype, main=main, **_result(a.dtype, -hi, hi, a.frac, 0.0))
    return True


def _pred(b: Builder) -> str | None:
    src = b.pick(lambda v: _exact_num(v) and v.ndim >= 1)
    if src is None:
        return None
    return f"jnp.sum({src.name}) > {_lit(b.choice([0, 2, -1]), src.dtype)}"


def _cond(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim >= 1)
    pred = _pred(b)
    if a is None or pred is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main, a = a, b.replicated(a)
    expr = f"jax.lax.cond({pred}, lambda x: x * 2, lambda x: jnp.flip(x, {d}) - 1, {a.name})"
    b.emit("cond", expr, a.shape, a.dtype, main=main,
           **_result(a.dtype, min(2 * a.lo, a.lo - 1), max(2 * a.hi, a.hi - 1), a.frac, 2 * a.err))
    return True


def _switch(b: Builder) -> bool:
    a = b.pick(lambda v: _num(v) and v.ndim >= 1)
    src = b.pick(lambda v: v.dtype == I32 and v.exact and v.size >= 1 and not v.manual and v.mag < 2 ** 30)
    if a is None or src is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main, a, src = a, b.replicated(a), b.replicated(src)
    expr = (f"jax.lax.switch(jnp.clip({src.name}.ravel()[0], 0, 2), [lambda x: x + 1, lambda x: -x, "
            f"lambda x: jnp.roll(x, 1, axis={d})], {a.name})")
    b.emit("switch", expr, a.shape, a.dtype, main=main, **_result(a.dtype, min(a.lo, -a.hi), max(a.hi + 1, -a.lo),
                                                                 a.frac, a.err))
    return True


_CUSTOM_JVP = '''\
@jax.custom_jvp
def _cj(x):
    return x * jnp.abs(x) + 1


@_cj.defjvp
def _cj_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _cj(x), 2 * jnp.abs(x) * t
'''


def _custom_jvp(b: Builder) -> bool:
    a = b.pick(lambda v: _flt(v) and v.mag <= 2 ** 10)
    if a is None:
        return False
    b.helpers["_cj"] = _CUSTOM_JVP
    m = a.mag
    b.emit("custom_jvp", f"_cj({a.name})", a.shape, F32, main=a, spec=_keep_spec(b, a),
           **float_result(-m * m + 1, m * m + 1, None if a.frac is None else 2 * a.frac, 2 * m * a.err + a.err ** 2))
    return True


# -- sharding ops -----------------------------------------------------------------------------------
def _wsc(b: Builder) -> bool:
    if b.explicit:
        return False
    a = b.pick(lambda v: not v.manual)
    if a is None:
        return False
    b.constrain(a, b.draw_spec(a.shape, dividing=False, allow_unconstrained=True))
    return True


def _reshard(b: Builder) -> bool:
    if not b.explicit:
        return False
    a = b.pick(lambda v: not v.manual)
    if a is None:
        return False
    b.reshard(a, b.draw_spec(a.shape, dividing=True))
    return True


def _shard_map(coll: str):
    def op(b: Builder) -> bool:
        names = list(b.mesh.axis_names)
        axes = tuple(b.draw_permutation_of(names)[: b.draw_int(1, len(names))])
        if coll == "ppermute":
            axes = tuple(sorted(axes, key=names.index))
        n = b.axis_size(axes)
        ok = lambda v: (v.ndim >= 1 and not v.manual and v.dtype in (F32, I32) and v.fine  # noqa: E731
                        and any(s % n == 0 for s in v.shape))
        a = b.pick(ok)
        if a is None:
            return False
        d = b.choice([k for k, s in enumerate(a.shape) if s % n == 0])
        local = list(a.shape)
        local[d] //= n
        in_spec = tuple(axes if k == d else () for k in range(a.ndim))
        ax = axes[0] if len(axes) == 1 else axes
        out_spec = in_spec
        if coll == "psum":
            body, shape, m = f"jax.lax.psum(x, {ax!r})", tuple(local), sum_result(a, n)
            out_spec = ((),) * a.ndim
        elif coll == "pmax":
            body, shape, m = f"jax.lax.pmax(x, {ax!r})", tuple(local), model_of(a)
            out_spec = ((),) * a.ndim
        elif coll == "all_gather":
            # all_gather's result still varies over the axes (vma typing): every device's
            # gathered copy, side by side along dimension d
            shape = a.shape[:d] + (a.shape[d] * n,) + a.shape[d + 1:]
            if not _fits(b, shape):
                return False
            body, m = f"jax.lax.all_gather(x, {ax!r}, axis={d}, tiled=True)", model_of(a)
        elif coll == "ppermute":
            shift = b.draw_int(1, max(n - 1, 1))
            perm = [(i, (i + shift) % n) for i in range(n)]
            body, shape, m = f"jax.lax.ppermute(x, {ax!r}, perm={perm!r})", a.shape, model_of(a)
        elif coll == "axis_index":
            body = f"x + jax.lax.axis_index({ax!r}).astype(x.dtype)"
            shape, m = a.shape, _result(a.dtype, a.lo, a.hi + n - 1, a.frac, a.err)
        elif coll in ("psum_scatter", "all_to_all"):
            d2s = [k for k in range(a.ndim) if local[k] % n == 0]
            if not d2s:
                return False
            d2 = b.choice(d2s)
            out_spec = tuple(axes if k == d2 else () for k in range(a.ndim))
            if coll == "psum_scatter":
                body = f"jax.lax.psum_scatter(x, {ax!r}, scatter_dimension={d2}, tiled=True)"
                shape = list(local)
                shape = tuple(shape)
                m = sum_result(a, n)
            else:
                body = f"jax.lax.all_to_all(x, {ax!r}, {d2}, {d}, tiled=True)"
                shape = list(local)
                shape[d] *= n
                shape[d2] //= n
                shape[d2] *= n
                shape = tuple(shape)
                m = model_of(a)
        else:
            raise AssertionError(coll)
        main = a
        if b.explicit and a.spec != in_spec:
            a = b.reshard(a, in_spec)   # shard_map on Explicit axes takes inputs typed as its in_specs
        manual = set(axes) if b.boolean() or len(axes) < len(names) else None
        kw = "" if manual is None else f", axis_names={set(sorted(manual))!r}"
        expr = (f"jax.shard_map(lambda x: {body}, in_specs={spec_text(in_spec)}, out_specs={spec_text(out_spec)}"
                f"{kw})({a.name})")
        v = b.emit(f"shard_map_{coll}", expr, shape, a.dtype, main=main, spec=None if b.explicit else (), **m)
        if b.explicit:
            # the result's type over the axes that stay Explicit is JAX's to infer: state one
            v.spec = None
            b.reshard(v, ((),) * len(shape))
            b.pool.remove(v)
        else:
            v.spec = None
        return True
    return op


OPS = {
    # elementwise arithmetic
    "add": _binary("add"), "sub": _binary("sub"), "mul": _binary("mul"), "div": _div, "rem": _rem,
    "max": _maxmin("max"), "min": _maxmin("min"),
    "neg": _unary("neg", "-{a}", _neg), "abs": _unary("abs", "jnp.abs({a})", _abs),
    "square": _unary("square", "jnp.square({a})", _square), "integer_pow": _unary("integer_pow", "{a} ** 3", _cube),
    "floor": _unary("floor", "jnp.floor({a})", _rounding), "ceil": _unary("ceil", "jnp.ceil({a})", _rounding),
    "round": _unary("round", "jnp.round({a})", _rounding), "sign": _unary("sign", "jnp.sign({a})", _sign),
    "relu": _unary("relu", "jax.nn.relu({a})", _relu),
    "compare": _compare, "select": _select, "clamp": _clamp, "logical": _logical, "bitwise": _bitwise,
    # transcendentals
    **{k: _transcendental(k, *v) for k, v in _TRANSCENDENTALS.items()}, "atan2": _atan2,
    # linear algebra
    "dot_general": _dot_like("dot_general"), "einsum": _dot_like("einsum"), "matmul": _matmul,
    # reductions
    "sum": _reduction("sum"), "mean": _reduction("mean"), "prod": _reduction("prod"),
    "reduce_max": _reduction("reduce_max"), "reduce_min": _reduction("reduce_min"), "any_all": _reduction("any_all"),
    "argmax": _argminmax("argmax"), "argmin": _argminmax("argmin"), "logsumexp": _logsumexp, "softmax": _softmax,
    # cumulative and windowed
    "cumsum": _cumulative("cumsum"), "cumprod": _cumulative("cumprod"), "cummax": _cumulative("cummax"),
    "cummin": _cumulative("cummin"), "cumlogsumexp": _cumulative("cumlogsumexp"), "reduce_window": _reduce_window,
    # sorting
    "sort": _sort, "argsort": _argsort, "sort_multi": _sort_multi, "top_k": _top_k,
    # indexing
    "gather": _gather, "at_get": _at_get, "take_along_axis": _take_along_axis,
    "scatter_set": _scatter("set"), "scatter_add": _scatter("add"), "scatter_mul": _scatter("mul"),
    "scatter_min": _scatter("min"), "scatter_max": _scatter("max"),
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice, "slice": _slice,
    # structural
    "pad": _pad, "jnp_pad": _jnp_pad, "concatenate": _concatenate, "reshape": _reshape, "transpose": _transpose,
    "broadcast": _broadcast, "squeeze": _squeeze, "expand_dims": _expand_dims, "rev": _rev, "iota": _iota,
    "roll": _roll, "tile_repeat": _tile_repeat, "tril_triu": _triangle,
    # conversions
    "convert": _convert, "bitcast": _bitcast,
    # fft, convolution
    "fft": _fft, "conv": _conv,
    # control flow and custom rules
    "scan": _scan, "fori_loop": _fori_loop, "while_loop": _while_loop, "cond": _cond, "switch": _switch,
    "custom_jvp": _custom_jvp,
    # sharding
    "with_sharding_constraint": _wsc, "reshard": _reshard,
    **{f"shard_map_{c}": _shard_map(c) for c in ("psum", "pmax", "all_gather", "ppermute", "axis_index",
                                                  "psum_scatter", "all_to_all")},
}

#: Ops whose derivative jumps (ties, corners, clips): under grad / vjp they take exact values only.
KINKED = frozenset({"max", "min", "abs", "relu", "clamp", "select", "floor", "ceil", "round", "sign", "rem", "div",
                    "reduce_max", "reduce_min", "cummax", "cummin", "reduce_window", "sort", "sort_multi", "top_k",
                    "scatter_min", "scatter_max", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt"})
#: Ops a reverse-mode derivative cannot go through (JAX has no transpose or JVP rule for them: while_loop,
#: bitcast_convert_type, pmax).
NOT_DIFFERENTIABLE = ("while_loop", "bitcast", "shard_map_pmax")
#: Ops whose name in the coverage table differs from the drawer's (one drawer, two jnp functions).
ALIASES = {"tile_repeat": ("tile", "repeat")}
