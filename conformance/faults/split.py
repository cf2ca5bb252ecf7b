"""Which dimensions of a value are split across devices, as far as JAX's lowering of a jit says.

A lowering fault of a partitioned op (`partitioned_reduction_drops_shard`) must act only where the
op's operand is split, but XLA's partitioner decides the final layout after lowering. What the
lowered module already states is used: the sharding of a jit argument (its `sdy.sharding` or
`mhlo.sharding` attribute), a sharding constraint (`sdy.sharding_constraint`, `sdy.reshard`, the
`@Sharding` custom call), or an explicit-axes type (`aval.sharding.spec`), followed through
elementwise ops. A value read inside a nested jit, a loop or a branch, or derived by any other
op, counts as not split. The rule must see the operand's defining ops: it is lowered inline
(`conformance.faults.lowering.Fault.inline`), not as JAX's cached per-equation function.
"""
from __future__ import annotations

import math
import re

from refsim.layouts.hlo_sharding import HloSharding

# Ops whose result has its operands' shape element for element: a split carries through them.
_ELEMENTWISE = frozenset(f"stablehlo.{n}" for n in (
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "convert", "cosine", "divide",
    "exponential", "exponential_minus_one", "floor", "imag", "is_finite", "log", "log_plus_one", "logistic",
    "maximum", "minimum", "multiply", "negate", "not", "or", "power", "real", "reduce_precision", "remainder",
    "round_nearest_afz", "round_nearest_even", "rsqrt", "select", "sign", "sine", "sqrt", "subtract", "tan",
    "tanh", "xor"))
_CONSTRAINTS = ("sdy.sharding_constraint", "sdy.reshard")
_MESH_AXES = re.compile(r'"([^"]+)"\s*=\s*(\d+)')


def split_counts(ctx, value, aval) -> tuple[int, ...]:
    """Per dimension of `value` (an operand of the rule being lowered, of type `aval`): the number
    of blocks that dimension is split into across devices (1: kept whole, or not known)."""
    ndim = len(aval.shape)
    counts = _explicit(aval, ndim)
    if any(c > 1 for c in counts):
        return counts
    found = _walk(ctx.module_context.module, value, ndim, depth=64)
    return found if found is not None else (1,) * ndim


def _explicit(aval, ndim: int) -> tuple[int, ...]:
    """The split of an explicit-axes type: `aval.sharding.spec` names the mesh axes of each dimension."""
    sharding = getattr(aval, "sharding", None)
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return (1,) * ndim
    try:
        sizes = dict(mesh.shape)
    except (AttributeError, TypeError, ValueError):
        return (1,) * ndim
    out = []
    for d in range(ndim):
        entry = spec[d] if d < len(spec) else None
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        out.append(math.prod(int(sizes.get(a, 1)) for a in axes if isinstance(a, str)))
    return tuple(out)


def _walk(module, value, ndim: int, depth: int):
    """The split of `value` from its defining ops; None when nothing says."""
    if depth <= 0:
        return None
    owner = value.owner
    if type(owner).__name__ == "Block":
        return _argument(module, owner, value.arg_number, ndim)
    op = owner.operation if hasattr(owner, "operation") else owner
    name = op.name
    if name in _CONSTRAINTS:
        return _attr_counts(module, op.attributes["sharding"], ndim)
    if name == "stablehlo.custom_call" and "Sharding" in str(op.attributes["call_target_name"]) \
            and "mhlo.sharding" in op.attributes:
        return _attr_counts(module, op.attributes["mhlo.sharding"], ndim)
    if name not in _ELEMENTWISE:
        return None
    shape = str(value.type)
    found = [_walk(module, v, ndim, depth - 1) for v in op.operands if str(v.type) == shape]
    found = [f for f in found if f is not None]
    return tuple(max(c) for c in zip(*found)) if found else None


def _argument(module, block, number: int, ndim: int):
    """The split of argument `number` of the block's function: only the module's entry function
    ("main") carries the jit's in_shardings."""
    fn = block.owner
    fn = fn.operation if hasattr(fn, "operation") else fn
    if "sym_name" not in fn.attributes or str(fn.attributes["sym_name"]).strip('"') != "main":
        return None
    if "arg_attrs" not in fn.attributes:
        return None
    attrs = fn.attributes["arg_attrs"][number]
    for key in ("sdy.sharding", "mhlo.sharding"):
        if key in attrs:
            return _attr_counts(module, attrs[key], ndim)
    return None


def _attr_counts(module, attr, ndim: int):
    text = str(attr)
    if "sdy.sharding" in text or text.startswith("<@") or text.startswith("<mesh"):
        return _shardy_counts(module, text, ndim)
    try:
        hlo = HloSharding.parse(text.strip('"'))
    except (ValueError, TypeError):
        return None
    if hlo.is_replicated() or hlo.is_maximal():
        return (1,) * ndim
    if hlo.kind != "tiled":
        return None
    tiles = tuple(int(t) for t in hlo.num_tiles())
    return tiles if len(tiles) == ndim else None


def _shardy_counts(module, text: str, ndim: int):
    """`#sdy.sharding<@mesh, [{"x"}, {}]>` (or with an inline `mesh<[...]>`): blocks per dimension."""
    inline = re.search(r"mesh<\[([^\]]*)\]", text)
    if inline:
        sizes = {a: int(n) for a, n in _MESH_AXES.findall(inline.group(1))}
        rest = text[inline.end():]
    else:
        ref = re.search(r"@([\w.$-]+)", text)
        sizes = _module_mesh(module, ref.group(1)) if ref else {}
        rest = text[ref.end():] if ref else text
    dims = re.search(r"\[((?:\s*\{[^{}]*\}\s*,?)*)\s*\]", rest)
    if dims is None or sizes is None:
        return None
    groups = re.findall(r"\{([^{}]*)\}", dims.group(1))
    if len(groups) != ndim:
        return None
    out = []
    for g in groups:
        n = 1
        for axis, _pre, sub in re.findall(r'"([^"]+)"(?::\((\d+)\)(\d+))?', g):
            n *= int(sub) if sub else sizes.get(axis, 1)
        out.append(n)
    return tuple(out)


def _module_mesh(module, name: str):
    """The axis sizes of `sdy.mesh @name` in `module`, or None when it has none."""
    for op in module.body.operations:
        op = op.operation if hasattr(op, "operation") else op
        if op.name == "sdy.mesh" and str(op.attributes["sym_name"]).strip('"') == name:
            return {a: int(n) for a, n in _MESH_AXES.findall(str(op.attributes["mesh"]))}
    return None
