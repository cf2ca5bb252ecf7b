"""A corpus of real JAX programs over named meshes, each runnable by refsim and by XLA.

Every entry is a `Program`: a plain JAX function plus what it takes to run it the
way a JAX user would (`kind` says which entry point: ``"shard_map"``, ``"pmap"`` or
``"jit"``), the mesh shape and axis names, the specs / shardings, and an input
builder from a seed. Inputs are exact-friendly (small integers, powers of two), so
every reduction order gives the same bits and results compare bit for bit; a
program using a transcendental function states its bound in `ulp` (composed from
refsim's per-op accuracy contract, `refsim.interpreter.accuracy.ulp_bound`, and compared
with `conformance.verdict.compare(..., ulp=...)`), or, where cancellation makes ulps meaningless,
an absolute/relative `tol`.

Where XLA:CPU cannot run a program (`xla_note` says why, e.g. jax 0.10 and 0.12 have
no CPU lowering for `pbroadcast` and cannot execute `ragged-all-to-all`), `reference`
computes the expected global outputs with plain NumPy instead.

>>> from conformance.cases.corpus import PROGRAMS, by_name
>>> prog = by_name("psum_x")
>>> out = prog.run_refsim(seed=0)          # tuple of refsim.Array
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

import refsim
from refsim.interpreter.accuracy import ulp_bound
from xla_backend import staging

P = jax.sharding.PartitionSpec


@dataclasses.dataclass(frozen=True)
class Program:
    """One corpus program.

    name: unique id. family: what it exercises (``collectives``, ``control_flow``,
    ``autodiff``, ``models``, ``explicit_sharding``, ``pmap``, ``nested``, ``random``,
    ``no_xla``). kind: ``"shard_map"`` (fn is the per-device body, run under
    `shard_map(fn, mesh, in_specs, out_specs, check_vma, axis_names)`), ``"pmap"`` (fn is
    the per-device body, run under `pmap(fn, **pmap_kwargs)`), or ``"jit"`` (fn is a
    global-view program, run under `jit(fn, in_shardings, out_shardings)` with the specs
    below turned into NamedShardings over the mesh; None means unspecified).
    inputs: seed -> tuple of NumPy arrays (global values). axis_types: the mesh's axis
    types (names of `AxisType` members) for explicit-sharding programs.
    """

    name: str
    family: str
    kind: str
    fn: Callable
    mesh_shape: tuple
    axis_names: tuple
    inputs: Callable[[int], tuple]
    in_specs: Any = None
    out_specs: Any = None
    check_vma: bool = True
    manual_axes: frozenset | None = None
    pmap_kwargs: dict = dataclasses.field(default_factory=dict)
    axis_types: tuple | None = None
    xla_note: str = ""
    reference: Callable | None = None
    tol: float = 0.0
    ulp: int = 0

    @property
    def xla_runs(self) -> bool:
        """False when XLA:CPU cannot run this program (then `reference` is the oracle)."""
        return not self.xla_note

    def refsim_mesh(self):
        return refsim.Mesh(self.mesh_shape, self.axis_names, axis_types=self.axis_types)

    def refsim_callable(self):
        """The program under refsim's entry point for its kind."""
        return _entry(self, refsim, self.refsim_mesh())

    def shardings(self, mesh) -> tuple:
        """(in_shardings, out_shardings) of a ``"jit"`` program: its specs as refsim
        NamedShardings over `mesh` (None stays unspecified)."""
        def named(tree):
            if tree is None:
                return None
            return jax.tree_util.tree_map(lambda s: api_named(None, mesh, s), tree,
                                          is_leaf=lambda x: x is None or isinstance(x, P))
        return named(self.in_specs), named(self.out_specs)

    def layout(self, mesh):
        """The `xla_backend.staging.Layout` this program runs under on `mesh`; its
        `entry_kwargs()` are the arguments of refsim's and xla_backend's entry point."""
        if self.kind == "shard_map":
            return staging.Layout.shard_map(mesh, self.in_specs, self.out_specs, check_vma=self.check_vma,
                                            axis_names=self.manual_axes)
        if self.kind == "pmap":
            return staging.Layout.pmap(**self.pmap_kwargs)
        if self.kind == "jit":
            return staging.Layout.jit(*self.shardings(mesh))
        raise ValueError(f"Program.kind={self.kind!r}; use 'shard_map', 'pmap' or 'jit'.")

    def run_refsim(self, seed: int = 0):
        """Outputs (a flat tuple of refsim.Array) for the inputs of `seed`."""
        out = self.refsim_callable()(*self.inputs(seed))
        return tuple(jax.tree_util.tree_leaves(out, is_leaf=lambda x: hasattr(x, "shards")))


def _entry(prog: Program, api, mesh):
    """`prog.fn` wrapped by `api.shard_map` / `api.pmap` / `api.jit` (refsim or xla_backend)."""
    layout = prog.layout(mesh)
    return getattr(api, layout.entry)(prog.fn, **layout.entry_kwargs())


def api_named(api, mesh, spec):
    if spec is None:
        return None
    return refsim.NamedSharding(mesh, refsim.PartitionSpec.from_jax(spec))


# --- input builders (exact-friendly) -----------------------------------------------------------

def ints(*shapes, lo=-4, hi=5, dtype=np.float32):
    """Builder: one array per shape of small integers in [lo, hi) as `dtype`."""

    def build(seed):
        rng = np.random.default_rng(seed)
        return tuple(rng.integers(lo, hi, size=s).astype(dtype) for s in shapes)

    return build


def pow2(*shapes, dtype=np.float32):
    """Builder: signed powers of two in [1/8, 8] (sums of few of them stay exact)."""

    def build(seed):
        rng = np.random.default_rng(seed)
        return tuple((rng.choice([-1, 1], size=s) * 2.0 ** rng.integers(-3, 4, size=s)).astype(dtype)
                     for s in shapes)

    return build


PROGRAMS: list[Program] = []


def program(name, family, kind, mesh_shape, axis_names, inputs, **kw):
    """Decorator adding the decorated function to `PROGRAMS` as a `Program`."""

    def deco(fn):
        PROGRAMS.append(Program(name, family, kind, fn, tuple(mesh_shape), tuple(axis_names), inputs, **kw))
        return fn

    return deco


def by_name(name: str) -> Program:
    for p in PROGRAMS:
        if p.name == name:
            return p
    raise KeyError(f"no corpus program named {name!r}; names: {sorted(p.name for p in PROGRAMS)}")


M2x4 = ((2, 4), ("x", "y"))
M8 = ((8,), ("i",))
M4 = ((4,), ("i",))
SM = "shard_map"

# --- collectives -------------------------------------------------------------------------------

program("psum_x", "collectives", SM, *M2x4, ints((4, 8)), in_specs=P("x", "y"), out_specs=P(None, "y"))(
    lambda a: lax.psum(a, "x"))
program("psum_xy", "collectives", SM, *M2x4, ints((4, 8)), in_specs=P("x", "y"), out_specs=P())(
    lambda a: lax.psum(a, ("x", "y")))
program("pmean_y", "collectives", SM, *M2x4, pow2((4, 8)), in_specs=P("x", "y"), out_specs=P("x"))(
    lambda a: lax.pmean(a, "y"))
program("pmax_pmin", "collectives", SM, *M2x4, ints((4, 8)), in_specs=P("x", "y"),
        out_specs=(P(None, "y"), P("x")))(lambda a: (lax.pmax(a, "x"), lax.pmin(a, "y")))
program("psum_int32", "collectives", SM, *M2x4, ints((8, 4), dtype=np.int32), in_specs=P(("x", "y")),
        out_specs=P())(lambda a: lax.psum(a, ("x", "y")))
program("all_gather_untiled", "collectives", SM, *M2x4, ints((4, 8)), in_specs=P("x", "y"),
        out_specs=P("x", None, "y"))(lambda a: lax.all_gather(a, "x", axis=1))
program("all_gather_tiled", "collectives", SM, *M2x4, ints((4, 8)), in_specs=P("x", "y"),
        out_specs=P("x"), check_vma=False)(lambda a: lax.all_gather(a, "y", axis=1, tiled=True))
program("psum_scatter_tiled", "collectives", SM, *M2x4, ints((8, 8)), in_specs=P(None, "y"),
        out_specs=P("x", "y"))(lambda a: lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True))
program("psum_scatter_untiled", "collectives", SM, *M2x4, ints((4, 8)), in_specs=P(None, "x"),
        out_specs=P("y", "x"))(lambda a: lax.psum_scatter(a, "y", scatter_dimension=0)[None])
program("all_to_all", "collectives", SM, *M2x4, ints((8, 8)), in_specs=P("y"), out_specs=P(None, "y"))(
    lambda a: lax.all_to_all(a, "y", split_axis=1, concat_axis=0, tiled=True))
program("ppermute_ring", "collectives", SM, *M8, ints((16, 3)), in_specs=P("i"), out_specs=P("i"))(
    lambda a: lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)]))
program("ppermute_partial_zero_fill", "collectives", SM, *M8, ints((8, 2)), in_specs=P("i"), out_specs=P("i"))(
    lambda a: lax.ppermute(a, "i", [(0, 3), (3, 5), (6, 1)]))
program("axis_index_2d", "collectives", SM, *M2x4, ints((2, 4)), in_specs=P("x", "y"), out_specs=P("x", "y"))(
    lambda a: a * 10 + lax.axis_index("x") * 4 + lax.axis_index("y"))
program("axis_index_groups_psum", "collectives", SM, *M8, ints((8, 2)), in_specs=P("i"), out_specs=P("i"),
        check_vma=False)(lambda a: lax.psum(a, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))
program("pshuffle_reverse", "collectives", SM, *M8, ints((8, 2)), in_specs=P("i"), out_specs=P("i"))(
    lambda a: lax.pshuffle(a, "i", list(reversed(range(8)))))
program("bool_psum", "collectives", SM, *M8, ints((8, 3), lo=0, hi=2, dtype=np.bool_), in_specs=P("i"),
        out_specs=P())(lambda a: lax.psum(a, "i"))


# --- control flow with collectives inside ------------------------------------------------------

@program("psum_in_scan", "control_flow", SM, *M2x4, ints((4, 8), (3, 8)), in_specs=(P("x", "y"), P(None, "y")),
         out_specs=(P(None, "y"), P(None, "y")))
def _psum_in_scan(a, xs):
    def step(c, x):
        c = lax.psum(c, "x") * 0.5 + x
        return c, c.sum(0)
    return lax.scan(step, lax.psum(a, "x"), xs)


@program("ppermute_fori", "control_flow", SM, *M8, ints((8, 4)), in_specs=P("i"), out_specs=P("i"))
def _ppermute_fori(a):
    perm = [(j, (j + 1) % 8) for j in range(8)]
    return lax.fori_loop(0, 5, lambda k, c: lax.ppermute(c, "i", perm) + k, a)


@program("psum_in_while", "control_flow", SM, *M2x4, ints((2, 8), lo=1, hi=3), in_specs=P("x", "y"),
         out_specs=(P("x", "y"), P()))
def _psum_in_while(a):
    def cond(c):
        return c[1] < 40
    def body(c):
        x, n = c
        return x * 2, n + lax.psum(1, ("x", "y"))
    return lax.while_loop(cond, body, (a, 0))


@program("while_per_device_trip_count", "control_flow", SM, *M8, ints((8, 2), lo=0, hi=3), in_specs=P("i"),
         out_specs=(P("i"), P("i")), check_vma=False)
def _while_divergent(a):
    limit = lax.axis_index("i")
    def body(c):
        return c[0] + 1, c[1] * 2 + 1
    n, out = lax.while_loop(lambda c: c[0] < limit, body, (jnp.int32(0), a))
    return n[None], out


@program("cond_on_axis_index", "control_flow", SM, *M8, ints((8, 3)), in_specs=P("i"), out_specs=P("i"))
def _cond_axis_index(a):
    return lax.cond(lax.axis_index("i") % 2 == 0, lambda v: v * 3, lambda v: v - 1, a)


@program("cond_with_psum", "control_flow", SM, *M2x4, ints((4, 8)), in_specs=P("x", "y"), out_specs=P(None, "y"))
def _cond_psum(a):
    total = lax.psum(a.sum(), ("x", "y"))
    return lax.cond(total > 0, lambda v: lax.psum(v, "x"), lambda v: lax.psum(-v, "x"), a)


@program("switch_axis_index", "control_flow", SM, *M8, ints((8, 2)), in_specs=P("i"), out_specs=P("i"))
def _switch(a):
    return lax.switch(lax.axis_index("i"), [lambda v: v, lambda v: v * 2, lambda v: v + 7], a)


@program("nested_scan_all_gather", "control_flow", SM, *M2x4, ints((2, 4)), in_specs=P("x", "y"),
         out_specs=P("x", "y"))
def _nested_scan(a):
    def inner(c, _):
        g = lax.all_gather(c, "y", tiled=True, axis=1)
        return c + g[:, :1], None
    def outer(c, _):
        return lax.scan(inner, c, None, length=2)[0], None
    return lax.scan(outer, a, None, length=2)[0]


@program("reverse_scan_ppermute", "control_flow", SM, *M8, ints((8, 2), (4, 8, 2)), in_specs=(P("i"), P(None, "i")),
         out_specs=(P("i"), P(None, "i")))
def _rev_scan(a, xs):
    perm = [(j, (j + 3) % 8) for j in range(8)]
    return lax.scan(lambda c, x: (lax.ppermute(c, "i", perm) + x, c), a, xs, reverse=True)


# --- autodiff through collectives ---------------------------------------------------------------

@program("grad_psum_loss", "autodiff", SM, *M2x4, ints((4, 8), (4, 8)), in_specs=(P("x", "y"), P("x", "y")),
         out_specs=P("x", "y"))
def _grad_psum_loss(w, x):
    def loss(w):
        return lax.psum(jnp.sum((w * x) ** 2), ("x", "y"))
    return jax.grad(loss)(w)


@program("grad_all_gather", "autodiff", SM, *M8, ints((8, 2), (8, 2)), in_specs=(P("i"), P()), out_specs=P("i"))
def _grad_all_gather(w, t):
    return jax.grad(lambda w: jnp.sum(lax.all_gather(w, "i", tiled=True) * t))(w)


@program("vjp_ppermute", "autodiff", SM, *M8, ints((8, 3), (8, 3)), in_specs=(P("i"), P("i")), out_specs=P("i"))
def _vjp_ppermute(x, ct):
    perm = [(j, (j + 1) % 8) for j in range(8)]
    _, pull = jax.vjp(lambda v: lax.ppermute(v, "i", perm) * 2, x)
    return pull(ct)[0]


@program("jvp_psum_scatter", "autodiff", SM, *M8, ints((8, 8), (8, 8)), in_specs=(P(None, "i"), P(None, "i")),
         out_specs=P("i"))
def _jvp_psum_scatter(x, t):
    return jax.jvp(lambda v: lax.psum_scatter(v * v, "i", tiled=True), (x,), (t,))[1]


@program("grad_of_shard_map", "autodiff", "jit", *M2x4, ints((8, 4)), in_specs=(P("x", "y"),), out_specs=P("x", "y"))
def _grad_of_shard_map(w):
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = _abstract_mesh(*M2x4)
    f = jax.shard_map(lambda v: lax.psum(jnp.sum(v * v), ("x", "y")), mesh=mesh, in_specs=P("x", "y"), out_specs=P())
    return jax.grad(f)(w)


@jax.custom_vjp
def _clip_grad(x):
    return x


_clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))


@program("custom_vjp_psum", "autodiff", SM, *M8, ints((8, 2)), in_specs=P("i"), out_specs=P("i"))
def _custom_vjp_psum(x):
    return jax.grad(lambda v: lax.psum(jnp.sum(_clip_grad(v) * 3.0), "i"))(x)


@program("custom_jvp_relu_checkpoint", "autodiff", SM, *M8, ints((8, 4)), in_specs=P("i"), out_specs=P("i"))
def _relu_remat(x):
    f = jax.checkpoint(lambda v: jax.nn.relu(v) * lax.psum(v, "i"))
    return jax.grad(lambda v: jnp.sum(f(v)))(x)


# --- models --------------------------------------------------------------------------------------

def _mlp_params(seed):
    rng = np.random.default_rng(seed)
    w1 = rng.integers(-2, 3, size=(4, 8)).astype(np.float32)
    w2 = rng.integers(-2, 3, size=(8, 2)).astype(np.float32)
    x = rng.integers(-2, 3, size=(16, 4)).astype(np.float32)
    y = rng.integers(-2, 3, size=(16, 2)).astype(np.float32)
    return w1, w2, x, y


@program("dp_mlp_train_step", "models", SM, *M8, _mlp_params, in_specs=(P(), P(), P("i"), P("i")),
         out_specs=(P(), P(), P()))
def _dp_mlp(w1, w2, x, y):
    def loss(params):
        a, b = params
        h = jax.nn.relu(x @ a)
        return jnp.sum((h @ b - y) ** 2) * 0.125
    l, (g1, g2) = jax.value_and_grad(loss)((w1, w2))
    g1, g2 = lax.pmean(g1, "i"), lax.pmean(g2, "i")
    return w1 - 0.0625 * g1, w2 - 0.0625 * g2, lax.pmean(l, "i")


# The second step multiplies already-updated (many-bit) weights, so products round and
# XLA's dot accumulation order shows in the last bit: compared within `tol`.
@program("dp_mlp_two_steps_scan", "models", SM, *M8, _mlp_params, in_specs=(P(), P(), P("i"), P("i")),
         out_specs=(P(), P()), tol=1e-6)
def _dp_mlp_scan(w1, w2, x, y):
    def step(params, _):
        g = jax.grad(lambda p: jnp.sum((jax.nn.relu(x @ p[0]) @ p[1] - y) ** 2) * 0.125)(params)
        g = jax.tree_util.tree_map(lambda t: lax.pmean(t, "i"), g)
        return jax.tree_util.tree_map(lambda p, t: p - 0.0078125 * t, params, g), None
    return lax.scan(step, (w1, w2), None, length=2)[0]


@program("tp_matmul_all_gather", "models", SM, *M8, ints((16, 8), (8, 16)), in_specs=(P("i"), P(None, "i")),
         out_specs=P(None, "i"))
def _tp_all_gather(x, w):
    return lax.all_gather(x, "i", tiled=True) @ w


@program("tp_matmul_psum_scatter", "models", SM, *M8, ints((16, 16), (16, 4)), in_specs=(P(None, "i"), P("i")),
         out_specs=P("i"))
def _tp_psum_scatter(x, w):
    return lax.psum_scatter(x @ w, "i", tiled=True)


@program("megatron_mlp_2d", "models", SM, *M2x4, ints((8, 8), (8, 16), (16, 8)),
         in_specs=(P("x"), P(None, "y"), P("y")), out_specs=P("x"))
def _megatron(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    return lax.psum(h @ w2, "y")


@program("collective_matmul_ppermute", "models", SM, *M8, ints((16, 8), (8, 8)), in_specs=(P("i"), P(None, "i")),
         out_specs=P(None, "i"))
def _collective_matmul(x, w):
    n = 8
    perm = [(j, (j - 1) % n) for j in range(n)]
    idx = lax.axis_index("i")

    def step(k, carry):
        blk, acc = carry
        src = (idx + k) % n
        acc = lax.dynamic_update_slice_in_dim(acc, blk @ w, src * blk.shape[0], axis=0)
        return lax.ppermute(blk, "i", perm), acc

    acc = lax.pcast(jnp.zeros((x.shape[0] * n, w.shape[1]), x.dtype), "i", to="varying")
    return lax.fori_loop(0, n, step, (x, acc))[1]


@program("ring_attention", "models", SM, *M8, ints((16, 4), (16, 4), (16, 4), lo=-1, hi=2),
         in_specs=(P("i"), P("i"), P("i")), out_specs=P("i"), tol=1e-5)
def _ring_attention(q, k, v):
    perm = [(j, (j + 1) % 8) for j in range(8)]

    def step(carry, _):
        kb, vb, m, l, o = carry
        s = q @ kb.T
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        o = o * corr[:, None] + p @ vb
        l = l * corr + p.sum(-1)
        return (lax.ppermute(kb, "i", perm), lax.ppermute(vb, "i", perm), m_new, l, o), None

    m0 = lax.pcast(jnp.full((q.shape[0],), -jnp.inf, q.dtype), "i", to="varying")
    l0 = lax.pcast(jnp.zeros((q.shape[0],), q.dtype), "i", to="varying")
    (_, _, _, l, o), _ = lax.scan(step, (k, v, m0, l0, jnp.zeros_like(q)), None, length=8)
    return o / l[:, None]


def _softmax_ulp() -> int:
    """exp's bound, a positive sum of 32 terms (at most 31 ulp however XLA orders it), one
    division, then tanh's bound: the comparison bound of `softmax_tanh_psum`."""
    return ulp_bound("exp") + 31 + 1 + ulp_bound("tanh")


@program("softmax_tanh_psum", "models", SM, *M8, ints((32, 4), lo=0, hi=8), in_specs=P("i"),
         out_specs=P("i"), ulp=_softmax_ulp())
def _softmax_tanh(x):
    # a softmax over a sharded axis: global max by pmax, global denominator by psum
    z = x * 0.25
    e = jnp.exp(z - lax.pmax(z.max(0), "i"))
    return jnp.tanh(e / lax.psum(e.sum(0), "i"))


@program("ring_sum_ppermute_loop", "models", SM, *M8, ints((8, 4)), in_specs=P("i"), out_specs=P("i"))
def _ring_sum(x):
    perm = [(j, (j + 1) % 8) for j in range(8)]

    def step(c, _):
        blk, acc = c
        blk = lax.ppermute(blk, "i", perm)
        return (blk, acc + blk), None

    return lax.scan(step, (x, x), None, length=7)[0][1]


@program("moe_all_to_all_dispatch", "models", SM, *M8, ints((64, 4), (8, 4)), in_specs=(P("i"), P("i")),
         out_specs=P("i"))
def _moe_a2a(tokens, expert_w):
    # 8 tokens per device, one per destination expert; each expert scales its tokens.
    routed = lax.all_to_all(tokens, "i", split_axis=0, concat_axis=0, tiled=True)
    processed = routed * expert_w
    return lax.all_to_all(processed, "i", split_axis=0, concat_axis=0, tiled=True)


# --- explicit-sharding and global-view jit programs ---------------------------------------------

EXPLICIT = ("Explicit", "Explicit")


@program("explicit_reshard_sum", "explicit_sharding", "jit", *M2x4, ints((8, 4)), in_specs=(P("x", "y"),),
         out_specs=None, axis_types=EXPLICIT)
def _explicit_reshard(a):
    b = jax.sharding.reshard(a, P("x", None))
    c = jax.sharding.reshard(b * 2, P(None, "y"))
    return c.sum(0), b


@program("explicit_matmul_out_sharding", "explicit_sharding", "jit", *M2x4, ints((8, 4), (4, 8)),
         in_specs=(P("x", None), P(None, "y")), out_specs=None, axis_types=EXPLICIT)
def _explicit_matmul(a, b):
    return jnp.matmul(a, b, out_sharding=P("x", "y")), (a * 2).T


@program("explicit_auto_axes", "explicit_sharding", "jit", *M2x4, ints((8, 8)), in_specs=(P("x", "y"),),
         out_specs=None, axis_types=EXPLICIT)
def _explicit_auto_axes(a):
    f = jax.sharding.auto_axes(lambda v: v * 3 + 1, out_sharding=P("x", None))
    return f(a)


@program("jit_sharding_constraint", "explicit_sharding", "jit", *M2x4, ints((8, 8)), in_specs=(P("x"),),
         out_specs=(P(None, "y"),))
def _jit_wsc(a):
    b = lax.with_sharding_constraint(a * 2 + 1, jax.sharding.NamedSharding(_context_or(*M2x4), P(None, "y")))
    return (b @ b.T,)


@program("jit_in_out_shardings", "explicit_sharding", "jit", *M2x4, ints((8, 8), (8,)), in_specs=(P("x", "y"), P()),
         out_specs=(P("y"), P("x", "y")))
def _jit_io(a, b):
    return (a @ b, jnp.cumsum(a, axis=1))


@program("jit_device_put_inside", "explicit_sharding", "jit", *M2x4, ints((8, 4)), in_specs=(P("x"),),
         out_specs=(P(),))
def _jit_device_put(a):
    return (jax.device_put(a, jax.sharding.NamedSharding(_context_or(*M2x4), P("y"))) + 1,)


# --- pmap ----------------------------------------------------------------------------------------

PM = "pmap"
program("pmap_psum", "pmap", PM, *M8, ints((8, 3)), pmap_kwargs=dict(axis_name="i"))(
    lambda x: lax.psum(x, "i"))
program("pmap_pmean_normalize", "pmap", PM, *M4, pow2((4, 2)), pmap_kwargs=dict(axis_name="i"))(
    lambda x: x / lax.psum(jnp.abs(x), "i"))
program("pmap_out_axes_none", "pmap", PM, *M8, ints((8, 3)), pmap_kwargs=dict(axis_name="i", out_axes=None))(
    lambda x: lax.psum(x * 2, "i"))
program("pmap_in_axes_none", "pmap", PM, *M4, ints((4, 3), (3,)),
        pmap_kwargs=dict(axis_name="i", in_axes=(0, None)))(lambda x, b: x * b + lax.axis_index("i"))
program("pmap_in_axes_1_out_axes_1", "pmap", PM, *M4, ints((3, 4, 2)),
        pmap_kwargs=dict(axis_name="i", in_axes=1, out_axes=1))(lambda x: lax.pmax(x, "i") - x)
program("pmap_ppermute", "pmap", PM, *M8, ints((8, 2)), pmap_kwargs=dict(axis_name="i"))(
    lambda x: lax.ppermute(x, "i", [(j, (j + 1) % 8) for j in range(8)]))
program("pmap_all_gather", "pmap", PM, *M4, ints((4, 3)), pmap_kwargs=dict(axis_name="i"))(
    lambda x: lax.all_gather(x, "i"))
program("pmap_pytree", "pmap", PM, *M4, ints((4, 2), (4, 3)),
        pmap_kwargs=dict(axis_name="i", out_axes=({"s": 0, "m": None},)))(
    lambda a, b: ({"s": a * 2 + lax.axis_index("i"), "m": lax.pmax(b, "i")},))
program("pmap_scan_psum", "pmap", PM, *M8, ints((8, 4)), pmap_kwargs=dict(axis_name="i"))(
    lambda x: lax.scan(lambda c, _: (lax.psum(c, "i") * 0.125, None), x, None, length=3)[0])
program("pmap_grad", "pmap", PM, *M8, ints((8, 3), (8, 3)), pmap_kwargs=dict(axis_name="i"))(
    lambda w, x: lax.pmean(jax.grad(lambda v: jnp.sum((v * x) ** 2))(w), "i"))


def _pmap_in_jit(x):
    return jax.pmap(lambda v: lax.psum(v, "i") + v, axis_name="i")(x)


program("pmap_inside_jit", "nested", "jit", *M8, ints((8, 3)), in_specs=None, out_specs=(P("i"),))(
    lambda x: (_pmap_in_jit(x),))


# --- nested / transformed shard_map --------------------------------------------------------------

def _abstract_mesh(shape, names):
    return jax.sharding.AbstractMesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


@program("nested_shard_map_partial_manual", "nested", "jit", *M2x4, ints((4, 8)), in_specs=(P("x"),),
         out_specs=(P("x", "y"),))
def _nested_shard_map(a):
    def outer(v):
        inner = jax.shard_map(lambda b: lax.psum(b, "y") + lax.axis_index("y"),
                              mesh=jax.sharding.get_abstract_mesh(), in_specs=P(None, "y"),
                              out_specs=P(None, "y"), axis_names={"y"})
        return lax.psum(inner(v), "x") + v
    return (jax.shard_map(outer, mesh=_context_or(*M2x4), in_specs=P("x"), out_specs=P("x"),
                          axis_names={"x"})(a),)


@program("partial_manual_auto_axis", "nested", SM, *M2x4, ints((4, 8)), in_specs=P("x", None),
         out_specs=P("x", None), manual_axes=frozenset({"x"}))
def _partial_manual(a):
    return lax.psum(a, "x") * 2 + a


@program("vmap_of_shard_map", "nested", "jit", *M2x4, ints((3, 4, 8)), in_specs=(P(None, "x", "y"),),
         out_specs=(P(None, None, "y"),))
def _vmap_shard_map(a):
    f = jax.shard_map(lambda v: lax.psum(v, "x"), mesh=_context_or(*M2x4), in_specs=P("x", "y"),
                      out_specs=P(None, "y"))
    return (jax.vmap(f)(a),)


@program("shard_map_inside_jit_then_global", "nested", "jit", *M2x4, ints((8, 8)), in_specs=(P("x", "y"),),
         out_specs=(P(),))
def _sm_then_global(a):
    f = jax.shard_map(lambda v: lax.all_gather(v, "y", axis=1, tiled=True), mesh=_context_or(*M2x4),
                      in_specs=P("x", "y"), out_specs=P("x"), check_vma=False)
    return (f(a).sum(0),)


def _context_or(shape, names):
    mesh = jax.sharding.get_abstract_mesh()
    return _abstract_mesh(shape, names) if mesh.empty else mesh


# --- jax.random inside shard_map ------------------------------------------------------------------

@program("random_fold_in_axis_index", "random", SM, *M8, lambda s: (np.array([0, s], np.uint32),), in_specs=P(),
         out_specs=P("i"))
def _random_fold_in(key_data):
    key = jax.random.wrap_key_data(key_data)
    k = jax.random.fold_in(key, lax.axis_index("i"))
    return jax.random.randint(k, (1, 4), 0, 100)


@program("random_bits_psum", "random", SM, *M8, lambda s: (np.array([7, s], np.uint32),), in_specs=P(),
         out_specs=P())
def _random_bits_psum(key_data):
    key = jax.random.fold_in(jax.random.wrap_key_data(key_data), lax.axis_index("i"))
    bits = jax.random.bits(key, (4,), jnp.uint32) >> 28
    return lax.psum(bits, "i")


@program("random_dropout_mask", "random", SM, *M2x4, lambda s: (np.array([1, s], np.uint32),
                                                               np.ones((4, 8), np.float32)),
         in_specs=(P(), P("x", "y")), out_specs=P("x", "y"))
def _dropout(key_data, x):
    key = jax.random.fold_in(jax.random.wrap_key_data(key_data), lax.axis_index("x") * 4 + lax.axis_index("y"))
    keep = jax.random.bernoulli(key, 0.5, x.shape)
    return jnp.where(keep, x * 2, 0.0)


# --- programs XLA:CPU cannot run: refsim is checked against NumPy ----------------------------------

def _np_ragged_reference(operand, send_sizes, in_off, out_off, recv_sizes, out_init):
    """Independent ragged_all_to_all over 4 devices, written from JAX's docstring."""
    n = operand.shape[0]
    out = out_init.copy()
    for src in range(n):
        for dst in range(n):
            size = send_sizes[src, dst]
            out[dst, out_off[src, dst]:out_off[src, dst] + size] = operand[src, in_off[src, dst]:in_off[src, dst] + size]
    return out


def _ragged_inputs(seed):
    rng = np.random.default_rng(seed)
    n, cap = 4, 8
    send = rng.integers(0, 3, size=(n, n)).astype(np.int32)            # rows: sender, cols: receiver
    in_off = np.concatenate([np.zeros((n, 1), np.int32), np.cumsum(send, 1)[:, :-1]], 1).astype(np.int32)
    recv = send.T.copy()                                                # recv[dst, src] = send[src, dst]
    recv_off = np.concatenate([np.zeros((n, 1), np.int32), np.cumsum(recv, 1)[:, :-1]], 1).astype(np.int32)
    out_off = recv_off.T.copy()                                         # where src's block lands on dst
    operand = rng.integers(1, 9, size=(n, cap)).astype(np.float32)
    out_init = np.full((n, cap), -1.0, np.float32)
    return operand, out_init, in_off, send, out_off, recv


def _ragged_ref(operand, out_init, in_off, send, out_off, recv):
    return (_np_ragged_reference(operand, send, in_off, out_off, recv, out_init).reshape(-1),)


@program("ragged_all_to_all_moe_dispatch", "no_xla", SM, (4,), ("e",), _ragged_inputs,
         in_specs=(P("e"),) * 6, out_specs=P("e"),
         xla_note="jax 0.10/0.12 on CPU cannot execute ragged-all-to-all", reference=_ragged_ref)
def _ragged(operand, out_init, in_off, send, out_off, recv):
    return lax.ragged_all_to_all(operand[0], out_init[0], in_off[0], send[0], out_off[0], recv[0], axis_name="e")


def _pbroadcast_ref(a):
    blocks = a.reshape(8, -1, a.shape[1])
    return (np.concatenate([blocks[3]] * 8),)


@program("pbroadcast_from_source", "no_xla", SM, *M8, ints((16, 3)), in_specs=P("i"), out_specs=P("i"),
         xla_note="jax 0.10/0.12 have no CPU lowering for pbroadcast", reference=_pbroadcast_ref)
def _pbroadcast(a):
    return lax.pbroadcast(a, "i", source=3)


def _pbroadcast_loop_ref(a):
    blocks = a.reshape(8, -1, a.shape[1]).copy()
    for src in (0, 5):
        blocks = np.stack([blocks[src]] * 8) + blocks
    return (blocks.reshape(a.shape),)


@program("pbroadcast_in_loop", "no_xla", SM, *M8, ints((8, 2)), in_specs=P("i"), out_specs=P("i"),
         xla_note="jax 0.10/0.12 have no CPU lowering for pbroadcast", reference=_pbroadcast_loop_ref)
def _pbroadcast_loop(a):
    a = lax.pbroadcast(a, "i", source=0) + a
    return lax.pbroadcast(a, "i", source=5) + a


def families() -> dict[str, list[Program]]:
    """Programs grouped by family."""
    out: dict[str, list[Program]] = {}
    for p in PROGRAMS:
        out.setdefault(p.family, []).append(p)
    return out


def _check_unique():
    names = [p.name for p in PROGRAMS]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"corpus program names must be unique; duplicated: {sorted(dupes)}")


_check_unique()
__all__ = ["Program", "PROGRAMS", "by_name", "families", "ints", "pow2", "program"]
