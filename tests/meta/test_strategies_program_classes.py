"""Meta-tests of sharded_programs(classes=...): every program class is drawn, traces with the shapes
its wrapper states, runs on refsim and on XLA (8 CPU devices) with the same values, keeps the
semantics stated for it (remat, custom rules and host round trips never change values), survives
the hunt's case files, and bad arguments raise InvalidArgument naming the fix."""
import dataclasses
import re

import numpy as np
import pytest
from hypothesis import find
from hypothesis.errors import InvalidArgument

import refsim
from conformance.hunt import case_from_data, case_to_data, hunt
from conformance.strategies import CLASSES, ShardedProgram, sharded_programs
from conformance.strategies.sharded import make_case
from conformance.suites.sharded import strategy as suite_strategy
from refsim import compat
from refsim.layouts.mesh import Mesh
from test_strategies_sharded import FIND, SAFE_MESHES, assert_traces_as_modelled, run_judged

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

# what each class's source must show (the wrapper around g)
SHOWS = {
    "plain": lambda c: "model" not in c.source,
    "scan_layers": lambda c: "jax.lax.scan(" in c.source and "def layer(c, xs)" in c.source,
    "remat": lambda c: "jax.checkpoint(g, policy=" in c.source,
    "custom_vjp": lambda c: "model = jax.custom_vjp(g)" in c.source
    and "model.defvjp(model_fwd, model_bwd)" in c.source,
    "custom_jvp": lambda c: "model = jax.custom_jvp(g)" in c.source and "jax.jvp(g, primals, tangents)" in c.source,
    "host_offload": lambda c: "jax.memory.Space.Host" in c.source or "compute_on" in c.source,
    "shard_map_nested": lambda c: "jax.shard_map(body" in c.source,
    "jit_chain": lambda c: c.source.count("jax.jit(step, out_shardings=") >= 2,
    "donation": lambda c: bool(c.donate_argnums) and "def model(" in c.source,
    "jit_chain_orders": lambda c: "def model(" in c.source and len({s.mesh for s in c.out_shardings}) >= 1,
}


def _find(klass, pred=lambda c: True, **kw):
    kw.setdefault("partitioners", ("shardy",))
    mesh = kw.pop("mesh", SAFE_MESHES)
    return find(sharded_programs(mesh, classes=(klass,), max_ops=3, **kw),
                lambda c: c.program_class == klass and pred(c), settings=FIND)


@pytest.mark.parametrize("klass", CLASSES)
def test_every_class_is_drawn_traces_as_modelled_and_agrees(klass):
    mesh = Mesh((2, 2), ("x", "y")) if klass == "shard_map_nested" else SAFE_MESHES
    # a host round trip is drawn forward here: JAX cannot differentiate one (found-bugs 28, the test below)
    kw = {"transforms": ("none", "vmap")} if klass == "host_offload" else {}
    case = _find(klass, lambda c: c.mesh.size > 1 and any(s.spec != refsim.PartitionSpec() for s in c.in_shardings),
                 mesh=mesh, **kw)
    assert isinstance(case, ShardedProgram) and SHOWS[klass](case), case.source
    assert (f"class={klass}," in case.case_id) == (klass != "plain")
    assert case.program_class in case.describe()
    if klass != "jit_chain_orders":   # its fn is one call of the chain (test_strategies_class_placement)
        assert_traces_as_modelled(case)
    run_judged(case)


@pytest.mark.parametrize("klass, kw, pred", [
    ("scan_layers", {"transforms": ("grad",)}, lambda c: c.transform == "grad"),
    ("scan_layers", {"axis_types": ("explicit",)}, lambda c: "jax.sharding.reshard(jnp.clip" in c.source
     or "jax.sharding.reshard(-c" in c.source),
    ("remat", {}, lambda c: "'pinned_host'" in c.source),            # an offloading policy
    ("remat", {}, lambda c: "checkpoint_name(" in c.source),         # named values
    ("custom_vjp", {}, lambda c: "t * 2" in c.source and c.transform in ("grad", "vjp")),
    ("custom_vjp", {}, lambda c: "jax.vjp(g, *res)" in c.source),   # recomputed in the backward pass
    ("custom_jvp", {"transforms": ("vjp",)}, lambda c: c.transform == "vjp"),
    ("host_offload", {"transforms": ("vmap",)}, lambda c: "jax.memory.Space.Host" in c.source),
    ("shard_map_nested", {"mesh": Mesh((2, 2, 2), ("x", "y", "z")), "ops": ("shard_map_psum", "sin")},
     lambda c: c.source.count("jax.shard_map(") >= 2),              # a manual region inside the manual region
    ("shard_map_nested", {"mesh": Mesh((2, 2), ("x", "y")), "axis_types": ("explicit",)}, lambda c: True),
    ("jit_chain", {"transforms": ("vmap",)}, lambda c: c.transform == "vmap"),
])
def test_class_options_are_reached_and_agree(klass, kw, pred):
    case = _find(klass, pred, **kw)
    assert_traces_as_modelled(case)
    run_judged(case)


def test_scan_layers_stacks_every_argument_but_the_carry():
    case = _find("scan_layers", lambda c: len(c.args) == 2 and c.transform == "none")
    length = dict(case.graph.program_class[1:])["length"]
    assert np.shape(case.args[1]) == (length,) + tuple(case.graph.args[1][1])
    assert np.shape(case.args[0]) == tuple(case.graph.args[0][1])
    assert case.in_shardings[1].spec[:1] in ((None,), ())   # the layer dimension is not split


def test_shard_map_nested_splits_dimension_zero_over_the_manual_axes():
    case = _find("shard_map_nested", lambda c: c.transform == "none" and len(np.shape(c.args[0])) >= 1,
                 mesh=Mesh((2, 2), ("x", "y")))
    manual = dict(case.graph.program_class[1:])["manual"]
    assert np.shape(case.args[0])[0] == 2 * case.graph.args[0][1][0]
    first = case.in_shardings[0].spec[0]
    assert tuple(first if isinstance(first, tuple) else (first,))[:len(manual)] == tuple(manual)


@pytest.mark.parametrize("klass, transforms", [("remat", ("grad", "vjp")), ("custom_jvp", ("grad", "vjp")),
                                               ("custom_vjp", ("grad", "vjp")), ("host_offload", ("none", "vmap"))])
def test_the_wrapper_never_changes_values(klass, transforms):
    # refsim's semantics: remat, a custom rule equal to the derivative, a host round trip: the plain program's bits
    # (a host round trip is not differentiated here: JAX cannot, docs/found-bugs.md 28)
    pred = (lambda c: "t * 2" not in c.source) if klass == "custom_vjp" else (lambda c: True)
    case = _find(klass, lambda c: c.transform in transforms and pred(c), transforms=transforms)
    plain = make_case(dataclasses.replace(case.graph, program_class=("plain",)), mesh=case.mesh, args=case.args,
                      in_shardings=case.in_shardings, out_shardings=case.out_shardings,
                      partitioner=case.partitioner, axis_types=case.axis_types)
    got, want = case.run(refsim), plain.run(refsim)
    listed = lambda x: list(x) if isinstance(x, (list, tuple)) else [x]  # noqa: E731
    assert len(listed(got)) == len(listed(want))
    for a, b in zip(listed(got), listed(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_suite_draws_every_class():
    from conformance.suites.base import draw

    seen = set()
    for k in range(20):   # as the suite and the hunt draw: a seed per batch of 8
        seen |= {c.program_class for c in draw(suite_strategy("sharded", None, 8), 8, 2000 + k)}
    assert seen == set(CLASSES), set(CLASSES) - seen


@pytest.mark.parametrize("klass", CLASSES)
def test_hunt_case_files_keep_the_class(klass):
    mesh = Mesh((2, 2), ("x", "y")) if klass == "shard_map_nested" else SAFE_MESHES
    case = _find(klass, mesh=mesh)
    again = case_from_data(case_to_data(case))
    assert again.graph.program_class == case.graph.program_class
    assert again.source == case.source and again.case_id == case.case_id


def test_compute_on_is_drawn_only_where_this_jax_has_it():
    text, why = compat.compute_on_host()
    if text is None:
        assert "out_memory_spaces" in why
        return
    case = _find("host_offload", lambda c: "compute_on" in c.source, transforms=("none",))
    run_judged(case)


@pytest.mark.parametrize("kwargs, match", [
    ({"classes": ("nope",)}, r"classes contains 'nope', which is not one of \('plain', 'scan_layers'"),
    ({"classes": ()}, r"classes=\(\) is empty"),
    ({"classes": ("remat", "remat")}, r"repeats an option"),
    ({"classes": ("shard_map_nested",), "mesh": Mesh((4,), ("x",))}, r"needs a mesh of at least 2 axes"),
])
def test_bad_classes_raise_invalid_argument(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        sharded_programs(**kwargs)


def test_hunt_rejects_an_unknown_class(tmp_path):
    with pytest.raises(ValueError, match=re.escape("classes=['nope'] are not program classes")):
        hunt(programs=1, classes=["nope"], report_dir=str(tmp_path))


def test_a_differentiated_host_round_trip_is_the_known_jax_bug():
    # found-bugs 28: JAX's pullback of a move to host memory leaves the cotangent there; the xfails entry
    # expects exactly that error for class=host_offload under grad / vjp, and nothing else
    case = _find("host_offload", lambda c: c.transform == "grad" and "a0 = jax.device_put" in c.source,
                 transforms=("grad",), dtypes=("float32",), axis_types=("auto",))
    with pytest.raises(ValueError, match=r"xpected cotangent type (is )?\S+ but got \S+<host>"):
        case.run(refsim)
    assert run_judged(case) == "xfail"


def test_a_database_entry_of_a_classes_hunt_replays_with_those_classes_only():
    import json

    from conformance import hunt as hunt_mod
    from conformance.suites import base

    cases = base.draw(sharded_programs(ops=tuple(hunt_mod.OPS), classes=("scan_layers", "remat"), max_devices=8), 8, 5)
    entry = hunt_mod._entry({"seed": 5, "count": 8, "index": 2, "devices": 8, "shrink": [],
                             "classes": ["scan_layers", "remat"]}, cases[2])
    got, origins, skipped = hunt_mod.replay([entry], 8)
    assert not skipped and hunt_mod.program_digest(got[0]) == hunt_mod.program_digest(cases[2])
    assert origins[got[0].case_id]["classes"] == ["scan_layers", "remat"]
    doc = json.loads(entry)
    for bad, reason in ((dict(doc, classes=["nope"]), "stale"), (dict(doc, classes="remat"), "unreadable")):
        assert hunt_mod.replay([json.dumps(bad).encode()], 8)[2] == {reason: 1}


def test_donation_donates_on_both_engines_and_the_reproducers_say_so():
    # an output with a donated argument's shape, dtype and sharding: XLA may write it into the donated buffer
    case = _find("donation", lambda c: c.transform == "none" and c.mesh.size > 1
                 and any(c.out_shardings[k] == c.in_shardings[i] for k in range(len(c.out_shardings))
                         for i in c.donate_argnums))
    assert case.donate_argnums == dict(case.graph.program_class[1:])["donated"]
    run_judged(case)
    assert f"donate_argnums={case.donate_argnums!r}" in case.repro(case.run(refsim))
    from conformance.upstream.script import script_text
    assert f"jax.jit(f, donate_argnums={case.donate_argnums!r}, " in script_text(case, title="t", about="a")
    plain = make_case(dataclasses.replace(case.graph, program_class=("plain",)), mesh=case.mesh, args=case.args,
                      in_shardings=case.in_shardings, out_shardings=case.out_shardings[:len(case.graph.outs)],
                      partitioner=case.partitioner, axis_types=case.axis_types)
    assert plain.donate_argnums == () and "donate_argnums" not in plain.repro(plain.run(refsim))


def test_refsim_jit_consumes_donated_arrays():
    import jax.numpy as jnp

    mesh = Mesh((2, 2), ("x", "y"))
    s = refsim.NamedSharding(mesh, refsim.PartitionSpec("x"))
    a, b = refsim.device_put(np.arange(8.0, dtype=np.float32), s), refsim.device_put(np.ones(8, np.float32), s)
    out = refsim.jit(lambda u, v: (jnp.flip(u) + v, v * 2), in_shardings=(s, s), out_shardings=(s, s),
                     donate_argnums=0)(a, b)
    assert a.is_deleted() and not b.is_deleted()
    with pytest.raises(RuntimeError, match=r"Array has been deleted with shape=float32\[8\]"):
        np.asarray(a)
    with pytest.raises(RuntimeError, match="donated"):
        a.shards
    np.testing.assert_array_equal(np.asarray(out[0]), np.arange(8.0)[::-1] + 1)
    with pytest.raises(TypeError, match="donate_argnums contains 'a'"):
        refsim.jit(lambda u: u, donate_argnums=("a",))
    with pytest.raises(ValueError, match="donate_argnums contains -1"):
        refsim.jit(lambda u: u, donate_argnums=(-1,))


@pytest.mark.parametrize("klass", ["scan_layers", "jit_chain", "donation"])
def test_a_class_program_shrinks_to_one_output_of_g(klass):
    from conformance.suites.sharded import candidates
    from conformance.upstream.shrink import earlier_values

    case = _find(klass, lambda c: len(c.graph.outs) >= 2 and c.transform == "none")
    smaller = [c for c in candidates(case) if len(c.graph.outs) == 1]
    assert smaller and all(c.program_class == klass for c in smaller)
    for c in smaller[:2] + list(earlier_values(case))[:2]:
        assert_traces_as_modelled(c)
