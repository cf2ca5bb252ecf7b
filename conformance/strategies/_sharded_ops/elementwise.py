"""Elementwise ops: arithmetic, comparisons, select / clamp, logical and bit operations,
and transcendentals (under refsim's accuracy contract)."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import BOOL, F32, I32, Builder, float_result, int_result, ulp
from conformance.strategies._sharded_ops.common import (
    const_model, exact_numeric, floating, jnp_dtype, keep_spec, literal, max_frac, numeric, partner, result_model,
)


def _unary(name: str, fmt: str, model):
    def op(b: Builder) -> bool:
        a = b.pick(numeric)
        if a is None:
            return False
        m = model(a)
        if m is None:
            return False
        b.emit(name, fmt.format(a=a.name), a.shape, a.dtype, main=a, spec=keep_spec(b, a), **m)
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
        a = b.pick(numeric)
        if a is None:
            return False
        text, v = partner(b, a)
        o = v if v is not None else const_model(text, a.dtype)
        if name == "add":
            lo, hi, frac = a.lo + o.lo, a.hi + o.hi, max_frac(a, o)
            err = a.err + o.err
        elif name == "sub":
            lo, hi, frac = a.lo - o.hi, a.hi - o.lo, max_frac(a, o)
            err = a.err + o.err
        else:
            ps = [a.lo * o.lo, a.lo * o.hi, a.hi * o.lo, a.hi * o.hi]
            lo, hi = min(ps), max(ps)
            frac = None if a.frac is None or o.frac is None else a.frac + o.frac
            err = a.mag * o.err + o.mag * a.err + a.err * o.err
        b.emit(name, f"{a.name} {sym} {text}", a.shape, a.dtype, main=a, spec=keep_spec(b, a),
               **result_model(a.dtype, lo, hi, frac, err))
        return True
    return op



def _div(b: Builder) -> bool:
    a = b.pick(numeric)
    if a is None:
        return False
    if a.dtype == I32:
        k = b.choice([2, 3, 5, 7])
        kind = b.choice(["floor_divide", "remainder", "lax_div", "lax_rem"])
        expr = {"floor_divide": f"{a.name} // {k}", "remainder": f"jnp.remainder({a.name}, {k})",
                "lax_div": f"jax.lax.div({a.name}, jnp.int32({k}))",
                "lax_rem": f"jax.lax.rem({a.name}, jnp.int32({k}))"}[kind]
        lo, hi = (a.lo / k - 1, a.hi / k + 1) if "div" in kind else (-(k - 1), k - 1)
        b.emit("div", expr, a.shape, I32, main=a, spec=keep_spec(b, a), **int_result(math.floor(lo), math.ceil(hi)))
        return True
    text, v = partner(b, a)
    if v is None:
        d = abs(float(text)) or 1.0
        b.emit("div", f"{a.name} / {abs(float(text)) or 1.0!r}", a.shape, F32, main=a, spec=keep_spec(b, a),
               **float_result(a.lo / d if a.lo < 0 else a.lo / (d + 1e9), a.hi / d, None, a.err / d, rounds=True))
        return True
    # the divisor is at least 1, so the quotient's error is bounded by the dividend's
    err = a.err + a.mag * v.err
    b.emit("div", f"{a.name} / (jnp.abs({text}) + 1)", a.shape, F32, main=a, spec=keep_spec(b, a),
           **float_result(min(a.lo, 0.0), max(a.hi, 0.0), None, err, rounds=True))
    return True


def _rem(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v) and v.dtype == F32 and v.exact)
    if a is None:
        return False
    c = b.choice([2.0, 3.0, 0.75, 1.5])
    if b.boolean():
        expr, lo, hi = f"jnp.remainder({a.name}, {c!r})", 0.0, c
    else:
        expr, lo, hi = f"jax.lax.rem({a.name}, jnp.float32({c!r}))", -c, c
    frac = None if a.frac is None else max(a.frac, 2)
    b.emit("rem", expr, a.shape, F32, main=a, spec=keep_spec(b, a), lo=lo, hi=hi, frac=frac, err=0.0)
    return True


def _maxmin(name: str):
    fn = {"max": "jnp.maximum", "min": "jnp.minimum"}[name]

    def op(b: Builder) -> bool:
        a = b.pick(numeric)
        if a is None:
            return False
        text, v = partner(b, a)
        o = v if v is not None else const_model(text, a.dtype)
        if name == "max":
            lo, hi = max(a.lo, o.lo), max(a.hi, o.hi)
        else:
            lo, hi = min(a.lo, o.lo), min(a.hi, o.hi)
        b.emit(name, f"{fn}({a.name}, {text})", a.shape, a.dtype, main=a, spec=keep_spec(b, a),
               lo=lo, hi=hi, frac=max_frac(a, o), err=max(a.err, o.err))
        return True
    return op


def _compare(b: Builder) -> bool:
    a = b.pick(exact_numeric)
    if a is None:
        return False
    text, _ = partner(b, a, exact=True)
    sym = b.choice(["<", "<=", ">", ">=", "==", "!="])
    b.emit("compare", f"{a.name} {sym} {text}", a.shape, BOOL, main=a, spec=keep_spec(b, a), lo=0.0, hi=1.0)
    return True


def _select(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v))
    if a is None:
        return False
    preds = [v for v in b.pool if v.dtype == BOOL and v.shape == a.shape and not v.manual]
    if preds and b.boolean():
        p = b.same_spec(b.choice(preds), a)
        pred = p.name
    else:
        src = b.pick(lambda v: exact_numeric(v) and v.shape == a.shape)
        if src is None:
            return False
        src = b.same_spec(src, a)
        pred = f"{src.name} > {literal(b.choice([0, 1, -1]), src.dtype)}"
    text, v = partner(b, a)
    o = v if v is not None else const_model(text, a.dtype)
    if v is None:
        text = f"jnp.full_like({a.name}, {text})"
    b.emit("select", f"jnp.where({pred}, {a.name}, {text})", a.shape, a.dtype, main=a, spec=keep_spec(b, a),
           lo=min(a.lo, o.lo), hi=max(a.hi, o.hi), frac=max_frac(a, o), err=max(a.err, o.err))
    return True


def _clamp(b: Builder) -> bool:
    a = b.pick(numeric)
    if a is None:
        return False
    lo = b.choice([-4, -1, 0, 2])
    hi = lo + b.choice([0, 1, 3, 8])
    if b.boolean():
        expr = f"jax.lax.clamp({jnp_dtype(a.dtype)}({lo}), {a.name}, {jnp_dtype(a.dtype)}({hi}))"
    else:
        expr = f"jnp.clip({a.name}, {lo}, {hi})"
    b.emit("clamp", expr, a.shape, a.dtype, main=a, spec=keep_spec(b, a),
           lo=float(lo), hi=float(hi), frac=a.frac, err=a.err)
    return True


def _logical(b: Builder) -> bool:
    a = b.pick(lambda v: v.dtype == BOOL and not v.manual)
    if a is None:
        return False
    kind = b.choice(["and", "or", "xor", "not"])
    if kind == "not":
        b.emit("logical", f"jnp.logical_not({a.name})", a.shape, BOOL, main=a, spec=keep_spec(b, a), lo=0.0, hi=1.0)
        return True
    o = b.pick(lambda v: v.dtype == BOOL and v.shape == a.shape and not v.manual) or a
    o = b.same_spec(o, a)
    b.emit("logical", f"jnp.logical_{kind}({a.name}, {o.name})", a.shape, BOOL, main=a, spec=keep_spec(b, a),
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
    b.emit("bitwise", expr, a.shape, I32, main=a, spec=keep_spec(b, a), **int_result(-2.0 ** 31, 2.0 ** 31))
    return True


# -- transcendentals: (jnp source with {a}, Lipschitz constant on the domain, range, refsim accuracy name)
def _transcendental(name: str, fmt: str, lip, rng, acc: str):
    def op(b: Builder) -> bool:
        a = b.pick(lambda v: floating(v) and v.mag <= 1e4)
        if a is None:
            return False
        from refsim.interpreter.accuracy import ACCURACY

        lo, hi = rng(a)
        mag = max(abs(lo), abs(hi), 1e-30)
        ulps = ACCURACY[acc].refsim_vs_xla_f32 + ACCURACY[acc].refsim_vs_correct + 2
        err = lip(a) * a.err + ulps * ulp(mag)
        b.emit(name, fmt.format(a=a.name), a.shape, F32, main=a, spec=keep_spec(b, a),
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
    a = b.pick(lambda v: floating(v) and v.exact)
    if a is None:
        return False
    o = b.pick(lambda v: floating(v) and v.exact and v.shape == a.shape) or a
    o = b.same_spec(o, a)
    b.emit("atan2", f"jnp.arctan2({a.name}, {o.name})", a.shape, F32, main=a, spec=keep_spec(b, a),
           lo=-math.pi, hi=math.pi, frac=None, err=4 * ulp(math.pi))
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {
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
}
