"""dot_general / einsum / matmul with drawn batch and contracting dimensions."""
from __future__ import annotations

import math

from conformance.strategies._sharded_graph import Builder, Val
from conformance.strategies._sharded_ops.common import dot_model, draw_out_sharding, fits, numeric


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


def _dot_like(name: str):
    def op(b: Builder) -> bool:
        a = b.pick(lambda v: numeric(v) and v.ndim >= 1)
        if a is None:
            return False
        o = b.pick(lambda v: numeric(v) and v.ndim >= 1 and v.dtype == a.dtype and
                   any(s in a.shape for s in v.shape)) or a
        dims = _dot_dims(b, a, o)
        if dims is None:
            return False
        contract, batch = dims
        shape = _dot_shape(a, o, contract, batch)
        if not fits(b, shape):
            return False
        k = math.prod(a.shape[i] for i, _ in contract)
        main = a
        a, o = b.replicated(a), b.replicated(o)
        out_kw, spec = draw_out_sharding(b, shape)
        if name == "dot_general":
            dn = ((tuple(i for i, _ in contract), tuple(j for _, j in contract)),
                  (tuple(i for i, _ in batch), tuple(j for _, j in batch)))
            expr = f"jax.lax.dot_general({a.name}, {o.name}, {dn!r}{out_kw})"
        else:
            expr = f"jnp.einsum({_einsum_spec(a, o, contract, batch)!r}, {a.name}, {o.name}{out_kw})"
        b.emit(name, expr, shape, a.dtype, main=main, spec=spec, **dot_model(a, o, k))
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
    a = b.pick(lambda v: numeric(v) and v.ndim in (1, 2, 3))
    if a is None:
        return False
    k = a.shape[-1]
    o = b.pick(lambda v: numeric(v) and v.dtype == a.dtype and v.ndim in (1, 2) and v.shape[0] == k)
    if o is None and a.ndim < 2:
        return False
    shape = a.shape[:-1] + ((a.shape[-2],) if o is None else o.shape[1:])
    if not fits(b, shape):
        return False
    main = a
    a = b.replicated(a)
    if o is None:
        # a @ a^T-like product: contract the last dimension with itself
        o_val, expr_o = a, f"jnp.swapaxes({a.name}, -1, -2)"
    else:
        o_val = b.replicated(o)
        expr_o = o_val.name
    out_kw, spec = draw_out_sharding(b, shape)
    b.emit("matmul", f"jnp.matmul({a.name}, {expr_o}{out_kw})", shape, a.dtype, main=main, spec=spec,
           **dot_model(a, o_val, k))
    return True


#: This family's ops, by the name programs and the coverage table use.
OPS = {"dot_general": _dot_like("dot_general"), "einsum": _dot_like("einsum"), "matmul": _matmul}
