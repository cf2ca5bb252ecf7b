"""A mixture-of-experts layer's training step with expert parallelism: tokens are dispatched
to their experts with `all_to_all` and the results come back with a second `all_to_all`.

The mesh is ('expert'=8): one expert per device, and the tokens split over the same devices.
Each device routes its tokens (top-1, a softmax gate, capacity CAPACITY per expert; tokens over
capacity are dropped, as in Switch Transformer), packs them into an (expert, capacity, d)
buffer, and `all_to_all` hands every expert the tokens routed to it from every device. After
the expert MLP a second `all_to_all` returns the results, which are combined with the gates.
`jax.grad` differentiates through both exchanges (an all_to_all's transpose is an all_to_all).

`ragged_step` is the same layer with `ragged_all_to_all` (no padding to capacity: each device
sends exactly the tokens it routed to each expert). XLA:CPU has no ragged_all_to_all, so
`main` runs it only on platforms that have it (GPU, TPU).

    python examples/moe.py
    python -m conformance check examples/moe.py
"""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

EXPERTS, TOKENS, D, FF, CAPACITY, LR = 8, 16, 16, 32, 4, 0.1

mesh = jax.make_mesh((EXPERTS,), ("expert",), axis_types=(AxisType.Auto,))


def route(router, x, capacity=CAPACITY):
    """(dispatch mask (tokens, experts, capacity), gate per token) for top-1 routing with capacity."""
    probs = jax.nn.softmax(x @ router, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    gate = jnp.max(probs, axis=-1)
    onehot = jax.nn.one_hot(choice, EXPERTS, dtype=jnp.int32)
    slot = jnp.cumsum(onehot, axis=0) * onehot - 1            # this token's place in its expert's buffer
    mask = (onehot[..., None] == 1) & (slot[..., None] == jnp.arange(capacity))
    return mask.astype(x.dtype), gate


def expert_mlp(w1, w2, h):
    return jax.nn.gelu(h @ w1) @ w2


def moe_layer(params, x, capacity=CAPACITY):
    mask, gate = route(params["router"], x, capacity)
    send = jnp.einsum("tec,td->ced", mask, x)                 # (capacity, expert, d), as GShard packs it
    # expert e receives column e from every device: (source device * capacity, 1, d)
    recv = jax.lax.all_to_all(send, "expert", split_axis=1, concat_axis=0, tiled=True)
    out = expert_mlp(params["w1"][0], params["w2"][0], recv)
    back = jax.lax.all_to_all(out, "expert", split_axis=0, concat_axis=1, tiled=True)  # (capacity, expert, d)
    return jnp.einsum("tec,ced->td", mask * gate[:, None, None], back)


def loss_fn(params, x, y):
    err = moe_layer(params, x) - y
    return jax.lax.psum(jnp.sum(err ** 2), "expert") / (EXPERTS * TOKENS * D)


def _step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads = {**grads, "router": jax.lax.psum(grads["router"], "expert")}
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), loss


PARAM_SPECS = {"router": P(), "w1": P("expert"), "w2": P("expert")}
train_step = jax.jit(jax.shard_map(_step, mesh=mesh, in_specs=(PARAM_SPECS, P("expert"), P("expert")),
                                   out_specs=(PARAM_SPECS, P()), check_vma=False))


# -- the same dispatch with ragged_all_to_all (platforms that have it) ---------------------------
def ragged_moe_layer(params, x):
    """Tokens sorted by expert and sent without padding: expert e receives exactly the tokens
    routed to it, packed after those of lower-numbered source devices."""
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    choice, gate = jnp.argmax(probs, axis=-1), jnp.max(probs, axis=-1)
    order = jnp.argsort(choice)
    sizes = jnp.bincount(choice, length=EXPERTS).astype(jnp.int32)       # tokens this device sends to e
    offsets = (jnp.cumsum(sizes) - sizes).astype(jnp.int32)
    all_sizes = jax.lax.all_gather(sizes, "expert")                      # (source, expert)
    me = jax.lax.axis_index("expert")
    # where my tokens for expert e land in e's buffer: after the sources before me
    out_offsets = (jnp.cumsum(all_sizes, axis=0) - all_sizes)[me].astype(jnp.int32)
    recv_sizes = all_sizes[:, me].astype(jnp.int32)
    buf = jnp.zeros((EXPERTS * TOKENS, D), x.dtype)
    recv = jax.lax.ragged_all_to_all(x[order], buf, offsets, sizes, out_offsets, recv_sizes, axis_name="expert")
    out = expert_mlp(params["w1"][0], params["w2"][0], recv)
    # send results back: the reverse exchange
    back_offsets = (jnp.cumsum(recv_sizes) - recv_sizes).astype(jnp.int32)
    return_offsets = (jnp.cumsum(all_sizes, axis=1) - all_sizes)[:, me].astype(jnp.int32)
    back = jax.lax.ragged_all_to_all(out, jnp.zeros((TOKENS, D), x.dtype), back_offsets, recv_sizes,
                                     return_offsets, sizes, axis_name="expert")
    y_sorted = back * gate[order][:, None]
    return jnp.zeros_like(x).at[order].set(y_sorted)


ragged_forward = jax.jit(jax.shard_map(ragged_moe_layer, mesh=mesh, in_specs=(PARAM_SPECS, P("expert")),
                                       out_specs=P("expert"), check_vma=False))
dense_forward = jax.jit(jax.shard_map(moe_layer, mesh=mesh, in_specs=(PARAM_SPECS, P("expert")),
                                      out_specs=P("expert"), check_vma=False))
# Capacity for every token: no token is dropped, so this equals the ragged dispatch.
dropless_forward = jax.jit(jax.shard_map(lambda p, x: moe_layer(p, x, capacity=TOKENS), mesh=mesh,
                                         in_specs=(PARAM_SPECS, P("expert")), out_specs=P("expert"),
                                         check_vma=False))


def has_ragged_all_to_all() -> bool:
    """XLA:CPU has no ragged_all_to_all; GPU and TPU do."""
    return jax.devices()[0].platform != "cpu"


def init(seed=0):
    rng = np.random.default_rng(seed)
    params = {"router": rng.standard_normal((D, EXPERTS)).astype(np.float32),
              "w1": (rng.standard_normal((EXPERTS, D, FF)) / np.sqrt(D)).astype(np.float32),
              "w2": (rng.standard_normal((EXPERTS, FF, D)) / np.sqrt(FF)).astype(np.float32)}
    x = rng.standard_normal((EXPERTS * TOKENS, D)).astype(np.float32)
    y = np.tanh(x)
    put = lambda v, s: jax.device_put(v, NamedSharding(mesh, s))  # noqa: E731
    return {k: put(v, PARAM_SPECS[k]) for k, v in params.items()}, put(x, P("expert")), put(y, P("expert"))


def main(steps=3):
    params, x, y = init()
    for i in range(steps):
        params, loss = train_step(params, x, y)
        print(f"step {i}: loss {float(loss):.5f}")
    if has_ragged_all_to_all():
        print("ragged dispatch:", float(jnp.abs(ragged_forward(params, x)).mean()))
    return params


if __name__ == "__main__":
    main()
