"""The transformer block's training step with `jax.shard_map` and explicit collectives:
FSDP (ZeRO-3) over 'data' and Megatron tensor parallelism over 'model'.

The mesh is ('data'=2, 'model'=4). Every weight is stored split over both axes; inside the
step each device all_gathers its weights over 'data' (FSDP), computes its heads / hidden units
(split over 'model'), and psums the row-parallel matmuls over 'model'. `jax.grad` turns each
all_gather into a psum_scatter in the backward pass, so the gradients come back split over
'data' exactly as the weights are stored; the loss is a psum over 'data' of the local losses.

    python examples/transformer_fsdp.py
    python -m conformance check examples/transformer_fsdp.py
"""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

D, HEADS, FF, SEQ, BATCH, LR = 32, 4, 64, 8, 8, 0.05
DATA, MODEL = 2, 4

mesh = jax.make_mesh((DATA, MODEL), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

# (storage spec, dimension gathered over 'data' inside the step)
PARAMS = {
    "ln1": (P("data"), 0), "ln2": (P("data"), 0),
    "wq": (P("data", "model"), 0), "wk": (P("data", "model"), 0), "wv": (P("data", "model"), 0),
    "wo": (P("model", "data"), 1),
    "w1": (P("data", "model"), 0), "w2": (P("model", "data"), 1),
}
PARAM_SPECS = {k: s for k, (s, _) in PARAMS.items()}


def gather(params):
    """FSDP: each device's full copy of its 'model' slice of every weight."""
    return {k: jax.lax.all_gather(w, "data", axis=PARAMS[k][1], tiled=True) for k, w in params.items()}


def layer_norm(x, scale):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * scale


def local_block(p, x):
    """The block on this device's batch shard and this device's heads / hidden units."""
    b, s, d = x.shape
    local_heads = HEADS // MODEL
    h = layer_norm(x, p["ln1"])
    heads = lambda w: (h @ w).reshape(b, s, local_heads, d // HEADS)  # noqa: E731
    q, k, v = heads(p["wq"]), heads(p["wk"]), heads(p["wv"])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // HEADS)
    causal = jnp.tril(jnp.ones((s, s), bool))
    att = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, local_heads * (d // HEADS))
    x = x + jax.lax.psum(o @ p["wo"], "model")                 # row-parallel: sum the heads' parts
    h = layer_norm(x, p["ln2"])
    return x + jax.lax.psum(jax.nn.gelu(h @ p["w1"]) @ p["w2"], "model")


def loss_fn(params, x, y):
    err = local_block(gather(params), x) - y
    return jax.lax.psum(jnp.sum(err ** 2), "data") / (BATCH * SEQ * D)


def _step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), loss


train_step = jax.jit(jax.shard_map(_step, mesh=mesh, in_specs=(PARAM_SPECS, P("data"), P("data")),
                                   out_specs=(PARAM_SPECS, P())))


def init(seed=0):
    """(params, x, y) placed on the mesh (the same values as examples.transformer_jit's)."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)  # noqa: E731
    params = {"ln1": np.ones(D, np.float32), "wq": w(D, D), "wk": w(D, D), "wv": w(D, D), "wo": w(D, D),
              "ln2": np.ones(D, np.float32), "w1": w(D, FF), "w2": w(FF, D)}
    x = rng.standard_normal((BATCH, SEQ, D)).astype(np.float32)
    y = np.roll(x, -1, axis=1)
    placed = {k: jax.device_put(v, NamedSharding(mesh, PARAM_SPECS[k])) for k, v in params.items()}
    batch = NamedSharding(mesh, P("data"))
    return placed, jax.device_put(x, batch), jax.device_put(y, batch)


def main(steps=3):
    params, x, y = init()
    for i in range(steps):
        params, loss = train_step(params, x, y)
        print(f"step {i}: loss {float(loss):.5f}")
    return params


if __name__ == "__main__":
    main()
