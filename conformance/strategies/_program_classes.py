"""Program classes of `sharded_programs(classes=...)`: how a drawn op graph ``g`` is called.

A drawn graph is one function ``g(a0, ...)`` of typed values (`conformance.strategies._sharded_graph`).
A program class wraps it the way training code calls its layers, and says what the wrapper's
arguments and outputs are, so the value model still holds for every output:

* ``plain``: ``g`` itself.
* ``scan_layers``: ``jax.lax.scan`` over stacked layers (MaxText's / flax's ``nn.scan`` pattern):
  the first argument is the carry, every other argument gains a leading layer dimension (one
  slice per layer). The carry update is an exact output of ``g`` with the carry's shape and dtype,
  put back on the carry's grid and range (float: ``clip(round(o * 4) / 4, -16, 16)``, int32:
  ``clip(o, -16, 16)``, bool: ``o``), or ``-c`` / ``~c`` where ``g`` has none; then it is pinned to
  the carry's sharding (``with_sharding_constraint`` on Auto axes, ``reshard`` on Explicit ones).
  Every layer's inputs therefore satisfy the model of the first, and the stacked per-layer outputs
  keep their bounds; the final carry is exact.
* ``remat``: ``jax.checkpoint(g, policy=..., prevent_cse=...)`` with a drawn policy from
  `refsim.compat.remat_policies` (the offload ones move residuals to ``pinned_host``), with
  ``checkpoint_name`` on drawn values for the policies that take names. Drawn under ``grad`` /
  ``vjp`` where the transforms allow. Remat never changes values.
* ``custom_vjp``: ``jax.custom_vjp(g)`` whose backward pass is ``g``'s own pullback, kept as the
  residual (``pullback``), recomputed from the saved inputs (``recompute``) or applied to twice the
  cotangents (``scaled``, the gradient-scaling pattern). Drawn under ``grad`` / ``vjp`` where allowed.
* ``custom_jvp``: ``jax.custom_jvp(g)`` whose rule is ``jax.jvp(g, ...)``.
* ``host_offload``: drawn arguments and outputs make a round trip through host memory
  (``jax.device_put(x, jax.memory.Space.Host)`` then back to ``Space.Device``: memory kinds
  ``pinned_host`` / ``device``), and ``g`` may run under ``compute_on('device_host')`` where
  `refsim.compat.compute_on_host` says this JAX has it. The jit's own in_shardings and
  out_shardings carry drawn memory kinds too (``in_kinds`` / ``out_kinds``: an argument the jit
  takes in ``pinned_host`` is moved to ``Space.Device`` before ``g`` reads it, as JAX's
  host-offload guide does; an output whose out_sharding is ``pinned_host`` is written to host
  memory by the jit itself). Placement changes, values never; the comparison checks each
  output's memory kind as well as its values.
* ``shard_map_nested``: ``g`` runs inside a ``jax.shard_map`` manual over drawn mesh axes ``M``
  (partial-manual, inside the auto- or explicitly-sharded ``jit``); ``g`` itself is drawn over the
  remaining axes, so its own shard_map ops nest a second manual region. Arguments of rank >= 1
  are split over ``M`` along dimension 0; each output gains a leading dimension of one block per
  manual position (``out_specs=P(M)``). The region is ``check_vma=False`` (as MaxText's and levanter's
  ``shard_map`` calls often are): ``g`` is global-view code, whose scans start from invariant
  values that a varying body would make a type error under vma checking.
* ``donation``: the jit donates drawn arguments (``donate_argnums``, the case's field of that name;
  a training step donates its parameters and optimizer state). ``model`` returns ``g``'s outputs
  and, per donated argument, its next state (the ``scan_layers`` carry update: an exact output of
  ``g`` of its shape and dtype, or ``-a`` / ``~a``), and outputs of a donated argument's shape and
  dtype are often given its in_sharding, so XLA can write them into the donated buffer. refsim
  consumes donated arguments (a donated `refsim.Array` is deleted); values never depend on it.
* ``jit_chain``: 2-3 ``jax.jit`` calls of one training step (the ``scan_layers`` step: carry
  update and ``g``'s outputs), each with its own drawn ``out_shardings``, the carry of one feeding
  the next (a training loop's steps across different shardings).
* ``jit_chain_orders``: the ``jit_chain`` step jitted 2-3 times at top level, each call on its own
  mesh: the first on the case's mesh, each later one on a mesh of the same devices in a drawn
  order (a permutation of the device ids) and a drawn axis order (so another mesh shape: a 2x4
  mesh becomes 4x2, every named axis keeping its size, so every spec of ``g`` stays valid), with
  its own drawn ``out_shardings``. The carry and the other arguments are moved into each next
  call by ``jax.device_put`` to that call's in_shardings, the case's specs on that call's mesh
  (``g``'s argument types on Explicit axes): the carry moves from the layout the call before gave
  it to another layout on another device order. JAX refuses an array committed to another device
  order, and a jit or device_put inside a jit over another order. Drawn forward only.
  The case's `fn` is one step; `ShardedProgram.run` makes the calls (the same on both engines and
  in the reproducers). Values never depend on device order.

`wrap` returns the wrapper's source, its arguments and outputs; `class_to_data` / `class_from_data`
turn a drawn class into JSON and back (hunt case files).
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from conformance.strategies._sharded_graph import BOOL, F32, I32, spec_text

CLASSES = ("plain", "scan_layers", "remat", "custom_vjp", "custom_jvp", "host_offload", "shard_map_nested",
           "jit_chain", "donation", "jit_chain_orders")
#: Classes drawn under grad / vjp where the transforms allow (forward, they are the plain program).
BACKWARD_CLASSES = ("remat", "custom_vjp")
VJP_MODES = ("pullback", "recompute", "scaled")
NAMED_POLICIES = ("save_only_these_names", "save_anything_except_these_names", "save_and_offload_only_these_names")


@dataclasses.dataclass(frozen=True)
class Wrapped:
    """What a program class makes of ``g``: the source defining `fn` (``model``, after ``g``'s), ``g``'s body
    lines (remat names them), `fn`'s arguments (dtype, shape) and outputs (name, shape, dtype, err)."""

    fn: str
    source: str
    lines: tuple
    args: tuple
    outs: tuple


def params(klass: tuple) -> dict:
    return dict(klass[1:])


def class_to_data(klass: tuple) -> list:
    return [klass[0], [[k, _listed(v)] for k, v in klass[1:]]]


def class_from_data(data) -> tuple:
    name, items = data
    if name not in CLASSES:
        raise ValueError(f"unknown program class {name!r}")
    return (str(name),) + tuple((str(k), _tupled(v)) for k, v in items)


def _listed(v):
    return [_listed(x) for x in v] if isinstance(v, tuple) else v


def _tupled(v):
    return tuple(_tupled(x) for x in v) if isinstance(v, list) else v


# -- pieces of source ------------------------------------------------------------------------------
def _pin(expr: str, spec: tuple, explicit: bool) -> str:
    if explicit:
        return f"jax.sharding.reshard({expr}, {spec_text(spec)})"
    return f"jax.lax.with_sharding_constraint({expr}, {spec_text(spec)})"


def carry_update(outs: tuple, carry: tuple, spec: tuple, explicit: bool, var: str = "o", c: str = "c") -> str:
    """Source of the next carry from ``g``'s outputs `var` (see the module docstring)."""
    dt, shape = carry
    k = next((i for i, (_, s, d, err) in enumerate(outs) if tuple(s) == tuple(shape) and d == dt and err == 0), None)
    if k is None:
        expr = f"~{c}" if dt == BOOL else f"-{c}"
    elif dt == F32:
        expr = f"jnp.clip(jnp.round({var}[{k}] * 4.0) / 4.0, -16.0, 16.0)"
    elif dt == I32:
        expr = f"jnp.clip({var}[{k}], -16, 16)"
    else:
        expr = f"{var}[{k}]"
    return _pin(expr, spec, explicit)


def _policy_text(policy: str, names: tuple) -> str:
    cp = "jax.checkpoint_policies"
    if policy == "none":
        return "None"
    if policy == "offload_dot_with_no_batch_dims":
        return f"{cp}.{policy}('device', 'pinned_host')"
    if policy == "save_only_these_names" or policy == "save_anything_except_these_names":
        return f"{cp}.{policy}({', '.join(repr(n) for n in names)})"
    if policy == "save_and_offload_only_these_names":
        half = len(names) // 2
        return (f"{cp}.{policy}(names_which_can_be_saved={list(names[:half])!r}, "
                f"names_which_can_be_offloaded={list(names[half:])!r}, offload_src='device', "
                f"offload_dst='pinned_host')")
    return f"{cp}.{policy}"


_SINGLE = re.compile(r"^(v\d+) = (.*)$", re.S)


def _named_lines(lines: tuple, names: tuple) -> tuple:
    out = []
    for ln in lines:
        m = _SINGLE.match(ln)
        if m and m.group(1) in names:
            ln = f"{m.group(1)} = jax.ad_checkpoint.checkpoint_name({m.group(2)}, {m.group(1)!r})"
        out.append(ln)
    return tuple(out)


# -- the wrappers ----------------------------------------------------------------------------------
def wrap(klass: tuple, lines: tuple, args: tuple, outs: tuple) -> Wrapped:
    """The wrapper of ``g`` (body `lines`, arguments (dtype, shape), outputs (name, shape, dtype, err))."""
    name, p = klass[0], params(klass)
    n = len(args)
    names = ", ".join(f"a{i}" for i in range(n))
    if name == "plain":
        return Wrapped("g", "", lines, args, outs)
    if name == "scan_layers":
        L = p["length"]
        upd = carry_update(outs, args[0], p["carry_spec"], p["explicit"])
        xs = ", ".join(f"a{i}" for i in range(1, n))
        call = (f"jax.lax.scan(layer, a0, ({xs},))" if n > 1
                else f"jax.lax.scan(lambda c, _: layer(c, ()), a0, None, length={L})")
        src = (f"def model({names}):\n    def layer(c, xs):\n        o = g(c, *xs)\n        return {upd}, o\n"
               f"    c, ys = {call}\n    return (c,) + tuple(ys)\n")
        h_args = (args[0],) + tuple((dt, (L,) + tuple(s)) for dt, s in args[1:])
        h_outs = (("carry", args[0][1], args[0][0], 0.0),) + tuple((nm, (L,) + tuple(s), dt, err)
                                                                   for nm, s, dt, err in outs)
        return Wrapped("model", src, lines, h_args, h_outs)
    if name == "remat":
        body = _named_lines(lines, p["names"]) if p["policy"] in NAMED_POLICIES else lines
        src = ("import jax.ad_checkpoint\n\n" if body != lines else "") + (
            f"def model({names}):\n    return jax.checkpoint(g, policy={_policy_text(p['policy'], p['names'])}, "
            f"prevent_cse={p['prevent_cse']!r})({names})\n")
        return Wrapped("model", src, body, args, outs)
    if name == "custom_vjp":
        mode = p["mode"]
        if mode == "recompute":
            fwd, bwd = "return g(*a), a", "return jax.vjp(g, *res)[1](ct)"
        elif mode == "pullback":
            fwd, bwd = "out, pull = jax.vjp(g, *a)\n    return out, pull", "return res(ct)"
        else:
            fwd = "out, pull = jax.vjp(g, *a)\n    return out, pull"
            bwd = ("return res(jax.tree.map(lambda t: t if t.dtype == jax.dtypes.float0 else t * 2, ct))")
        src = (f"model = jax.custom_vjp(g)\n\n\ndef model_fwd(*a):\n    {fwd}\n\n\n"
               f"def model_bwd(res, ct):\n    {bwd}\n\n\nmodel.defvjp(model_fwd, model_bwd)\n")
        return Wrapped("model", src, lines, args, outs)
    if name == "custom_jvp":
        src = ("model = jax.custom_jvp(g)\n\n\ndef model_jvp(primals, tangents):\n"
               "    return jax.jvp(g, primals, tangents)\n\n\nmodel.defjvp(model_jvp)\n")
        return Wrapped("model", src, lines, args, outs)
    if name == "host_offload":
        trip = "jax.device_put(jax.device_put({}, jax.memory.Space.Host), jax.memory.Space.Device)"
        kinds = p.get("in_kinds", ())
        body = "".join(f"    a{i} = jax.device_put(a{i}, jax.memory.Space.Device)\n"
                       for i, kind in enumerate(kinds) if kind == "pinned_host")
        body += "".join(f"    a{i} = {trip.format(f'a{i}')}\n" for i in p["host_args"])
        call = f"{p['compute_on']}(jax.jit(g))({names})" if p["compute_on"] else f"g({names})"
        ret = (f"tuple({trip.format('x')} for x in o)" if p["host_outs"] else "o")
        head = "import jax.experimental.compute_on\n\n" if p["compute_on"] else ""
        src = f"{head}def model({names}):\n{body}    o = {call}\n    return {ret}\n"
        return Wrapped("model", src, lines, args, outs)
    if name == "shard_map_nested":
        manual = p["manual"]
        size = p["manual_size"]
        mspec = repr(manual[0]) if len(manual) == 1 else repr(tuple(manual))
        in_specs = ", ".join(f"P({mspec})" if len(s) else "P()" for _, s in args)
        # on Explicit axes the arguments are typed as the jit's in_shardings say (whatever placed them)
        typed = "".join(f"    a{i} = jax.sharding.reshard(a{i}, {spec_text(s)})\n"
                        for i, s in enumerate(p.get("arg_specs", ()))) if p.get("explicit") else ""
        src = (f"def model({names}):\n{typed}    def body({names}):\n"
               f"        return tuple(x[None] for x in g({names}))\n"
               f"    return jax.shard_map(body, in_specs=({in_specs},), out_specs=P({mspec}), "
               f"axis_names={{{', '.join(repr(a) for a in sorted(manual))}}}, check_vma=False)({names})\n")
        h_args = tuple((dt, (s[0] * size,) + tuple(s[1:]) if len(s) else ()) for dt, s in args)
        h_outs = tuple((nm, (size,) + tuple(s), dt, err) for nm, s, dt, err in outs)
        return Wrapped("model", src, lines, h_args, h_outs)
    if name == "donation":
        states = [carry_update(outs, args[i], spec, p["explicit"], var="o", c=f"a{i}")
                  for i, spec in zip(p["donated"], p["specs"])]
        src = (f"def model({names}):\n    o = g({names})\n    return tuple(o) + ({', '.join(states)},)\n")
        h_outs = tuple(outs) + tuple((f"next_a{i}", args[i][1], args[i][0], 0.0) for i in p["donated"])
        return Wrapped("model", src, lines, args, h_outs)
    if name == "jit_chain":
        upd = carry_update(outs, args[0], p["carry_spec"], p["explicit"])
        rest = "".join(f", a{i}" for i in range(1, n))
        steps = p["steps"]
        text = [f"def model({names}):", f"    def step(c{rest}):", f"        o = g(c{rest})",
                f"        return ({upd},) + tuple(o)", "    m = jax.sharding.get_abstract_mesh()", "    c = a0"]
        for k, specs in enumerate(steps):
            if len(specs) != 1 + len(outs):   # g cut to fewer outputs (shrinking): its outputs replicated
                specs = (specs[0],) + ("P()",) * len(outs)
            shs = ", ".join(f"jax.sharding.NamedSharding(m, {s})" for s in specs)
            text.append(f"    o{k} = jax.jit(step, out_shardings=({shs},))(c{rest})")
            text.append(f"    c = o{k}[0]")
        text.append("    return (c,) + " + " + ".join(f"o{k}[1:]" for k in range(len(steps))))
        h_outs = (("carry", args[0][1], args[0][0], 0.0),) + tuple(outs) * len(steps)
        return Wrapped("model", "\n".join(text) + "\n", lines, args, h_outs)
    if name == "jit_chain_orders":
        upd = carry_update(outs, args[0], p["carry_spec"], p["explicit"], var="o", c="a0")
        src = f"def model({names}):\n    o = g({names})\n    return ({upd},) + tuple(o)\n"
        h_outs = (("carry", args[0][1], args[0][0], 0.0),) + tuple(outs) * len(p["steps"])
        return Wrapped("model", src, lines, args, h_outs)
    raise ValueError(f"unknown program class {name!r}; pick one of {CLASSES}")


def stacked_spec(klass: tuple, i: int, spec: tuple) -> tuple:
    """The in_sharding spec of the wrapper's argument `i` whose ``g`` argument has `spec`."""
    name, p = klass[0], params(klass)
    if name == "scan_layers" and i > 0:
        return ((),) + tuple(spec)   # the layer dimension is not split (each layer is a slice)
    if name == "shard_map_nested" and len(spec):
        return (tuple(p["manual"]) + tuple(spec[0]),) + tuple(spec[1:])
    return tuple(spec)


MEMORY_KINDS = ("device", "pinned_host")


def memory_kinds(klass: tuple) -> tuple:
    """(in_kinds, out_kinds) of the jit's own shardings (``host_offload``; () where it draws none)."""
    p = params(klass)
    return tuple(p.get("in_kinds", ())), tuple(p.get("out_kinds", ()))


def with_memory_kinds(shardings: tuple, kinds: tuple) -> tuple:
    """`shardings` in the memory `kinds` (one per sharding), or as they are where `kinds` is () or
    names another number of them (a shrinker cut the program's outputs: they stay where it put them)."""
    if not kinds or len(kinds) != len(shardings):
        return tuple(shardings)
    for kind in kinds:
        if kind not in MEMORY_KINDS:
            raise ValueError(f"memory kind {kind!r} is not one of {MEMORY_KINDS}.")
    return tuple(s.with_memory_kind(k) for s, k in zip(shardings, kinds))


def chain_meshes(klass: tuple, mesh) -> list:
    """The mesh of each call of a ``jit_chain_orders`` program: `mesh`, then each drawn order
    (axis names in their new order, the device ids in row-major order of the new shape)."""
    out = [mesh]
    for names, ids in params(klass)["orders"]:
        shape = tuple(mesh.axis_size(a) for a in names)
        types = tuple(mesh.axis_types[mesh.axis_names.index(a)] for a in names)
        out.append(type(mesh)(shape, tuple(names), device_ids=np.asarray(ids, dtype=np.int64).reshape(shape),
                              axis_types=types))
    return out


def chain_specs(klass: tuple, n_outs: int) -> list:
    """Per call, the out specs (carry, then ``g``'s outputs) of a ``jit_chain_orders`` program whose
    ``g`` has `n_outs` outputs (a shrinker's cut ``g``: its outputs replicated)."""
    steps = params(klass)["steps"]
    return [specs if len(specs) == 1 + n_outs else (specs[0],) + ((),) * n_outs for specs in steps]


def manual_size(mesh, manual) -> int:
    return math.prod(mesh.axis_size(a) for a in manual)
