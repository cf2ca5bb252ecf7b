"""A pipeline-parallel training step (GPipe schedule) with `ppermute` across stages.

The mesh is ('data'=2, 'stage'=4): four pipeline stages, each holding one layer
(``tanh(h @ w + b)``), replicated twice for data parallelism. Eight microbatches flow through
the pipeline in ``MICRO + STAGES - 1`` ticks of a `lax.scan`: at each tick every stage applies
its layer to what it holds and `ppermute`s the result to the next stage, stage 0 takes in the
next microbatch, and the last stage's outputs are collected. `jax.grad` differentiates
through the scan (the backward pass ppermutes cotangents the other way), and the gradients
are averaged over 'data' with a pmean.

    python examples/pipeline.py
    python -m conformance check examples/pipeline.py
"""
import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

STAGES, DATA, MICRO, MB, D, LR = 4, 2, 8, 4, 16, 0.1

mesh = jax.make_mesh((DATA, STAGES), ("data", "stage"), axis_types=(AxisType.Auto,) * 2)
FORWARD = [(i, i + 1) for i in range(STAGES - 1)]          # stage i sends to stage i + 1


def pipeline(params, xs):
    """The last stage's outputs for every microbatch (zeros on the other stages)."""
    w, b = params["w"][0], params["b"][0]                   # this stage's layer
    stage = jax.lax.axis_index("stage")
    ticks = MICRO + STAGES - 1

    def tick(carry, t):
        held, outs = carry
        # stage 0 takes microbatch t (while there is one), the others what they received
        inp = jnp.where(stage == 0, xs[jnp.minimum(t, MICRO - 1)], held)
        h = jnp.tanh(inp @ w + b)
        done = t - (STAGES - 1)                              # microbatch leaving the last stage
        keep = (stage == STAGES - 1) & (done >= 0)
        outs = outs.at[jnp.maximum(done, 0)].set(jnp.where(keep, h, outs[jnp.maximum(done, 0)]))
        return (jax.lax.ppermute(h, "stage", FORWARD), outs), None

    # the carries differ per stage, so they start out varying over 'stage'
    init = jax.lax.pcast((jnp.zeros_like(xs[0]), jnp.zeros_like(xs)), ("stage",), to="varying")
    (_, outs), _ = jax.lax.scan(tick, init, jnp.arange(ticks))
    return outs


def loss_fn(params, xs, ys):
    outs = pipeline(params, xs)
    stage = jax.lax.axis_index("stage")
    local = jnp.where(stage == STAGES - 1, jnp.mean((outs - ys) ** 2), 0.0)
    return jax.lax.psum(local, "stage")                      # the last stage's loss, everywhere


def _step(params, xs, ys):
    loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
    grads = jax.lax.pmean(grads, "data")
    loss = jax.lax.pmean(loss, "data")
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), loss


PARAM_SPECS = {"w": P("stage"), "b": P("stage")}
BATCH_SPEC = P(None, "data")                                 # (microbatch, examples, features)
train_step = jax.jit(jax.shard_map(_step, mesh=mesh, in_specs=(PARAM_SPECS, BATCH_SPEC, BATCH_SPEC),
                                   out_specs=(PARAM_SPECS, P())))


def init(seed=0):
    rng = np.random.default_rng(seed)
    params = {"w": (rng.standard_normal((STAGES, D, D)) / np.sqrt(D)).astype(np.float32),
              "b": np.zeros((STAGES, 1, D), np.float32)}
    xs = rng.standard_normal((MICRO, MB * DATA, D)).astype(np.float32)
    ys = np.sin(xs)
    put = lambda v, s: jax.device_put(v, NamedSharding(mesh, s))  # noqa: E731
    return {k: put(v, PARAM_SPECS[k]) for k, v in params.items()}, put(xs, BATCH_SPEC), put(ys, BATCH_SPEC)


def main(steps=3):
    params, xs, ys = init()
    for i in range(steps):
        params, loss = train_step(params, xs, ys)
        print(f"step {i}: loss {float(loss):.5f}")
    return params


if __name__ == "__main__":
    main()
