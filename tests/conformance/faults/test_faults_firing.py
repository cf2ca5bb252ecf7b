"""conformance.faults reports whether a planted fault fired, and each fault fires where its
description says and nowhere else.

`inject` yields a `Planted` (the names, and `fired`: how many times each changed what XLA compiled
or ran); a block where a fault never fired warns (`FaultNotFired`). Expected values of the
partitioned reduction come from NumPy: the rows of the last block of the split dimension left out.
"""
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as JP

import xla_backend
from conformance import faults
from conformance.debug import bisect
from conformance.debug.explain import xla_side
from conformance.faults import catalogue, compiler, jaxpr, numerics
from refsim import Mesh, NamedSharding, PartitionSpec as P
from refsim import compat as _compat

N = 8
X = (np.arange(N * 2, dtype=np.float32).reshape(N, 2) + 1) * np.array([1, -3], np.float32)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RING = [(i, (i + 1) % N) for i in range(N)]


@pytest.fixture(scope="module")
def m8():
    return xla_backend.mesh((N,), ("i",))


@pytest.fixture(scope="module")
def m24():
    return xla_backend.mesh((2, 4), ("x", "y"))


def smap(f, mesh, x=X, ins=P("i"), outs=P("i")):
    """XLA's result (a refsim.Array: a fault may leave replicas that disagree, which np.asarray refuses)."""
    return xla_backend.shard_map(f, mesh=mesh, in_specs=(ins,), out_specs=outs)(x)


def jit(f, mesh, x, sin, sout=P()):
    return np.asarray(xla_backend.jit(f, in_shardings=(NamedSharding(mesh, sin),),
                                      out_shardings=NamedSharding(mesh, sout))(x))


def cuda_text(f, mesh, *shapes):
    g = jax.jit(jax.shard_map(f, mesh=xla_backend.jax_mesh(mesh), in_specs=(JP("i"),) * len(shapes),
                              out_specs=JP("i")))
    return g.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


def _ragged(mesh):
    def f(op, out, io, ss, oo, rs):
        return jax.lax.ragged_all_to_all(op[0], out[0], io[0], ss[0], oo[0], rs[0], axis_name="j")[None]

    m = xla_backend.mesh((N, 1), ("i", "j"))
    shapes = [jax.ShapeDtypeStruct((N, 4), np.float32), jax.ShapeDtypeStruct((N, 6), np.float32)] + \
        [jax.ShapeDtypeStruct((N, 1), np.int32)] * 4
    return cuda_text(f, m, *shapes)


def _reshard(mesh):
    rev = Mesh((N,), ("i",), device_ids=np.arange(N)[::-1])
    placed = xla_backend.device_put(X, NamedSharding(mesh, P("i")))
    xla_backend.device_put(placed, NamedSharding(rev, P("i")))


# One program each fault targets (the programs of test_faults.py, run only to count).
TARGETED = {
    "ppermute_pairs_reversed": lambda m8, m24: smap(lambda a: jax.lax.ppermute(a, "i", RING), m8),
    "ppermute_fixed_points_dropped": lambda m8, m24: smap(lambda a: jax.lax.ppermute(a, "i", [(0, 0), (1, 2), (2, 1)]),
                                                          m8),
    "ppermute_one_cycle_kept": lambda m8, m24: smap(lambda a: jax.lax.ppermute(a, "i", [(0, 1), (1, 0), (2, 3), (3, 2)]),
                                                    m8),
    "groups_strided_as_contiguous": lambda m8, m24: xla_backend.pmap(
        lambda a: jax.lax.psum(a, "i", axis_index_groups=[[0, 2, 4, 6], [1, 3, 5, 7]]), axis_name="i")(X),
    "multi_axis_mesh_order": lambda m8, m24: smap(lambda a: jax.lax.all_gather(a, ("y", "x"), tiled=True), m24,
                                                  ins=P(("x", "y")), outs=P(("x", "y"))),
    "all_to_all_split_concat_swapped": lambda m8, m24: smap(lambda a: jax.lax.all_to_all(a, "i", 0, 1, tiled=True), m8,
                                                            x=np.ones((N * 16, 3), np.int32)),
    "all_gather_reversed_order": lambda m8, m24: smap(lambda a: jax.lax.all_gather(a, "i", axis=1, tiled=True), m8),
    "psum_scatter_wrong_dimension": lambda m8, m24: smap(
        lambda a: jax.lax.psum_scatter(a, "i", scatter_dimension=1, tiled=True), m8, x=np.ones((N * 2, 8), np.int32)),
    "pmax_pmin_wrong_start": lambda m8, m24: smap(lambda a: jax.lax.pmax(a, "i"), m8, outs=P()),
    "psum_drop_member": lambda m8, m24: smap(lambda a: jax.lax.psum(a, "i"), m8, outs=P()),
    "pbroadcast_wrong_source": lambda m8, m24: cuda_text(lambda a: jax.lax.pbroadcast(a, "i", source=3), m8,
                                                         jax.ShapeDtypeStruct(X.shape, X.dtype)),
    "axis_index_reversed": lambda m8, m24: smap(lambda a: a + jax.lax.axis_index("i").astype(a.dtype), m8),
    "ragged_all_to_all_single_device_offsets": lambda m8, m24: _ragged(m8),
    "pmax_pmin_drop_nan": lambda m8, m24: smap(lambda a: jax.lax.pmax(a, "i"), m8, outs=P()),
    "psum_accumulates_in_bf16": lambda m8, m24: smap(lambda a: jax.lax.psum(a, "i"), m8, outs=P()),
    "axis_index_wrong_device_id": lambda m8, m24: smap(lambda a: a + jax.lax.axis_index("i").astype(a.dtype), m8),
    "partitioned_reduction_drops_shard": lambda m8, m24: jit(lambda a: a.sum(axis=0, keepdims=True), m8, X,
                                                             P("i", None)),
    "sharding_constraint_wrong_permutation": lambda m8, m24: jit(
        lambda a: jax.lax.with_sharding_constraint(a + 1, JP("i", None)), m8, X, P()),
    "reshard_permutation_ignored": lambda m8, m24: _reshard(m8),
    "output_shards_swapped": lambda m8, m24: smap(lambda a: a * 2, m8),
}


def test_every_fault_has_a_targeted_program():
    assert set(TARGETED) == set(faults.names())


@pytest.mark.parametrize("name", list(TARGETED))
def test_each_fault_fires_on_a_program_it_targets(name, m8, m24):
    with warnings.catch_warnings():
        warnings.simplefilter("error", faults.FaultNotFired)
        with faults.inject(name) as planted:
            TARGETED[name](m8, m24)
    assert planted == [name] and planted.fired[name] >= 1, planted.fired


def test_the_other_faults_fire_on_programs_they_target(m8):
    with faults.inject(numerics.DOT_GENERAL_BF16) as planted:
        jit(lambda a: a @ a.T, m8, X, P("i", None))
    assert planted.fired["dot_general_bf16_operands"] >= 1
    with faults.inject(compiler.PERMUTE_TO_MISSING_DEVICE) as planted:
        cuda_text(lambda a: jax.lax.ppermute(a, "i", RING), m8, jax.ShapeDtypeStruct(X.shape, X.dtype))
    assert planted.fired["ppermute_to_missing_device"] >= 1

    def collectives(a):
        b = jax.lax.ppermute(a, "i", RING)
        return jax.lax.psum_scatter(b, "i", tiled=True) + jax.lax.psum(b, "i")[:1]

    module = cuda_text(collectives, m8, jax.ShapeDtypeStruct((N * N, 2), np.float32))
    edits = [compiler.reversed_permute_pairs, compiler.all_reduce_sum_as_max, compiler.all_reduce_sum_as_product,
             compiler.reduce_scatter_sum_as_max, compiler.permute_to_missing_device]
    for edit in edits:
        with faults.inject(edit) as planted:
            assert xla_side.with_planted(None)(module) != module
        assert planted.fired == {edit.fault_name: 1}
    with faults.inject(jaxpr.reversed_ppermute()) as planted:
        assert not bisect(lambda a: jax.lax.ppermute(a, "i", RING), X, mesh=m8, in_specs=P("i"), out_specs=P("i")).ok
    assert planted.fired["reversed_ppermute"] >= 1
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    with faults.inject(jaxpr.regrouped_psum()) as planted:
        res = bisect(lambda a: jax.lax.psum(a, "i", axis_index_groups=groups), X, mesh=m8, in_specs=P("i"),
                     out_specs=P("i"), check_vma=False)
    assert planted.fired["regrouped_psum"] >= 1 and res.divergence.primitive == "psum"


def test_a_planted_check_fires_in_the_worker(m8):
    with faults.inject(compiler.XLA_CHECK_IN_COMPILE) as planted:
        res = bisect(lambda a: a * 2, X, mesh=m8, in_specs=P("i"), out_specs=P("i"))
    assert res.divergence.crash and planted.fired["xla_check_in_compile"] >= 1


# -- plants that never fire ----------------------------------------------------------------------------------
def _silent(fault, run):
    with pytest.warns(faults.FaultNotFired) as caught:
        with faults.inject(fault) as planted:
            run()
    name = planted[0]
    assert planted.fired == {name: 0} and planted.silent == [name]
    (w,) = [w for w in caught if issubclass(w.category, faults.FaultNotFired)]
    text = str(w.message)
    assert f"{name} never fired inside the block" in text and "Plant it in a program it targets" in text
    assert w.filename == __file__                          # the user's `with` line, not the library's
    return text


def test_the_two_plants_measured_silent_are_reported_as_not_fired(m8):
    # a ring has no self-sends to drop; a psum without axis_index_groups has no strided groups
    text = _silent("ppermute_fixed_points_dropped", lambda: smap(lambda a: jax.lax.ppermute(a, "i", RING), m8))
    assert "it targets JAX's lowering of ppermute: ppermute drops self-send pairs" in text
    text = _silent("groups_strided_as_contiguous", lambda: smap(lambda a: jax.lax.psum(a, "i"), m8, outs=P()))
    assert "JAX's lowering of psum, pmax, pmin, all_gather, reduce_scatter, all_to_all" in text


def test_faults_that_change_nothing_do_not_fire(m8):
    _silent("ppermute_pairs_reversed", lambda: smap(lambda a: jax.lax.ppermute(a, "i", [(0, 1), (1, 0)]), m8))
    _silent("psum_scatter_wrong_dimension", lambda: smap(lambda a: jax.lax.psum_scatter(a, "i", tiled=True), m8,
                                                         x=np.ones((N * 8, 2), np.float32)))
    text = _silent(compiler.reversed_permute_pairs, lambda: xla_side.with_planted(None)("module {}"))
    assert "the module explain compiles: Every `collective_permute` sends" in text
    _silent(jaxpr.reversed_ppermute(), lambda: bisect(lambda a: a * 2, X, mesh=m8, in_specs=P("i"), out_specs=P("i")))


def test_an_edit_called_directly_still_says_it_has_nothing_to_edit():
    with pytest.raises(faults.NothingToEdit, match="no collective_permute to edit"):
        compiler.reversed_permute_pairs("module {}")
    assert issubclass(faults.NothingToEdit, ValueError)


def test_warn_false_and_a_block_left_by_an_exception_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", faults.FaultNotFired)
        with faults.inject("psum_drop_member", warn=False) as planted:
            pass
        with pytest.raises(RuntimeError, match="boom"):
            with faults.inject("psum_drop_member"):
                raise RuntimeError("boom")
    assert planted.fired == {"psum_drop_member": 0} and planted.summary() == "psum_drop_member fired 0 times"


def test_nested_blocks_count_their_own_faults(m8):
    with faults.inject("psum_drop_member", warn=False) as outer:
        with faults.inject("ppermute_pairs_reversed") as inner:
            smap(lambda a: jax.lax.ppermute(a, "i", RING), m8)
        smap(lambda a: jax.lax.psum(a, "i"), m8, outs=P())
    assert inner.fired == {"ppermute_pairs_reversed": 1} and outer.fired == {"psum_drop_member": 1}


# -- partitioned_reduction_drops_shard: only dimensions split across the devices -------------------------------
def _dropped(x, dim, blocks):
    """The sum over `dim` with the last of its `blocks` equal blocks left out (as the fault's description says)."""
    keep = x.shape[dim] - x.shape[dim] // blocks
    return np.take(x, range(keep), axis=dim).sum(axis=dim, keepdims=True)


@pytest.mark.parametrize("partitioner", _compat.partitioners())
def test_partitioned_reduction_fires_only_on_split_dimensions(partitioner, m8, m24):
    x = np.arange(64, dtype=np.float32).reshape(8, 8) % 7 + 1
    cases = [  # (mesh, in spec, program, reduced dim, blocks of that dim: 1 = not split)
        (m8, P("i", None), lambda a: a.sum(axis=0, keepdims=True), 0, 8),
        (m8, P("i", None), lambda a: (a * 2).sum(axis=0, keepdims=True) / 2, 0, 8),   # through elementwise ops
        (m24, P("x", None), lambda a: a.sum(axis=0, keepdims=True), 0, 2),       # split in 2 blocks of 4 rows
        (m24, P(None, ("x", "y")), lambda a: a.sum(axis=1, keepdims=True), 1, 8),
        (m8, P(), lambda a: jax.lax.with_sharding_constraint(a, JP("i", None)).sum(axis=0, keepdims=True), 0, 8),
        (m8, P(), lambda a: a.sum(axis=0, keepdims=True), 0, 1),                 # replicated: not split
        (m8, P("i", None), lambda a: a.sum(axis=1, keepdims=True), 1, 1),        # the other dimension is split
        (m8, P(None, None), lambda a: jnp.sum(a, axis=0, keepdims=True), 0, 1),
    ]
    with _compat.use_partitioner(partitioner):
        for mesh, spec, f, dim, blocks in cases:
            with faults.inject("partitioned_reduction_drops_shard", warn=False) as planted:
                got = jit(f, mesh, x, spec)
            want = _dropped(x, dim, blocks) if blocks > 1 else x.sum(axis=dim, keepdims=True)
            np.testing.assert_allclose(got, want, err_msg=f"{partitioner} {spec} dim {dim}")
            assert bool(planted.fired["partitioned_reduction_drops_shard"]) == (blocks > 1), (spec, dim, planted.fired)


def test_partitioned_reduction_leaves_shard_map_alone(m8):
    with faults.inject("partitioned_reduction_drops_shard", warn=False) as planted:
        got = smap(lambda a: a.sum(axis=0, keepdims=True), m8, ins=P(), outs=P())
    np.testing.assert_array_equal(np.asarray(got), X.sum(axis=0, keepdims=True))
    assert planted.fired == {"partitioned_reduction_drops_shard": 0}


# -- the catalogue: --plant NAME -------------------------------------------------------------------------------
def test_every_catalogue_entry_is_a_fault_inject_takes():
    names = [e.name for e in catalogue.entries()]
    assert len(set(names)) == len(names) and len({e.bare for e in catalogue.entries()}) == len(names)
    assert [n.partition(":")[2] for n in names[:len(faults.names())]] == list(faults.names())
    for e in catalogue.entries():
        assert e.name.split(":")[0] in ("lowering", "numerics", "compiler", "jaxpr")
        assert faults.stage_of(e.make()) in faults.STAGES and e.tools and e.summary
    assert catalogue.by_name("psum_drop_member").name == "lowering:psum_drop_member"
    assert catalogue.by_name("jaxpr:reversed_ppermute", "bisect").make().fault_name == "reversed_ppermute"


def test_a_bad_plant_names_the_valid_choices():
    with pytest.raises(ValueError, match=r"--plant 'nope': no such fault; choose from lowering:ppermute_pairs_reversed"):
        catalogue.by_name("nope", "check")
    with pytest.raises(ValueError, match=r"jaxpr:reversed_ppermute is applied by bisect, not by explain .*"
                                         r"for explain choose from .*compiler:reversed_permute_pairs"):
        catalogue.by_name("reversed_ppermute", "explain")
    with pytest.raises(ValueError, match="compiler:reversed_permute_pairs is applied by explain, not by check"):
        catalogue.resolve(["compiler:reversed_permute_pairs"], "check")


PSUM_REPRO = '''\
# conformance reproducer v1: shard_map/psum/8
import numpy as np, jax
from jax.sharding import PartitionSpec as P
MESH_SHAPE = (8,)
AXIS_NAMES = ('i',)
DEVICE_IDS = [0, 1, 2, 3, 4, 5, 6, 7]
KIND = "shard_map"
IN_SPECS = (P('i'),)
OUT_SPECS = P()
CHECK_VMA = True
def program(a):
    return jax.lax.psum(a * 2.0, 'i')
def inputs(): return (np.arange(16, dtype=np.float32).reshape(8, 2),)
'''


def test_explain_and_bisect_take_plant(tmp_path, capsys):
    from conformance.cli import main

    repro = tmp_path / "psum_repro.py"
    repro.write_text(PSUM_REPRO)
    assert main(["explain", str(repro), "--plant", "lowering:psum_drop_member"]) == 1
    out, err = capsys.readouterr()
    assert "diverged in: lowering" in out and "planted psum_drop_member: fired" in err
    assert main(["explain", str(repro), "--plant", "all_reduce_sum_as_max"]) == 1
    out, err = capsys.readouterr()
    assert "diverged in: compiler" in out and "planted all_reduce_sum_as_max: fired once" in err
    assert main(["bisect", str(repro), "--plant", "psum_drop_member"]) == 1
    out, err = capsys.readouterr()
    assert "primitive: psum" in out and "planted psum_drop_member: fired" in err
    assert main(["bisect", str(repro), "--plant", "jaxpr:reversed_ppermute"]) == 0       # no ppermute to reverse
    out, err = capsys.readouterr()
    assert "MATCH" in out and "planted reversed_ppermute: never fired; it targets an equation" in err
    assert main(["explain", str(repro), "--plant", "jaxpr:reversed_ppermute"]) == 2
    assert "applied by bisect, not by explain" in capsys.readouterr().err
    assert main(["bisect", str(repro), "--plant", "jaxpr:reversed_ppermute", "--runner",
                 "conformance.faults.jaxpr:reverse_first_ppermute"]) == 2
    assert "both choose the runner" in capsys.readouterr().err


CHECK_SCRIPT = textwrap.dedent('''\
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    ring = jax.jit(jax.shard_map(lambda a: jax.lax.ppermute(a * 2, "i", [(j, (j + 1) % 8) for j in range(8)]),
                                 mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    print("ring", np.asarray(ring(np.arange(16.0, dtype=np.float32).reshape(8, 2)))[0])
    ''')


def test_check_takes_plant(tmp_path):
    script = tmp_path / "ring.py"
    script.write_text(CHECK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}

    def check(*plant):
        return subprocess.run([sys.executable, "-m", "conformance", "check", *plant, str(script)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)

    bad = check("--plant", "ppermute_pairs_reversed")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "DISAGREE" in bad.stderr and "planted ppermute_pairs_reversed: fired" in bad.stderr
    silent = check("--plant", "lowering:psum_drop_member")
    assert silent.returncode == 0, silent.stdout + silent.stderr
    assert "planted psum_drop_member: never fired" in silent.stderr
    refused = check("--plant", "compiler:reversed_permute_pairs")
    assert refused.returncode == 2 and "applied by explain, not by check" in refused.stderr
    assert "Traceback" not in bad.stderr + silent.stderr + refused.stderr
