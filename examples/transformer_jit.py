"""A transformer block's training step, data + tensor parallel with `jax.jit` and NamedSharding.

The mesh is ('data'=2, 'model'=4). The batch is split over 'data'; the attention heads
(columns of wq/wk/wv, rows of wo) and the MLP's hidden units (columns of w1, rows of w2) are
split over 'model' (Megatron-style); layer-norm scales are replicated. XLA's SPMD partitioner
inserts every collective. One step: loss and gradients by `jax.value_and_grad`, then SGD.

    python examples/transformer_jit.py                      # a few steps, loss printed
    python -m conformance check examples/transformer_jit.py  # the same, every step checked
"""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

D, HEADS, FF, SEQ, BATCH, LR = 32, 4, 64, 8, 8, 0.05

mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

PARAM_SPECS = {
    "ln1": P(), "wq": P(None, "model"), "wk": P(None, "model"), "wv": P(None, "model"), "wo": P("model", None),
    "ln2": P(), "w1": P(None, "model"), "w2": P("model", None),
}
BATCH_SPEC = P("data")


def layer_norm(x, scale):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * scale


def block(params, x):
    """Pre-LN transformer block: causal multi-head self-attention, then a GELU MLP."""
    b, s, d = x.shape
    h = layer_norm(x, params["ln1"])
    heads = lambda w: (h @ w).reshape(b, s, HEADS, d // HEADS)  # noqa: E731
    q, k, v = heads(params["wq"]), heads(params["wk"]), heads(params["wv"])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // HEADS)
    causal = jnp.tril(jnp.ones((s, s), bool))
    att = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d)
    x = x + o @ params["wo"]
    h = layer_norm(x, params["ln2"])
    return x + jax.nn.gelu(h @ params["w1"]) @ params["w2"]


def loss_fn(params, x, y):
    return jnp.mean((block(params, x) - y) ** 2)


def _train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), loss


param_shardings = {k: NamedSharding(mesh, s) for k, s in PARAM_SPECS.items()}
batch_sharding = NamedSharding(mesh, BATCH_SPEC)
train_step = jax.jit(_train_step, in_shardings=(param_shardings, batch_sharding, batch_sharding),
                     out_shardings=(param_shardings, NamedSharding(mesh, P())))


def init(seed=0):
    """(params, x, y) placed on the mesh."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)  # noqa: E731
    params = {"ln1": np.ones(D, np.float32), "wq": w(D, D), "wk": w(D, D), "wv": w(D, D), "wo": w(D, D),
              "ln2": np.ones(D, np.float32), "w1": w(D, FF), "w2": w(FF, D)}
    x = rng.standard_normal((BATCH, SEQ, D)).astype(np.float32)
    y = np.roll(x, -1, axis=1)                          # predict the next position's vector
    params = {k: jax.device_put(v, param_shardings[k]) for k, v in params.items()}
    return params, jax.device_put(x, batch_sharding), jax.device_put(y, batch_sharding)


def main(steps=3):
    params, x, y = init()
    for i in range(steps):
        params, loss = train_step(params, x, y)
        print(f"step {i}: loss {float(loss):.5f}")
    return params


if __name__ == "__main__":
    main()
