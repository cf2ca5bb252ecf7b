"""explain and bisect on realistic programs: healthy ones are clean at the defaults, and a fault
planted in one op is blamed on the right stage and the right op.

Programs: a sequence-parallel MLP block, a tensor-parallel (Megatron) MLP, a sequence-sharded
attention block, and the examples/ models (FSDP transformer, jit transformer, pipeline, MoE).
Faults: lowering faults through `conformance.faults` (wrong lowering rules injected into JAX),
compiler faults by editing the module XLA compiles (`conformance.faults.compiler`), a planted
fatal CHECK in XLA's compile / run, and XLA:CPU's own NaN-dropping all-reduce max (backend).
"""
import importlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import xla_backend
from conformance.debug import bisect
from conformance.debug.explain import explain
from conformance.faults import compiler as planted
from conformance.faults import lowering as faults

P = jax.sharding.PartitionSpec
RNG = np.random.default_rng(0)


def _w(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(np.float32)


# -- programs (each body line that calls a collective is named in the expectations) -------------
def seq_parallel_mlp(x, w1, w2):
    h = lax.all_gather(x, "i", axis=1, tiled=True)                   # SP_GATHER
    h = jax.nn.gelu(h @ w1)
    y = h @ w2
    return lax.psum_scatter(y, "i", scatter_dimension=1, tiled=True)  # SP_SCATTER


def megatron_mlp(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    return lax.psum(h @ w2, "i")                                      # MEGA_PSUM


def seq_attention(q, k, v):
    logits = jnp.einsum("qd,kd->qk", q, k) / np.sqrt(q.shape[-1])
    m = lax.pmax(logits.max(-1, keepdims=True), "i")                 # ATT_PMAX
    e = jnp.exp(logits - m)
    s = lax.psum(e.sum(-1, keepdims=True), "i")                      # ATT_DENOM
    return lax.psum(e @ v, "i") / s                                   # ATT_NUM


def clip_by_global_max(g):
    top = lax.pmax(jnp.abs(g).max(), "i")                             # CLIP_PMAX
    return g / jnp.maximum(top, 1.0)


def _line(fn, tag: str) -> int:
    import inspect

    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(src) if f"# {tag}" in ln)


@pytest.fixture(scope="module")
def m8():
    return xla_backend.mesh((8,), ("i",))


SP = (seq_parallel_mlp, (RNG.standard_normal((2, 32, 16)).astype(np.float32), _w(16, 64), _w(64, 16)),
      dict(in_specs=(P(None, "i"), P(None, "i"), P("i")), out_specs=P(None, "i")))
MEGA = (megatron_mlp, (RNG.standard_normal((16, 32)).astype(np.float32), _w(32, 64), _w(64, 32)),
        dict(in_specs=(P(), P(None, "i"), P("i")), out_specs=P()))
ATT = (seq_attention, tuple(RNG.standard_normal((16, 8)).astype(np.float32) for _ in range(3)),
       dict(in_specs=(P(), P("i"), P("i")), out_specs=P()))


def _run(prog, m8, **kw):
    fn, args, specs = prog
    return explain(fn, *args, mesh=m8, **specs, **kw)


def test_healthy_realistic_blocks_are_clean_at_the_defaults(m8):
    for prog in (SP, MEGA, ATT):
        e = _run(prog, m8)
        assert e.diverged_in is None and e.complete, e.report()
        fn, args, specs = prog
        r = bisect(fn, *args, mesh=m8, **specs)
        assert r.ok, r.report()


# (program, fault, how, expected stage, expected op, tag of the expected source line or None)
LOWERING = [
    (SP, "all_gather_reversed_order", "stablehlo.all_gather", "SP_GATHER"),
    (SP, "psum_scatter_wrong_dimension", "stablehlo.reduce_scatter", "SP_SCATTER"),
    (MEGA, "psum_drop_member", "stablehlo.all_reduce", "MEGA_PSUM"),
    (MEGA, "psum_accumulates_in_bf16", "stablehlo.all_reduce", "MEGA_PSUM"),
    (ATT, "psum_drop_member", "stablehlo.all_reduce", "ATT_DENOM"),
    (ATT, "psum_accumulates_in_bf16", "stablehlo.all_reduce", "ATT_DENOM"),
]
COMPILER = [
    (MEGA, planted.all_reduce_sum_as_max, "stablehlo.all_reduce"),
    (MEGA, planted.all_reduce_sum_as_product, "stablehlo.all_reduce"),
    (SP, planted.reduce_scatter_sum_as_max, "stablehlo.reduce_scatter"),
    (ATT, planted.all_reduce_sum_as_product, "stablehlo.all_reduce"),
    (ATT, planted.all_reduce_sum_as_max, "stablehlo.all_reduce"),
]


@pytest.mark.parametrize("case", range(len(LOWERING)))
def test_lowering_fault_right_stage_and_op(case, m8):
    prog, fault, op, tag = LOWERING[case]
    with faults.inject(fault):
        e = _run(prog, m8)
        fn, args, specs = prog
        r = bisect(fn, *args, mesh=m8, **specs)
    assert e.diverged_in == "lowering" and e.op == op, e.report()
    assert e.source.endswith(f":{_line(prog[0], tag)}"), (e.source, e.report())
    want = {"stablehlo.all_gather": "all_gather", "stablehlo.reduce_scatter": "reduce_scatter",
            "stablehlo.all_reduce": "psum"}[op]
    assert r.divergence is not None and r.divergence.primitive.startswith(want), r.report()


@pytest.mark.parametrize("case", range(len(COMPILER)))
def test_compiler_fault_right_stage_and_op(case, m8):
    prog, edit, op = COMPILER[case]
    e = _run(prog, m8, edit_module=edit)
    assert e.diverged_in == "compiler" and e.op == op, e.report()
    assert e.agrees["lowered"] is True


def test_live_xla_cpu_nan_dropping_max_is_the_backend(m8):
    if jax.devices()[0].platform != "cpu":
        pytest.skip("XLA:CPU's all-reduce max drops NaN; other platforms may not")
    g = RNG.standard_normal((8, 4)).astype(np.float32)
    g[5, 2] = np.nan
    e = explain(clip_by_global_max, g, mesh=m8, in_specs=P("i"), out_specs=P("i"))
    assert e.diverged_in == "backend", e.report()
    # execution gives no values inside the program: explain names the op defining the output, and
    # bisect (compiling prefixes) names the equation
    assert any("codegen or runtime" in n for n in e.notes)
    r = bisect(clip_by_global_max, g, mesh=m8, in_specs=P("i"), out_specs=P("i"))
    assert r.divergence is not None and r.divergence.primitive == "pmax", r.report()


@pytest.mark.parametrize("fault,stage", [(planted.XLA_CHECK_IN_COMPILE, "compiler"),
                                         (planted.XLA_CHECK_IN_EXECUTE, "backend")])
def test_fatal_check_in_a_realistic_block(fault, stage, m8):
    with faults.inject(fault):
        e = _run(MEGA, m8)
    assert e.diverged_in == stage and "Check failed" in e.crash, e.report()


# -- the examples/ models: the programs a user would debug first -------------------------------------
EXAMPLES = [
    ("transformer_fsdp", "all_gather_reversed_order", "lowering", "stablehlo.all_gather"),
    ("transformer_fsdp", "psum_drop_member", "lowering", "stablehlo.all_reduce"),
    ("pipeline", "ppermute_pairs_reversed", "lowering", "stablehlo.collective_permute"),
    ("transformer_fsdp", "psum_accumulates_in_bf16", "lowering", "stablehlo.all_reduce"),
    ("moe", "all_to_all_split_concat_swapped", "lowering", "stablehlo.all_to_all"),
    # the reversed forward ppermute equals a value of the backward one: explain puts the ops it
    # verifies right in evaluation order, not by the first value they agree with
    ("pipeline", planted.reversed_permute_pairs, "compiler", "stablehlo.collective_permute"),
    ("transformer_fsdp", planted.all_reduce_sum_as_max, "compiler", "stablehlo.all_reduce"),
    # a gradient's reduce_scatter (all_gather's transpose) with a max body: XLA's compiled module has
    # three reduce_scatters of one key and shape, which explain pairs by the values they agree with
    ("transformer_fsdp", planted.reduce_scatter_sum_as_max, "compiler", "stablehlo.reduce_scatter"),
    ("transformer_fsdp", planted.all_reduce_sum_as_product, "compiler", "stablehlo.all_reduce"),
    ("moe", planted.all_reduce_sum_as_max, "compiler", "stablehlo.all_reduce"),
    ("pipeline", planted.all_reduce_sum_as_product, "compiler", "stablehlo.all_reduce"),
]


@pytest.fixture(scope="module")
def example_inputs():
    return {name: importlib.import_module(f"examples.{name}") for name in ("transformer_fsdp", "pipeline", "moe",
                                                                            "transformer_jit")}


def test_examples_are_clean_at_the_defaults(example_inputs):
    for name, mod in example_inputs.items():
        e = explain(mod.train_step, *mod.init())
        assert e.diverged_in is None and e.complete, (name, e.report())


@pytest.mark.parametrize("name,fault,stage,op", EXAMPLES)
def test_fault_in_an_example_right_stage_and_op(name, fault, stage, op, example_inputs):
    mod = example_inputs[name]
    if callable(fault):
        e = explain(mod.train_step, *mod.init(), edit_module=fault)
    else:
        with faults.inject(fault):
            e = explain(mod.train_step, *mod.init())
    assert (e.diverged_in, e.op) == (stage, op), e.report()
