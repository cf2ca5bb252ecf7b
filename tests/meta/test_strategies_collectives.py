"""Meta-tests of axis_index_groups / permutations / collective_calls: JAX accepts every draw,
every option is reached, ids are stable, and reproducers run."""
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.verdict import xfails
from conformance.cases import CollectiveCall, group_members
from conformance.verdict.compare import SumBound, compare
from conformance.strategies import (
    COLLECTIVES, axis_index_groups, collective_calls, groups_kind, meshes, perm_kind, permutations,
)
from refsim.layouts.mesh import Mesh

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

DEVICES = {d.id: d for d in jax.devices()}
CPU_XFAILS = xfails.load(None, platform="cpu")


# -- running a case on JAX directly (independent of xla_backend) --------------------------------
class Shard:
    def __init__(self, s):
        self.device_id, self.index, self.data = s.device.id, s.index, np.asarray(s.data)


class Result:
    """The refsim.Array surface (shape, dtype, shards) over a jax.Array's addressable shards."""

    def __init__(self, a):
        self.shape, self.dtype = a.shape, a.dtype
        self.shards = sorted((Shard(s) for s in a.addressable_shards), key=lambda s: s.device_id)


def jax_mesh(m: Mesh):
    devs = np.array([DEVICES[int(i)] for i in m.device_ids.ravel()], dtype=object).reshape(m.axis_sizes)
    return jax.sharding.Mesh(devs, m.axis_names)


def jax_sharding(s):
    return jax.sharding.NamedSharding(jax_mesh(s.mesh), s.spec.to_jax())


def run_on_jax(case, *, trace_only=False):
    """Run a case with plain JAX; `trace_only` only abstract-evaluates it (no lowering)."""
    if case.entry == "pmap":
        devs = [DEVICES[int(i)] for i in case.mesh.device_ids.ravel()]
        g = jax.pmap(case.fn, axis_name=case.mesh.axis_names[0], devices=devs)
    elif case.entry == "shard_map":
        kw = {} if case.axis_names is None else {"axis_names": set(case.axis_names)}
        # With axis_names (partial manual) the layout over the other axes is the compiler's
        # choice unless jit is told; refsim lays the output out by out_specs, so ask for that.
        jit_kw = {} if case.axis_names is None else {
            "out_shardings": jax.sharding.NamedSharding(jax_mesh(case.mesh), case.out_specs.to_jax())}
        g = jax.jit(jax.shard_map(case.fn, mesh=jax_mesh(case.mesh), in_specs=tuple(s.to_jax() for s in case.in_specs),
                                  out_specs=case.out_specs.to_jax(), **kw), **jit_kw)
    elif case.entry == "jit":
        g = jax.jit(case.fn, in_shardings=tuple(jax_sharding(s) for s in case.in_shardings),
                    out_shardings=jax_sharding(case.out_shardings))
        if trace_only:
            return jax.eval_shape(g, *case.args)
        set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
        with set_mesh(jax_mesh(case.mesh)):
            return [Result(o) for o in jax.tree_util.tree_leaves(g(*case.args))]
    else:
        x = jax.device_put(case.args[0], jax_sharding(case.in_shardings[0]))
        return [Result(jax.device_put(x, jax_sharding(case.out_shardings)))]
    if trace_only:
        return jax.eval_shape(g, *case.args)
    return [Result(o) for o in jax.tree_util.tree_leaves(g(*case.args))]


CPU_CANNOT_LOWER = ("pbroadcast",)   # XLA:CPU has no pbroadcast lowering (jax 0.10 - 0.12)


def assert_matches_refsim(case, out):
    """Plain JAX's result `out` agrees with refsim's for `case`, or differs exactly as the CPU
    xfails entry for the case expects (its signature: element classes or platform model)."""
    import refsim
    from conformance.verdict import platform_models

    r = compare(case.run(refsim), out, case=case)
    if r.ok:
        return
    entry = CPU_XFAILS.lookup(case.case_id) if jax.devices()[0].platform == "cpu" else None
    if entry is not None:
        # every model of the entries the id matches (a bfloat16 axis_index_ppermute matches the
        # xla-cpu-arith entry and the jax-0.10 ppermute one), as the runner checks them
        models = {name: platform_models.check(name, case, out) for name in entry.models}
        ok, why = entry.expects(xfails.comparison_failure(r, models))
        assert ok, f"{case.case_id}: listed as {entry.signature}, but {why}\n{r.report()}"
        return
    raise AssertionError(r.report())


# -- axis_index_groups ---------------------------------------------------------------------------
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), axis_index_groups(n))))
def test_groups_cover_every_index_once_in_equal_sizes(n_groups):
    n, groups = n_groups
    assert sorted(i for g in groups for i in g) == list(range(n))
    assert len({len(g) for g in groups}) == 1


@pytest.mark.parametrize("kind, n, example", [
    ("contiguous", 4, None), ("strided", 6, None), ("shuffled", 2, [[1, 0]]), ("singleton", 3, [[0], [1], [2]]),
])
def test_groups_reach_every_kind(kind, n, example):
    g = find(axis_index_groups(n, kinds=(kind,)), lambda g: True)
    assert groups_kind(g, n) == kind
    if example is not None:
        assert g == example


def test_groups_kind_by_hand():
    assert groups_kind([[0, 1], [2, 3]], 4) == "contiguous"
    assert groups_kind([[0, 1, 2, 3]], 4) == "contiguous"
    assert groups_kind([[0, 2], [1, 3]], 4) == "strided"
    assert groups_kind([[0, 3], [1, 2]], 4) == "shuffled"
    assert groups_kind([[1, 0]], 2) == "shuffled"
    assert groups_kind([[0], [1]], 2) == "singleton"


def test_groups_validate():
    with pytest.raises(InvalidArgument, match="none of kinds=\\('strided',\\) is possible for axis_size=3"):
        axis_index_groups(3, kinds=("strided",)).example()
    with pytest.raises(InvalidArgument, match="kinds contains 'ragged'"):
        axis_index_groups(4, kinds=("ragged",)).example()
    with pytest.raises(InvalidArgument, match="axis_size=0 must be at least 1"):
        axis_index_groups(0).example()


# -- permutations ----------------------------------------------------------------------------------
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), permutations(n))))
def test_permutations_are_valid_ppermute_perms(n_perm):
    n, perm = n_perm
    src, dst = [s for s, _ in perm], [d for _, d in perm]
    assert len(set(src)) == len(src) and len(set(dst)) == len(dst)
    assert all(0 <= i < n for i in src + dst)


@pytest.mark.parametrize("kind", ["partial", "fixed_points", "identity", "cycles"])
def test_permutations_reach_every_kind(kind):
    assert perm_kind(find(permutations(5, kinds=(kind,)), lambda p: True), 5) == kind


def test_permutations_reach_several_cycles_and_empty():
    def cycles(p):
        seen, count = set(), 0
        nxt = dict(p)
        for s in nxt:
            if s not in seen:
                count += 1
                while s not in seen:
                    seen.add(s)
                    s = nxt[s]
        return count
    assert cycles(find(permutations(6, kinds=("cycles",)), lambda p: cycles(p) >= 2)) >= 2
    assert find(permutations(4, kinds=("partial",)), lambda p: len(p) == 0) == []


def test_perm_kind_by_hand():
    assert perm_kind([(0, 1), (1, 0)], 2) == "cycles"
    assert perm_kind([(0, 0), (1, 2), (2, 1)], 3) == "fixed_points"
    assert perm_kind([(0, 1)], 2) == "partial"
    assert perm_kind([(0, 0), (1, 1)], 2) == "identity"


# -- collective_calls -------------------------------------------------------------------------------
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(st.data())
def test_collective_calls_are_accepted_by_jax_and_sums_lie_in_the_bound(data):
    m = data.draw(meshes())
    call = data.draw(collective_calls(m, mode=data.draw(st.sampled_from(["exact", "random", "special"]))))
    assert isinstance(call, CollectiveCall)
    if call.name in CPU_CANNOT_LOWER:
        run_on_jax(call, trace_only=True)
        return
    out = run_on_jax(call)
    # refsim and plain JAX agree, and both lie in the sum policy built from the case's inputs by an
    # independent model of who sums what (a wrong group model would put a psum outside it).
    # XLA:CPU's documented differences (xfails/cpu.txt) must match their entry's signature.
    assert_matches_refsim(call, out)


def test_group_members_by_hand():
    m = Mesh((2, 4), ("x", "y"))
    members, rank = group_members(m, ("y", "x"), [[0, 2], [1, 3], [4, 6], [5, 7]])
    # linear index over ('y', 'x') is 2*y + x; device (x=1, y=2) = position 6 has index 5 -> group [5, 7]
    # = (y=2, x=1) and (y=3, x=1) = positions 6 and 7
    assert members[6].tolist() == [6, 7] and rank[6] == 0 and rank[7] == 1
    members, _ = group_members(m, "x")
    assert members[5].tolist() == [1, 5]


def test_psum_scatter_bound_by_hand():
    """psum_scatter over 'x' of a 2x1 mesh, tiled: device 1 gets the second half of the sum."""
    m = Mesh((2,), ("x",))
    x = np.array([1, 2, 10, 20], np.float32)   # device 0 holds [1, 2], device 1 holds [10, 20]
    from refsim.layouts.partition_spec import PartitionSpec as P
    call = CollectiveCall(family="psum_scatter", source="def f(a):\n    return a\n", entry="shard_map", mesh=m,
                          args=(x,), in_specs=(P("x"),), out_specs=P("x"), outputs=("sum",),
                          name="psum_scatter", params={"axis_name": "x", "scatter_dimension": 0, "tiled": True})
    (b,) = call.tolerances()
    assert isinstance(b, SumBound) and b.n == 2
    assert b.exact[0].tolist() == [11.0] and b.exact[1].tolist() == [22.0]


def test_pmap_psum_bound_has_the_pmap_shard_shape():
    """pmap's output shards keep the mapped axis (shape (1, 3) here), so the bound's exact
    value must too: device d's exact psum is the column sums of x, 12 + 15 + 18 for column 0."""
    m = Mesh((4,), ("i",))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    call = CollectiveCall(family="psum", source="def f(a):\n    return jax.lax.psum(a, 'i')\n", entry="pmap",
                          mesh=m, args=(x,), outputs=("sum",), name="psum", params={"axis_name": "i"})
    (b,) = call.tolerances()
    for d in range(4):
        assert b.exact[d].tolist() == [[18.0, 22.0, 26.0]]
    (out,) = run_on_jax(call)
    assert {s.data.shape for s in out.shards} == {(1, 3)}
    assert_matches_refsim(call, [out])


# find() without the (slow) shrink phase. max_examples is explicit: a module-level settings object
# otherwise takes the profile's (15 in dev), too few to reach a 1-in-8 option reliably; find() stops
# at the first match, so the bound costs nothing when the option is common.
FAST = settings(max_examples=2000, database=None, phases=(Phase.generate,))
COVERAGE_MESH = meshes(min_axes=2, max_axes=2, sizes=(2, 4), device_orders=("default",))


def _reach(pred, **kw):
    # generate only: reaching the option is the point, and shrinking these big draws is slow
    return find(COVERAGE_MESH.flatmap(lambda m: collective_calls(m, **kw)), pred,
                settings=settings(max_examples=2000, database=None, phases=(Phase.generate,)))


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_calls_reach_every_collective(name):
    assert _reach(lambda c: True, collectives=(name,)).name == name


G = ("pmax", "all_gather", "psum_scatter")


@pytest.mark.parametrize("what, names, pred", [
    ("axes tuple out of mesh order", G, lambda c: c.params["axis_name"] == ("y", "x")),
    ("axes single string", G, lambda c: c.params["axis_name"] == "y"),
    ("groups strided", G, lambda c: dict(c.labels).get("groups") == "strided"),
    ("groups shuffled", G, lambda c: dict(c.labels).get("groups") == "shuffled"),
    ("tiled all_gather, negative axis", ("all_gather",), lambda c: c.params["tiled"] and c.params["axis"] < 0),
    ("untiled all_gather", ("all_gather",), lambda c: not c.params["tiled"]),
    ("untiled psum_scatter", ("psum_scatter",), lambda c: not c.params["tiled"]),
    ("all_to_all split != concat", ("all_to_all",), lambda c: c.params["split_axis"] != c.params["concat_axis"]),
    ("ppermute partial", ("ppermute",), lambda c: dict(c.labels).get("perm") == "partial"),
    ("pbroadcast source 3", ("pbroadcast",), lambda c: c.params.get("source") == 3),
    ("out spec omits a reduced axis", ("psum",), lambda c: "x" not in c.out_specs.used_axes()),
    ("input invariant over an axis", COLLECTIVES, lambda c: len(c.in_specs[0].used_axes()) < 2),
])
def test_collective_calls_reach_parameters(what, names, pred):
    assert pred(_reach(pred, collectives=names, dtypes=("int8",)))


@pytest.mark.parametrize("dtype", ["float32", "int32", "float16", "bfloat16", "bool", "int8", "uint32", "complex64"])
def test_collective_calls_reach_every_dtype(dtype):
    assert _reach(lambda c: c.dtype == dtype).dtype == dtype


@pytest.mark.parametrize("name", ["psum", "pmean"])
def test_psum_groups_come_through_pmap_on_1d_meshes(name):
    """JAX's shard_map rejects psum/pmean axis_index_groups (NotImplementedError), so the strategy
    draws them only under pmap, on 1-D meshes; the draw must reach that option and JAX run it."""
    c = find(st.just(Mesh((4,), ("i",))).flatmap(lambda m: collective_calls(m, collectives=(name,))),
             lambda c: "axis_index_groups" in c.params, settings=FAST)
    assert c.entry == "pmap" and dict(c.labels)["entry"] == "pmap"
    assert dict(c.labels)["groups"] == groups_kind(c.params["axis_index_groups"], 4)
    assert_matches_refsim(c, run_on_jax(c))


@pytest.mark.parametrize("name", ["psum", "pmean"])
def test_psum_groups_never_come_under_shard_map(name):
    calls = meshes(min_axes=1, max_axes=2, sizes=(2, 4)).flatmap(
        lambda m: collective_calls(m, collectives=(name,), entries=("shard_map",)))
    with pytest.raises(Exception, match="No examples found"):
        find(calls, lambda c: "axis_index_groups" in c.params,
             settings=settings(max_examples=200, database=None, phases=(Phase.generate,)))


def test_case_ids_are_stable_and_readable():
    calls = collective_calls(Mesh((2, 2), ("x", "y")), collectives=("psum",), dtypes=("float32",))
    c = find(calls, lambda c: c.params["axis_name"] == ("y", "x"), settings=FAST)
    again = find(calls, lambda c: c.params["axis_name"] == ("y", "x") and c.args[0].size > 4, settings=FAST)
    assert c.case_id == again.case_id == "psum[axes=('y','x'),groups=none,dtype=float32,mesh=2x2:default]"
    assert re.fullmatch(r"[a-z_]+\[[^\s]*\]", c.case_id)


@pytest.mark.parametrize("kwargs, message", [
    (dict(collectives=("pgather",)), "collectives contains 'pgather'"),
    (dict(mode="noisy"), "mode='noisy' must be one of"),
    (dict(collectives=("pmax",), dtypes=("complex64",)), "no dtype in dtypes=\\('complex64',\\)"),
    (dict(entries=()), "entries=\\(\\) is empty"),
    (dict(max_rank=1), "max_rank=1 must be at least 2"),
])
def test_collective_calls_validate(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        collective_calls(Mesh((2,), ("x",)), **kwargs).example()


# -- reproducers --------------------------------------------------------------------------------------
def _run_script(tmp_path, source):
    path = tmp_path / "repro.py"
    path.write_text(source)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu", "PATH": ""}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=120)


def test_reproducer_checks_sums_against_the_embedded_bound(tmp_path):
    mesh = Mesh((2, 2), ("x", "y"), device_ids=np.array([[3, 1], [0, 2]]))
    c = find(collective_calls(mesh, collectives=("psum",), dtypes=("float32",), mode="random"),
             lambda c: c.params["axis_name"] == ("y", "x") and c.args[0].size >= 4, settings=FAST)
    source = c.repro(run_on_jax(c))
    assert "Reproducer for conformance case psum[axes=('y','x')" in source and "import refsim" not in source
    ok = _run_script(tmp_path, source)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK: every device matches refsim" in ok.stdout


def test_reproducer_fails_when_one_device_disagrees(tmp_path):
    """A platform whose device 2 differs from the embedded values: the script exits 1 naming it."""
    mesh = Mesh((4,), ("x",), device_ids=np.array([2, 0, 3, 1]))
    c = find(collective_calls(mesh, collectives=("ppermute",), dtypes=("int32",), entries=("shard_map",)),
             lambda c: dict(c.labels)["perm"] == "cycles", settings=FAST)
    out = run_on_jax(c)
    dev2 = next(s for s in out[0].shards if s.device_id == 2)
    jax_value = dev2.data
    dev2.data = dev2.data + 1
    bad = _run_script(tmp_path, c.repro(out))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    # every element of device 2 differs, so the first one named is the block's origin, whatever the rank
    first = (0,) * jax_value.ndim
    assert "MISMATCH on cpu" in bad.stdout
    assert (f"output 0 device 2 element {first}: got {jax_value[first]!r}, expected {jax_value[first] + 1!r}"
            in bad.stdout), bad.stdout
    assert all(f"device {d} " not in bad.stdout for d in (0, 1, 3))


def test_ppermute_axes_follow_mesh_order_where_jax_requires_it():
    from refsim import compat as _compat

    calls = collective_calls(Mesh((2, 2), ("x", "y")), collectives=("ppermute", "pshuffle", "pbroadcast"))
    out_of_order = lambda c: c.params["axis_name"] == ("y", "x")
    if _compat.ppermute_axes_must_follow_mesh_order():
        with pytest.raises(Exception, match="No examples found"):
            find(calls, out_of_order, settings=settings(max_examples=100, database=None, phases=(Phase.generate,)))
    else:
        assert out_of_order(find(calls, out_of_order, settings=settings(max_examples=2000, database=None, phases=(Phase.generate,))))


def test_a_complex_pmean_leaves_the_zero_signs_open_and_a_psum_does_not():
    """pmean of (-4-0j) and (-0-0j) over 'x': JAX divides the sum (-4-0j) by 2+0j as a complex
    number, whose cross term (-4)*0 = -0 turns the imaginary part -0 - -0 into +0: -2+0j on
    refsim and XLA, where the parts divided one by one give -2-0j. Either sign is right there;
    a psum's -0 (every term -0) is still checked."""
    from conformance.verdict.compare import compare
    from refsim.layouts.partition_spec import PartitionSpec as P

    m = Mesh((2,), ("x",))
    x = np.array([complex(-4, -0.0), complex(-0.0, -0.0)], np.complex64)
    kw = dict(source="def f(a):\n    return a\n", entry="shard_map", mesh=m, args=(x,), in_specs=(P("x"),),
              out_specs=P("x"))
    mean = CollectiveCall(family="pmean", outputs=("mean",), name="pmean", params={"axis_name": "x"}, **kw)
    total = CollectiveCall(family="psum", outputs=("sum",), name="psum", params={"axis_name": "x"}, **kw)
    (b,) = mean.tolerances()
    assert not b.signed_zero and np.signbit(b.exact[0].imag).all()   # the model's own value: -2-0j
    (s,) = total.tolerances()
    assert s.signed_zero

    def shards(values):
        import refsim

        return refsim.Array.from_stacked(np.array(values, np.complex64).reshape(2, 1), m, P("x"))

    assert compare(shards([complex(-2, 0.0)] * 2), shards([complex(-2, 0.0)] * 2), tolerances=[b]).ok
    assert compare(shards([complex(-2, -0.0)] * 2), shards([complex(-2, 0.0)] * 2), tolerances=[b]).ok
    assert not compare(shards([complex(-4, -0.0)] * 2), shards([complex(-4, 0.0)] * 2), tolerances=[s]).ok
