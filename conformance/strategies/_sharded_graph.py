"""The typed value model and program builder behind `conformance.strategies.sharded_programs`.

A drawn program is a straight-line op graph: every value is a `Val` that knows its shape, its
dtype, its sharding (the sharding *type* on an Explicit mesh, the layout last stated for it on
an Auto mesh, None where the compiler chooses) and what any correct implementation may give
for it: the range of its elements, whether they lie on the grid of multiples of ``2**-frac``
(where float sums are exact in any order), and `err`, a bound on how far two correct results
may be apart (0: bit-exact). Ops (`conformance.strategies._sharded_ops`) pick operands the
model says they may take, emit one line of source and the typed value(s) it makes.
"""
from __future__ import annotations

import dataclasses
import math

from hypothesis import strategies as st

F32, I32, BOOL = "float32", "int32", "bool"
_P = 24                      # float32 significand bits
INT_LIMIT = 2.0 ** 31
# A value whose bound on |x| or error passes these is only moved, never computed with.
FINE_MAG = 2.0 ** 20
FINE_REL_ERR = 2.0 ** -8


def ulp(mag: float) -> float:
    """An upper bound of one float32 ulp at magnitude `mag`."""
    if not mag > 0:
        return 2.0 ** -149
    if math.isinf(mag):
        return math.inf
    return 2.0 ** (math.floor(math.log2(mag)) - (_P - 1))


@dataclasses.dataclass
class Val:
    """One typed value of a drawn program (see the module docstring)."""

    name: str
    shape: tuple
    dtype: str
    lo: float
    hi: float
    frac: int | None = 0
    err: float = 0.0
    spec: tuple | None = None      # one tuple of mesh axes per dimension; None: unknown
    manual: bool = False           # lives inside a shard_map body

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def exact(self) -> bool:
        """Every correct implementation gives these bits."""
        return self.err == 0.0

    @property
    def is_float(self) -> bool:
        return self.dtype == F32

    @property
    def fine(self) -> bool:
        """Small and accurate enough to compute with (not only to move)."""
        if self.dtype == BOOL:
            return True
        if self.dtype == I32:
            return self.mag < 2.0 ** 30
        return self.mag <= FINE_MAG and self.err <= FINE_REL_ERR * max(1.0, self.mag)

    @property
    def on_grid(self) -> bool:
        return self.frac is not None and self.frac <= 40


def float_result(lo: float, hi: float, frac, err: float, *, rounds: bool = False) -> dict:
    """Keyword fields of a float32 result: exact when its inputs were and it stays on a grid
    float32 holds, else `err` plus one rounding (and `rounds` forces the rounding)."""
    mag = max(abs(lo), abs(hi))
    if math.isinf(mag) or math.isnan(mag):
        return dict(lo=-math.inf, hi=math.inf, frac=None, err=math.inf)
    if rounds or frac is None or mag * 2.0 ** min(frac, 200) > 2.0 ** _P:
        err = err + ulp(mag)
    return dict(lo=lo, hi=hi, frac=frac, err=err)


def int_result(lo: float, hi: float) -> dict:
    """Keyword fields of an int32 result; a range past int32 wraps (any value)."""
    if lo < -INT_LIMIT or hi >= INT_LIMIT:
        lo, hi = -INT_LIMIT, INT_LIMIT - 1
    return dict(lo=float(lo), hi=float(hi), frac=0, err=0.0)


def sum_result(v: Val, n: int, *, rounds_anyway: bool = False) -> dict:
    """A sum of up to `n` elements of `v` in any order (reductions, dots, cumulative sums)."""
    n = max(int(n), 1)
    if v.dtype != F32:
        return int_result(min(v.lo * n, v.lo), max(v.hi * n, v.hi))
    lo, hi = min(v.lo * n, v.lo, 0.0), max(v.hi * n, v.hi, 0.0)
    mag = max(abs(lo), abs(hi), v.mag)
    exact = (v.exact and v.on_grid and not rounds_anyway and mag * 2.0 ** v.frac <= 2.0 ** _P)
    if exact:
        return dict(lo=lo, hi=hi, frac=v.frac, err=0.0)
    # Higham's gamma(n-1) * sum|x| with sum|x| <= n * mag, doubled for the two sides' orders
    return dict(lo=lo, hi=hi, frac=v.frac, err=n * v.err + 2.0 * n * n * v.mag * 2.0 ** -_P + ulp(mag))


class Builder:
    """Collects one program's lines and values while ops draw their operands and parameters."""

    def __init__(self, draw, mesh, *, explicit: bool, backward: bool, max_elements: int, op_names):
        self.draw = draw
        self.mesh = mesh
        self.explicit = explicit
        self.backward = backward            # the program will be differentiated
        self.max_elements = max_elements
        self.op_names = tuple(op_names)
        self.pool: list[Val] = []
        self.lines: list[str] = []
        self.helpers: dict[str, str] = {}   # name -> source of a helper defined before g
        self.used: list[tuple[str, str]] = []   # (op, sharding pattern of its main operand)
        self.extra_ops: list[str] = []       # sharding ops inserted at drawn points
        self.kinked = False                  # the op being drawn has a kink (see `pick`)
        self._n = 0

    # -- names and values -----------------------------------------------------------------------
    def fresh(self) -> str:
        self._n += 1
        return f"v{self._n}"

    def add_arg(self, name: str, shape: tuple, dtype: str, spec: tuple) -> Val:
        if dtype == F32:
            v = Val(name, shape, dtype, -16.0, 16.0, 2, 0.0, spec)
        elif dtype == I32:
            v = Val(name, shape, dtype, -16.0, 16.0, 0, 0.0, spec)
        else:
            v = Val(name, shape, dtype, 0.0, 1.0, 0, 0.0, spec)
        self.pool.append(v)
        return v

    def emit(self, op: str, expr: str, shape: tuple, dtype: str, *, main: Val | None, spec=None, **model) -> Val:
        """Append ``vN = expr`` and its typed value; `main` is the operand whose sharding the
        op's coverage pattern records; `model` are the `Val` range / grid / error fields."""
        name = self.fresh()
        self.lines.append(f"{name} = {expr}")
        if spec is None and not self.explicit:
            spec = None
        elif spec is None:
            spec = ((),) * len(shape)
        v = Val(name, tuple(int(s) for s in shape), dtype, spec=spec, **model)
        self.pool.append(v)
        self.used.append((op, self.pattern(main) if main is not None else "none"))
        return v

    def emit_multi(self, op: str, expr: str, outs: list, *, main: Val | None) -> list:
        """``vA, vB = expr`` for ops with several results; `outs` are (shape, dtype, spec, model) tuples."""
        names = [self.fresh() for _ in outs]
        self.lines.append(f"{', '.join(names)} = {expr}")
        made = []
        for name, (shape, dtype, spec, model) in zip(names, outs):
            if spec is None and self.explicit:
                spec = ((),) * len(shape)
            v = Val(name, tuple(int(s) for s in shape), dtype, spec=spec, **model)
            self.pool.append(v)
            made.append(v)
        self.used.append((op, self.pattern(main) if main is not None else "none"))
        return made

    # -- drawing helpers ------------------------------------------------------------------------
    def pick(self, pred=lambda v: True) -> Val | None:
        """A value of the pool that satisfies `pred` (the newest first, which is what shrinks).

        In a program that will be differentiated, an op with a kink (max, abs, sort, clamp, ...)
        takes exact values only: its derivative jumps where the operands tie or cross a corner,
        and two correct results of an inexact value may fall on either side."""
        if self.backward and self.kinked:
            base = pred
            pred = lambda v: base(v) and v.exact  # noqa: E731
        cands = [v for v in reversed(self.pool) if pred(v)]
        if not cands:
            return None
        return self.draw(st.sampled_from(cands))

    def draw_int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, max(lo, hi)))

    def draw_permutation(self, n: int) -> list:
        return list(self.draw(st.permutations(range(n))))

    def draw_permutation_of(self, items) -> list:
        return list(self.draw(st.permutations(list(items))))

    def choice(self, options):
        return self.draw(st.sampled_from(list(options)))

    def boolean(self) -> bool:
        return self.draw(st.booleans())

    # -- shardings ------------------------------------------------------------------------------
    def axis_size(self, axes) -> int:
        return math.prod(self.mesh.axis_size(a) for a in axes)

    def pattern(self, v: Val) -> str:
        """The sharding pattern of `v` where an op used it (the coverage table's columns)."""
        if v.manual:
            return "manual"
        if v.spec is None:
            return "compiler"
        if all(not ax for ax in v.spec):
            return "replicated"
        if any(ax and n % self.axis_size(ax) for ax, n in zip(v.spec, v.shape)):
            return "uneven"
        if any(len(ax) > 1 for ax in v.spec):
            return "multi-axis"
        return "sharded"

    def draw_spec(self, shape: tuple, *, dividing: bool, allow_unconstrained: bool = False) -> tuple:
        """Per dimension a tuple of mesh axes (each axis used once); `dividing` keeps each
        dimension a multiple of its axes' size (jit's in/out shardings, Explicit reshards)."""
        names = list(self.draw(st.permutations(self.mesh.axis_names)))
        dims: list = [() for _ in shape]
        for a in names:
            cands = [d for d in range(len(shape))
                     if not dividing or shape[d] % (self.axis_size(dims[d]) * self.mesh.axis_size(a)) == 0]
            d = self.draw(st.sampled_from([None] + cands))
            if d is not None:
                dims[d] = dims[d] + (a,)
        if allow_unconstrained:
            dims = [("?",) if not ax and self.draw(st.integers(0, 3)) == 0 else ax for ax in dims]
        return tuple(dims)

    def replicated(self, v: Val) -> Val:
        """`v` with a fully replicated type: on an Explicit mesh ops other than elementwise ones
        take replicated operands (JAX's sharding-in-types rules), so a sharded value is resharded."""
        if not self.explicit or v.manual or v.spec is None or all(not ax for ax in v.spec):
            return v
        return self.reshard(v, ((),) * v.ndim)

    def reshard(self, v: Val, spec: tuple) -> Val:
        self.extra_ops.append("reshard")
        return self.emit("reshard", f"jax.sharding.reshard({v.name}, {spec_text(spec)})", v.shape, v.dtype,
                         main=v, spec=spec, **model_of(v))

    def constrain(self, v: Val, spec: tuple) -> Val:
        self.extra_ops.append("with_sharding_constraint")
        kept = tuple(None if ax == ("?",) else ax for ax in spec)
        return self.emit("with_sharding_constraint",
                         f"jax.lax.with_sharding_constraint({v.name}, {spec_text(spec)})", v.shape, v.dtype,
                         main=v, spec=None if None in kept else kept, **model_of(v))

    def same_spec(self, v: Val, like: Val) -> Val:
        """`v` resharded to `like`'s type (Explicit elementwise ops need equal shardings)."""
        if (not self.explicit or v.manual or like.manual or v.spec == like.spec or v.shape != like.shape
                or like.spec is None):
            return v
        return self.reshard(v, like.spec)


def model_of(v: Val) -> dict:
    return dict(lo=v.lo, hi=v.hi, frac=v.frac, err=v.err)


def spec_text(spec: tuple) -> str:
    """``P(...)`` source of a per-dimension axes tuple (``("?",)``: P.UNCONSTRAINED)."""
    parts = []
    for ax in spec:
        if ax == ("?",):
            parts.append("P.UNCONSTRAINED")
        elif not ax:
            parts.append("None")
        elif len(ax) == 1:
            parts.append(repr(ax[0]))
        else:
            parts.append(repr(tuple(ax)))
    while parts and parts[-1] == "None":
        parts.pop()
    return "P(" + ", ".join(parts) + ")"
