"""Oracle mode on single-device realistic programs, on whatever platform JAX runs (the GPU check).

`python scripts/gpu_oracle.py [--json FILE]` checks each program below with `conformance.check`
(XLA on the platform against refsim in NumPy) and prints one row per program: the verdict, the
policies applied and, per output, the largest |xla - refsim| beside the largest the policy allows.
The programs are the per-device bodies of examples/ (a transformer block's training step, an
MoE layer's routing and expert MLP, a pipeline stage's scan) on a one-device mesh, plus float32
matrix products at JAX's default precision and at "highest", which shows where a platform's
default (TF32 on NVIDIA GPUs) leaves refsim's bound. It runs on CPU too (the same rows, as a
baseline); docs/hardware.md records a GPU run.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

D, HEADS, FF, SEQ, BATCH, EXPERTS = 64, 4, 128, 16, 4, 4


def layer_norm(x, scale):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    import jax

    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * scale


def block(p, x):
    """Pre-LN block: causal multi-head self-attention, then a GELU MLP (examples/transformer_jit.py)."""
    import jax
    import jax.numpy as jnp

    b, s, d = x.shape
    h = layer_norm(x, p["ln1"])
    q, k, v = (jnp.einsum("bsd,de->bse", h, p[w]).reshape(b, s, HEADS, d // HEADS) for w in ("wq", "wk", "wv"))
    att = jnp.einsum("bqhe,bkhe->bhqk", q, k) * (d // HEADS) ** -0.5  # a Python float: keeps the dtype
    att = jnp.where(jnp.tril(jnp.ones((s, s), bool)), att, -1e9)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(att, axis=-1), v).reshape(b, s, d)
    x = x + o @ p["wo"]
    h = layer_norm(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def train_step(p, x, y):
    import jax

    def loss(p):
        return ((block(p, x) - y) ** 2).mean()

    value, grads = jax.value_and_grad(loss)(p)
    return value, jax.tree.map(lambda w, g: w - 0.05 * g, p, grads)


def moe_layer(p, x):
    """Top-1 routing with a one-hot dispatch and per-expert GELU MLPs (examples/moe.py's body)."""
    import jax
    import jax.numpy as jnp

    logits = x @ p["router"]
    gate = jax.nn.softmax(logits, axis=-1)
    choice = jnp.argmax(logits, axis=-1)
    dispatch = jax.nn.one_hot(choice, EXPERTS, dtype=x.dtype)
    h = jnp.einsum("te,td->etd", dispatch, x)
    h = jax.nn.gelu(jnp.einsum("etd,edf->etf", h, p["w1"]))
    out = jnp.einsum("etf,efd->etd", h, p["w2"])
    return jnp.einsum("etd,te->td", out, dispatch * gate)


def pipeline_stage(ws, xs):
    """A scan over microbatches through a stack of tanh layers (examples/pipeline.py's stage body)."""
    import jax
    import jax.numpy as jnp

    def layer(h, w):
        return jnp.tanh(h @ w), None

    def micro(carry, x):
        h, _ = jax.lax.scan(layer, x, ws)
        return carry + h.sum(), h

    return jax.lax.scan(micro, jnp.zeros((), xs.dtype), xs)


def ring_psum(a):
    """The collectives of examples/ over a one-device mesh (identities XLA must still compile)."""
    import jax

    a = jax.lax.ppermute(a, "x", [(0, 0)])
    return jax.lax.psum(a, "x") + jax.lax.all_gather(a, "x", tiled=True)


def programs(dtype):
    """(name, fn, args, check kwargs) for each program, in `dtype` (float32 or bfloat16)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    rng = np.random.default_rng(0)

    def w(*shape, scale=None):
        scale = scale or 1 / np.sqrt(shape[-2] if len(shape) > 1 else shape[0])
        return (rng.standard_normal(shape) * scale).astype(dtype)

    mesh = jax.make_mesh((1,), ("x",))
    rep = NamedSharding(mesh, P())
    params = {"ln1": np.ones(D, dtype), "wq": w(D, D), "wk": w(D, D), "wv": w(D, D), "wo": w(D, D),
              "ln2": np.ones(D, dtype), "w1": w(D, FF), "w2": w(FF, D)}
    x, y = w(BATCH, SEQ, D, scale=1.0), w(BATCH, SEQ, D, scale=1.0)
    moe = {"router": w(D, EXPERTS), "w1": w(EXPERTS, D, FF), "w2": w(EXPERTS, FF, D)}
    a, b = w(256, 256, scale=1.0), w(256, 256, scale=1.0)
    out = [
        ("transformer_train_step", jax.jit(train_step, out_shardings=rep), (params, x, y), {}),
        ("transformer_block_forward", jax.jit(block), (params, x), {}),
        ("moe_layer", jax.jit(moe_layer), (moe, x.reshape(-1, D)), {}),
        ("pipeline_stage_scan", jax.jit(pipeline_stage), (w(3, D, D), w(4, 8, D, scale=1.0)), {}),
        ("shard_map_collectives", ring_psum, (w(8, D, scale=1.0),), {"mesh": mesh, "in_specs": P("x"),
                                                                   "out_specs": P("x")}),
        ("matmul_default_precision", jax.jit(jnp.matmul), (a, b), {}),
    ]

    def matmul_highest(a, b):
        return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)

    out.append(("matmul_highest_precision", jax.jit(matmul_highest), (a, b), {}))
    return out


def run(dtypes=("float32", "bfloat16")) -> list[dict]:
    import jax
    import ml_dtypes

    import conformance

    import contextlib

    rows = []
    for dname in dtypes:
        # "float32@highest": float32 programs under jax.default_matmul_precision("highest")
        base, _, precision = dname.partition("@")
        dtype = np.float32 if base == "float32" else ml_dtypes.bfloat16
        scope = jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()
        with scope:
            rows += _check_all(programs(dtype), dname)
    return rows


def _check_all(progs, dname) -> list[dict]:
    import jax

    import conformance

    rows = []
    for name, fn, args, kw in progs:
        row = {"bench": "gpu_oracle", "program": name, "dtype": dname, "platform": jax.devices()[0].platform,
               "device_kind": jax.devices()[0].device_kind, "jax": jax.__version__}
        try:
            res = conformance.check(fn, *args, name=name, **kw)
            row.update(verdict="AGREE", report=res.report())
        except conformance.ConformanceError as e:
            res = e.result
            row.update(verdict="DISAGREE", report=str(e)[:4000])
        except conformance.NotCheckable as e:
            row.update(verdict="NOT CHECKABLE", reason=e.reason, report=str(e)[:2000])
            rows.append(row)
            continue
        except Exception as e:  # noqa: BLE001 - any other failure is this program's row, not the run's end
            row.update(verdict="ERROR", report=f"{type(e).__name__}: {e}"[:2000])
            rows.append(row)
            continue
        row["policies"] = sorted(set(res.policies))
        row["outputs"] = [{"path": o.path, "shape": list(o.shape), "policy": o.policy,
                           "max_abs_diff": o.max_abs_diff, "allowed": o.allowed, "ulps": o.ulps}
                          for o in res.outputs]
        worst = max(res.outputs, key=lambda o: (o.max_abs_diff / o.allowed) if o.allowed else
                    (np.inf if o.max_abs_diff else 0.0))
        row["worst"] = {"path": worst.path, "max_abs_diff": worst.max_abs_diff, "allowed": worst.allowed,
                        "ulps": worst.ulps}
        row["notes"] = list(res.notes)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="write the JSON lines (with each full report) to this file")
    p.add_argument("--dtypes", default="float32,float32@highest,bfloat16",
                   help="comma-separated: float32, bfloat16, float32@highest (under jax.default_matmul_precision)")
    a = p.parse_args(argv)
    rows = run(tuple(a.dtypes.split(",")))
    print(f"{'program':<28}{'dtype':<16}{'verdict':<15}{'worst |diff|':>13}{'allowed':>11}{'ulp':>10}  policies")
    for r in rows:
        wst = r.get("worst") or {}
        print(f"{r['program']:<28}{r['dtype']:<16}{r['verdict']:<15}"
              f"{wst.get('max_abs_diff', float('nan')):>13.3g}{wst.get('allowed', float('nan')):>11.3g}"
              f"{(wst.get('ulps') if wst.get('ulps') is not None else float('nan')):>10.3g}  "
              + "; ".join(r.get("policies", [r.get("reason", "")])) + ("  [TF32 note]" if r.get("notes") else ""))
    if a.json:
        with open(a.json, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
