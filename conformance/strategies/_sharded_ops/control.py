"""Control flow with sharded carries (scan, fori_loop, while_loop, cond, switch) and a
custom_jvp function."""
from __future__ import annotations

from conformance.strategies._sharded_graph import F32, I32, Builder, float_result, model_of, sum_result, ulp
from conformance.strategies._sharded_ops.common import (
    exact_numeric, floating, keep_spec, literal, numeric, result_model,
)


def _scan(b: Builder) -> bool:
    xs = b.pick(lambda v: numeric(v) and v.ndim >= 1)
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
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1)
    if a is None:
        return False
    trips = b.draw_int(0, 3)
    d = b.draw_int(0, a.ndim - 1)
    body = b.choice(["flip_add", "roll", "scale"])
    if body == "flip_add":
        fn = f"jnp.flip(c, {d}) + i.astype(c.dtype)"
        m = result_model(a.dtype, a.lo, a.hi + trips, a.frac, a.err)
    elif body == "roll":
        fn = f"jnp.roll(c, 1, axis={d})"
        m = model_of(a)
    else:
        fn = "c * 2 - 1"
        hi = (a.mag + 1) * 2 ** trips
        if hi > 2 ** 20:
            return False
        m = result_model(a.dtype, -hi, hi, a.frac, a.err * 2 ** trips)
    main, a = a, b.replicated(a)
    b.emit("fori_loop", f"jax.lax.fori_loop(0, {trips}, lambda i, c: {fn}, {a.name})", a.shape, a.dtype, main=main, **m)
    return True


def _while_loop(b: Builder) -> bool:
    if b.backward:
        return False   # reverse-mode differentiation of while_loop is not defined
    a = b.pick(lambda v: exact_numeric(v) and v.ndim >= 1)
    if a is None:
        return False
    limit = b.draw_int(1, 4)
    bound = b.choice([50, 100])
    main, a = a, b.replicated(a)
    expr = (f"jax.lax.while_loop(lambda s: (s[0] < {limit}) & (jnp.max(s[1]) < {bound}), "
            f"lambda s: (s[0] + 1, s[1] * 2 + 1), (jnp.int32(0), {a.name}))[1]")
    hi = (a.mag + 1) * 2 ** limit
    b.emit("while_loop", expr, a.shape, a.dtype, main=main, **result_model(a.dtype, -hi, hi, a.frac, 0.0))
    return True


def _pred(b: Builder) -> str | None:
    src = b.pick(lambda v: exact_numeric(v) and v.ndim >= 1)
    if src is None:
        return None
    return f"jnp.sum({src.name}) > {literal(b.choice([0, 2, -1]), src.dtype)}"


def _cond(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1)
    pred = _pred(b)
    if a is None or pred is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main, a = a, b.replicated(a)
    expr = f"jax.lax.cond({pred}, lambda x: x * 2, lambda x: jnp.flip(x, {d}) - 1, {a.name})"
    b.emit("cond", expr, a.shape, a.dtype, main=main,
           **result_model(a.dtype, min(2 * a.lo, a.lo - 1), max(2 * a.hi, a.hi - 1), a.frac, 2 * a.err))
    return True


def _switch(b: Builder) -> bool:
    a = b.pick(lambda v: numeric(v) and v.ndim >= 1)
    src = b.pick(lambda v: v.dtype == I32 and v.exact and v.size >= 1 and not v.manual and v.mag < 2 ** 30)
    if a is None or src is None:
        return False
    d = b.draw_int(0, a.ndim - 1)
    main, a, src = a, b.replicated(a), b.replicated(src)
    expr = (f"jax.lax.switch(jnp.clip({src.name}.ravel()[0], 0, 2), [lambda x: x + 1, lambda x: -x, "
            f"lambda x: jnp.roll(x, 1, axis={d})], {a.name})")
    b.emit("switch", expr, a.shape, a.dtype, main=main, **result_model(a.dtype, min(a.lo, -a.hi), max(a.hi + 1, -a.lo),
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
    a = b.pick(lambda v: floating(v) and v.mag <= 2 ** 10)
    if a is None:
        return False
    b.helpers["_cj"] = _CUSTOM_JVP
    m = a.mag
    b.emit("custom_jvp", f"_cj({a.name})", a.shape, F32, main=a, spec=keep_spec(b, a),
           **float_result(-m * m + 1, m * m + 1, None if a.frac is None else 2 * a.frac, 2 * m * a.err + a.err ** 2))
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {
    "scan": _scan, "fori_loop": _fori_loop, "while_loop": _while_loop, "cond": _cond, "switch": _switch,
    "custom_jvp": _custom_jvp,
}
