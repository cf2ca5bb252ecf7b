"""Meta-tests of sharded_programs(): every draw traces with the shapes the value model states,
every op is reachable and runs on both sides, bad arguments raise InvalidArgument, the
reproducer runs, and a failing program shrinks to a smaller op graph."""
import ast
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

import refsim
import xla_backend
from conformance.verdict import xfails
from conformance.verdict.compare import compare
from conformance.hunt import check_in_subprocess
from conformance.strategies import OPS, ShardedProgram, meshes, sharded_programs
from conformance.strategies._sharded_ops import ALIASES
from conformance.strategies._sharded_ops.sharding import has_unreduced
from conformance.strategies.sharded import PATTERNS, ErrorBound, assemble
from conformance.suites.sharded import shrink_case
from refsim import compat
from refsim.layouts.mesh import Mesh
from test_strategies_collectives import _run_script

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
DEVICES = {d.id: d for d in jax.devices()}
FIND = settings(max_examples=3000, database=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
                derandomize=True)


def trace(case: ShardedProgram):
    """The output avals of `case` traced by plain JAX (jit with its shardings, under its mesh)."""
    m = case.mesh
    devs = np.array([DEVICES[int(i)] for i in m.device_ids.ravel()], dtype=object).reshape(m.axis_sizes)
    jm = compat.make_jax_mesh(devs, m.axis_names, m.axis_types)
    named = lambda s: jax.sharding.NamedSharding(jm, s.spec.to_jax())  # noqa: E731
    g = jax.jit(case.fn, in_shardings=tuple(map(named, case.in_shardings)),
                out_shardings=tuple(map(named, case.out_shardings)))
    # the arguments typed with their shardings, as placed arrays are (Explicit axes type them)
    args = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype, sharding=named(s))
            for a, s in zip(case.args, case.in_shardings)]
    with compat.use_partitioner(case.partitioner), jax.set_mesh(jm):
        return jax.tree_util.tree_leaves(jax.eval_shape(g, *args))


def assert_traces_as_modelled(case: ShardedProgram):
    avals = trace(case)
    _, policies, final, _ = assemble(case.graph)
    assert [(tuple(a.shape), str(a.dtype)) for a in avals] == [(tuple(s), d) for s, d in final], case.source
    assert len(policies) == len(avals) == len(case.out_shardings)


# JAX errors on well-typed programs (docs/found-bugs.md 13): a draw that meets one is JAX's bug, not the model's
JAX_TRACE_BUGS = (r"dynamic_update_slice operand sharding must be equal to update sharding",)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(sharded_programs())
def test_every_draw_traces_with_the_modelled_shapes(case):
    assert isinstance(case, ShardedProgram) and case.entry == "jit"
    try:
        assert_traces_as_modelled(case)
    except Exception as e:  # noqa: BLE001 - a known JAX bug is skipped, anything else fails
        if not any(re.search(p, str(e)) for p in JAX_TRACE_BUGS):
            raise
        reject()


def run_judged(case: ShardedProgram) -> str:
    """The runner's verdict on `case` with the CPU xfails applied (a known JAX / XLA bug is "xfail")."""
    from conformance.engine import runner
    from conformance.verdict import xfails
    from conformance.suites.base import ProgramTask

    task = ProgramTask(case.case_id, "sharded", case.family, case.dtype, [case], None)
    res = runner.run_task(task, xla_backend, xfails.load(None, platform="cpu").lookup(case.case_id), shrink_seconds=0)
    assert res.status in ("pass", "xfail"), res.message
    return res.status


# In this process, programs that no known XLA abort can reach: no size-3 axis (jaxlib 0.12 aborts on some
# reshards over one, xfails/cpu.txt jit_constraint) and Shardy (GSPMD aborts on several partial-manual
# shard_maps, docs/found-bugs.md); `test_options_are_reached` runs GSPMD programs in a fresh process.
SAFE_MESHES = meshes(sizes=(1, 2, 4, 5, 8))


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_is_reachable_and_agrees(op):
    types = ("explicit",) if op == "reshard" else ("auto",) if op == "with_sharding_constraint" else ("auto", "explicit")
    names = ALIASES.get(op, (op,))   # one drawer, several ops (tile_repeat: tile or repeat)
    case = find(sharded_programs(SAFE_MESHES, ops=(op,), max_ops=2, axis_types=types, transforms=("none",),
                                 partitioners=("shardy",)),
                lambda p: set(names) & set(p.ops), settings=FIND)
    assert case.case_id.startswith("sharded[ops=") and any(n in case.case_id for n in names)
    assert_traces_as_modelled(case)
    run_judged(case)


def test_a_pad_with_a_negative_low_edge_and_interior_padding_is_named_apart():
    # found-bugs 23: such a pad of a split dimension aborts the SPMD partitioner, so the case id names it
    # `pad_neg_interior` (the xfails entry lists just these); the padding config is read back from the source
    seen = set()

    @settings(max_examples=120, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(sharded_programs(Mesh((2, 2), ("x", "y")), ops=("pad",), max_ops=3, transforms=("none",)))
    def check(case):
        for line, (op, _) in zip(case.graph.lines, case.graph.line_ops):
            if "jax.lax.pad(" not in line:
                continue
            cfg = ast.literal_eval(re.search(r"(\[\(.*\)\])\)$", line).group(1))
            named = any(lo < 0 and interior > 0 for lo, _, interior in cfg)
            assert op == ("pad_neg_interior" if named else "pad"), (line, op)
            seen.add(op)

    check()
    assert seen == {"pad", "pad_neg_interior"}
    assert xfails.load(None, platform="cpu").lookup(
        "sharded[ops=pad_neg_interior+sin,transform=none,types=auto,partitioner=shardy,dtype=float32,mesh=2:default]").crash
    plain = xfails.load(None, platform="cpu").lookup(
        "sharded[ops=pad+sin,transform=none,types=auto,partitioner=shardy,dtype=float32,mesh=2:default]")
    assert plain is None or not plain.crash


def test_at_least_sixty_ops_and_every_pattern_is_drawn():
    assert len(OPS) >= 60
    seen = set()

    # derandomized: a random 150 programs now and then had no constraint on an uneven dimension
    @settings(max_examples=150, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(sharded_programs())
    def collect(case):
        seen.update(p for _, p in case.op_patterns)

    collect()
    assert set(PATTERNS) <= seen, set(PATTERNS) - seen


def test_options_are_reached():
    for kw, pred in (({"transforms": ("vmap",)}, lambda p: p.transform == "vmap" and "vmap" in p.source),
                     ({"transforms": ("grad",)}, lambda p: p.transform == "grad" and "jax.grad" in p.source),
                     ({"transforms": ("vjp",)}, lambda p: p.transform == "vjp" and "jax.vjp" in p.source),
                     ({"axis_types": ("explicit",)}, lambda p: p.axis_types == "explicit"
                      and all(t.name == "Explicit" for t in p.mesh.axis_types)),
                     ({"partitioners": ("gspmd",)}, lambda p: p.partitioner == "gspmd"),
                     ({}, lambda p: any(len(set(s.spec) - {None}) and p.mesh.size > 1 for s in p.in_shardings))):
        case = find(sharded_programs(**kw), pred, settings=FIND)
        assert_traces_as_modelled(case)
        # in a fresh process: a derivative may meet a partitioner CHECK that aborts (docs/found-bugs.md)
        sig = check_in_subprocess(case, with_xfails=True)
        assert sig is None, (sig, case.describe())


@pytest.mark.parametrize("kwargs, match", [
    ({"ops": ("nope",)}, r"ops contains 'nope'"),
    ({"ops": ()}, r"ops=\(\) is empty"),
    ({"min_ops": 0}, r"min_ops=0 must be at least 1"),
    ({"min_ops": 5, "max_ops": 2}, r"min_ops=5 must not exceed max_ops=2"),
    ({"max_inputs": 0}, r"max_inputs=0 must be at least 1"),
    ({"transforms": ("jit",)}, r"transforms contains 'jit'"),
    ({"axis_types": ("manual",)}, r"axis_types contains 'manual'"),
    ({"partitioners": ("xla",)}, r"partitioners contains 'xla'"),
    ({"dtypes": ("float64",)}, r"dtypes contains 'float64'"),
    ({"transforms": ("vmap",), "axis_types": ("explicit",)}, r"add 'auto' to axis_types"),
    ({"transforms": ("grad",), "dtypes": ("int32",)}, r"add 'float32' to dtypes"),
    ({"ops": ("reshard",), "axis_types": ("auto",)}, r"reshard on Explicit ones"),
    ({"mesh": "2x4"}, r"mesh='2x4' must be a refsim Mesh"),
])
def test_bad_arguments_raise_invalid_argument(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        sharded_programs(**kwargs)


def test_reproducer_runs_with_partitioner_and_axis_types(tmp_path):
    case = find(sharded_programs(Mesh((2, 2), ("x", "y")), partitioners=("gspmd",), axis_types=("explicit",),
                                 transforms=("none",)),
                lambda p: "reshard" in p.ops, settings=FIND)
    text = case.repro(case.run(refsim))
    assert "jax.config.update('jax_use_shardy_partitioner', False)" in text
    assert "AXIS_TYPES = ('Explicit', 'Explicit')" in text   # the mesh _mesh() builds and the loader reads
    r = _run_script(tmp_path, text)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shrink_cuts_the_graph_to_what_still_fails():
    case = find(sharded_programs(Mesh((2, 2), ("x", "y")), ops=("cumsum", "pad", "sin"), transforms=("none",),
                                 axis_types=("auto",), min_ops=4),
                lambda p: len(p.graph.outs) >= 2 and "cumsum" in p.ops and "with_sharding_constraint" in p.ops,
                settings=FIND)
    fails = lambda c: "jnp.cumsum" in c.source or "jax.lax.cumsum" in c.source  # noqa: E731
    small = shrink_case(case, fails, seconds=30)
    assert fails(small) and len(small.graph.outs) == 1
    assert "with_sharding_constraint" not in small.source
    assert all(all(p is None for p in s.spec) for s in small.in_shardings + small.out_shardings)
    assert_traces_as_modelled(small)


def test_error_bound_holds_each_element_to_its_bound():
    mesh = Mesh((2,), ("x",))
    want = refsim.device_put(np.float32([1.0, np.nan, 3.0, np.inf]), refsim.NamedSharding(mesh, refsim.PartitionSpec("x")))
    pol = ErrorBound.around(want, 0.25)
    near = refsim.device_put(np.float32([1.25, np.nan, 2.75, np.inf]), want.sharding)
    far = refsim.device_put(np.float32([1.5, np.nan, 3.0, np.inf]), want.sharding)
    lost = refsim.device_put(np.float32([1.0, 2.0, 3.0, np.inf]), want.sharding)
    assert compare(want, near, tolerances=[pol]).ok
    r = compare(want, far, tolerances=[pol])
    assert not r.ok and re.search(r"element \(0,\) \(global \(0,\)\): exact 1.0, xla 1.5", r.report())
    assert not compare(want, lost, tolerances=[pol]).ok   # NaN where refsim has NaN


def test_same_seed_same_source_in_every_process(tmp_path):
    # a program's text must not depend on string hashing (a set of axis names printed in hash
    # order did): two processes with different PYTHONHASHSEEDs draw the same programs
    script = tmp_path / "draw.py"
    script.write_text(
        "from hypothesis import HealthCheck, Phase, given, seed, settings\n"
        "from conformance.strategies import sharded_programs\n"
        "out = []\n"
        "@seed(5)\n"
        "@settings(max_examples=60, database=None, phases=[Phase.generate], deadline=None,\n"
        "          suppress_health_check=list(HealthCheck))\n"
        "@given(sharded_programs(ops=('shard_map_ppermute', 'shard_map_psum', 'add'), max_ops=3))\n"
        "def t(case):\n"
        "    out.append(case.source)\n"
        "t()\n"
        "print('\\n=====\\n'.join(out))\n")
    texts = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        texts.append(r.stdout)
    assert "axis_names={" in texts[0]
    assert texts[0] == texts[1]


@pytest.mark.skipif(not has_unreduced(), reason="this JAX has no unreduced specs")
@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(sharded_programs(SAFE_MESHES, ops=("unreduced_sum", "mul", "sum", "matmul"), min_ops=2, max_ops=4,
                        axis_types=("explicit",), transforms=("none", "grad", "vjp"), partitioners=("shardy",)))
def test_unreduced_values_trace_and_agree_forward_and_backward(case):
    # a reduce_sum into P(..., unreduced={...}), then the reshard that adds the partial sums: refsim
    # holds the partials (refsim.interpreter.unreduced) and must agree with XLA's all-reduce, and
    # with its transpose under grad / vjp
    if "unreduced=" not in case.source:
        reject()
    assert_traces_as_modelled(case)
    run_judged(case)
