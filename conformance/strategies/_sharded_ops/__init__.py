"""The op table of `conformance.strategies.sharded_programs`: one small drawer per op.

Each drawer takes the `Builder`, picks operands the value model allows (shape, dtype, range,
exactness), draws its parameters, emits one line of source and returns True, or returns False
when no value in the pool fits (the builder then draws another op). The model's rules are
stated where they are used: what keeps a result exact, how far two correct results may be
apart (`Val.err`), and which sharding types an Explicit mesh lets an op take.

The drawers live by op family, one module each (`elementwise`, `linalg`, `reductions`, `sorting`,
`indexing`, `shapes`, `conversions`, `fft_conv`, `control`, `sharding`; helpers they share in
`common`); each module's `OPS` is its part of the table. `OPS` below is the one registry: its
order is the order `sharded_programs` draws from, so a seed keeps drawing the same programs.
"""
from __future__ import annotations

from conformance.strategies._sharded_ops import (
    control, conversions, elementwise, fft_conv, indexing, linalg, reductions, sharding, shapes, sorting,
)

FAMILIES = (elementwise, linalg, reductions, sorting, indexing, shapes, conversions, fft_conv, control, sharding)


def _registry(families) -> dict:
    ops = {}
    for family in families:
        for name, drawer in family.OPS.items():
            if name in ops:
                raise ValueError(f"op {name!r} is drawn by two families (the second: {family.__name__}); "
                                 "rename one of them.")
            ops[name] = drawer
    return ops


#: Every op `sharded_programs` can draw, by name, family by family.
OPS = _registry(FAMILIES)

#: Ops whose derivative jumps (ties, corners, clips): under grad / vjp they take exact values only.
KINKED = frozenset({"max", "min", "abs", "relu", "clamp", "select", "floor", "ceil", "round", "sign", "rem", "div",
                    "reduce_max", "reduce_min", "cummax", "cummin", "reduce_window", "sort", "sort_multi", "top_k",
                    "scatter_min", "scatter_max", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt"})
#: Ops a reverse-mode derivative cannot go through (JAX has no transpose or JVP rule for them: while_loop,
#: bitcast_convert_type, pmax).
NOT_DIFFERENTIABLE = ("while_loop", "bitcast", "shard_map_pmax")
#: Ops whose name in the coverage table differs from the drawer's (one drawer, two jnp functions).
ALIASES = {"tile_repeat": ("tile", "repeat"), "pad": ("pad", "pad_neg_interior")}
