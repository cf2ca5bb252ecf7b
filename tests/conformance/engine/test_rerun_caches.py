"""The rerun caches: the drawn plan (`conformance.engine.plan.PlanCache`) and the executable store
keyed before tracing (`conformance.engine.compile_cache.ExecutableStore`). Each part of a key is
changed alone and must change the key; what is read back must be what was written."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import refsim
import xla_backend
from conformance import faults
from conformance.cases import program
from conformance.cases.program import Program
from conformance.engine import compile_cache, plan as plan_mod, runner
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import PartitionSpec as P
from xla_backend import cache

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

IDENTITY = dict(suite="collectives", seed=0, examples=2, devices=8, platform="cpu", jax="0.10.2", jaxlib="0.10.2",
                numpy="2.4.6", python="3.11.7", hypothesis="6.170.17")


# -- the plan cache ----------------------------------------------------------------------------------
@pytest.mark.parametrize("part,other", [("suite", "programs"), ("seed", 1), ("examples", 3), ("devices", 4),
                                        ("platform", "cuda"), ("jax", "0.12"), ("jaxlib", "0.12"),
                                        ("numpy", "2.0.0"), ("python", "3.12.0"), ("hypothesis", "6.0.0")])
def test_each_identity_entry_changes_the_plan_key(part, other):
    assert plan_mod.PlanCache.key(IDENTITY) == plan_mod.PlanCache.key(dict(IDENTITY))
    assert plan_mod.PlanCache.key(dict(IDENTITY, **{part: other})) != plan_mod.PlanCache.key(IDENTITY)


def test_data_per_program_changes_the_plan_key():
    assert plan_mod.PlanCache.key(IDENTITY, 5) != plan_mod.PlanCache.key(IDENTITY, None)
    assert plan_mod.PlanCache.key(IDENTITY, 5) != plan_mod.PlanCache.key(IDENTITY, 6)


def test_an_edit_to_the_strategies_sources_changes_the_plan_key(tmp_path, monkeypatch):
    src = tmp_path / "strategy.py"
    src.write_text("X = 1\n")
    monkeypatch.setattr(plan_mod, "PLAN_SOURCES", (str(src),))
    before = plan_mod.PlanCache.key(IDENTITY)
    src.write_text("X = 2\n")
    assert plan_mod.PlanCache.key(IDENTITY) != before


def test_the_real_sources_digest_covers_the_strategies():
    # every strategies module is one of the files hashed (an edit there draws afresh)
    root = os.path.join(ROOT, "conformance", "strategies")
    assert "conformance/strategies" in plan_mod.PLAN_SOURCES and os.listdir(root)


def test_plan_cache_reads_back_what_it_drew_without_drawing(tmp_path):
    pc = plan_mod.PlanCache(tmp_path)
    drawn = [["a", "b"], ["c"]]
    assert list(pc.chunks("k1", iter(drawn))) == drawn

    def never():
        raise AssertionError("drew although the plan is cached")
        yield

    assert list(pc.chunks("k1", never())) == drawn
    assert list(pc.chunks("k2", iter([["d"]]))) == [["d"]]   # another key draws


def test_a_half_drawn_plan_is_not_kept(tmp_path):
    pc = plan_mod.PlanCache(tmp_path)

    def broken():
        yield ["a"]
        raise RuntimeError("drawing failed")

    with pytest.raises(RuntimeError):
        list(pc.chunks("k", broken()))
    assert pc.load("k") is None


def test_a_rerun_on_the_plan_cache_runs_the_same_cases_without_drawing(tmp_path, monkeypatch):
    kw = dict(suite="collectives", examples=1, seed=2, devices=8, progress=False, shrink_seconds=0,
              plan_cache=str(tmp_path))
    first = runner.run(**kw)
    monkeypatch.setattr(runner, "plan_chunks", lambda *a, **k: iter(()))   # nothing to draw from
    again = runner.run(**kw)
    assert [(r.case_id, r.status, r.examples) for r in again.results] == \
        [(r.case_id, r.status, r.examples) for r in first.results]
    assert len(first.results) > 0


# -- more data per program --------------------------------------------------------------------------
def test_data_per_program_adds_refills_of_the_same_structure():
    tasks = runner.plan_tasks("collectives", examples=2, seed=0, devices=4)
    task = next(t for t in tasks if t.family == "psum")
    (more,) = plan_mod.with_data([task], 5, seed=0)
    groups = plan_mod.structures(more.variants)
    assert len(groups) == len(plan_mod.structures(task.variants))
    assert all(len(g) == 5 for g in groups)
    for g in groups:
        assert g[:3] == [v for v in task.variants if v.source is g[0].source and v.mesh is g[0].mesh][:3]
        for v in g[3:]:
            assert v.source is g[0].source and v.mesh is g[0].mesh
            assert [(np.shape(a), np.asarray(a).dtype) for a in v.args] == \
                [(np.shape(a), np.asarray(a).dtype) for a in g[0].args]
    # fewer than the suite draws: as drawn
    assert plan_mod.with_data([task], 2, seed=0)[0].variants == task.variants
    assert plan_mod.with_data([task], None, seed=0)[0] is task


# -- the executable store's key ----------------------------------------------------------------------
_SRC = "def f(a):\n    return jax.lax.psum(a, 'x')\n"


def _case(source=_SRC, ids=(0, 1, 2, 3), names=("x",), spec=P("x"), arg=np.arange(4, dtype=np.float32),
          shape=None, out_spec=P()):
    shape = shape or (len(ids),) + (1,) * (len(names) - 1)
    mesh = Mesh(shape, names, device_ids=np.asarray(ids).reshape(shape))
    return Program("t", source, "shard_map", mesh, (arg,), in_specs=(spec,), out_specs=out_spec)


class _Recording:
    """A store that keeps nothing and records the keys it is asked for."""

    def __init__(self):
        self.keys = []

    def load(self, key):
        self.keys.append(key)
        return None

    def compile(self, key, compile_fn):
        return compile_fn()


def _key_of(case):
    rec = _Recording()
    cache.clear_cache()
    cache.set_store(rec)
    try:
        case.run(xla_backend)
    finally:
        cache.set_store(None)
        cache.clear_cache()
    (key,) = rec.keys
    return compile_cache.stable_key(key)


def test_the_same_case_gives_the_same_key():
    assert _key_of(_case()) is not None
    assert _key_of(_case()) == _key_of(_case())


@pytest.mark.parametrize("change", [
    dict(source="def f(a):\n    return jax.lax.psum(a, 'x') * 1\n"),    # the case's source
    dict(ids=(3, 2, 1, 0)),                                                # device order
    dict(names=("x", "y")),                                                # axis names
    dict(spec=P()),                                                        # in specs
    dict(arg=np.arange(8, dtype=np.float32)),                              # input shape
    dict(arg=np.arange(4, dtype=np.int32)),                                # input dtype
])
def test_each_case_part_changes_the_executable_key(change):
    assert _key_of(_case(**change)) != _key_of(_case())


def test_the_mesh_shape_changes_the_executable_key():
    # the same devices, in the same order, under the same names: a 1x2 and a 2x1 mesh (format 1 of the
    # key wrote the ids flat, and a 3x1 mesh loaded a 1x3 mesh's executable: seed 10 of the default run)
    src = "def f(a):\n    return jax.lax.pmin(a, ('x', 'y'))\n"
    one = dict(source=src, ids=(0, 1), names=("x", "y"), spec=P(), arg=np.arange(1, dtype=np.int8), out_spec=P("y"))
    assert _key_of(_case(shape=(1, 2), **one)) != _key_of(_case(shape=(2, 1), **one))


def test_a_specs_unreduced_and_reduced_axes_change_the_key_text():
    import jax

    for spec in (P, jax.sharding.PartitionSpec):
        plain = compile_cache.encode(spec("x"))
        assert compile_cache.encode(spec("x", unreduced={"y"})) not in (plain, compile_cache.encode(spec("x", reduced={"y"})))
        assert compile_cache.encode(spec("x", reduced={"y"})) != plain
        assert compile_cache.encode(spec("x", unreduced={"y", "z"})) == compile_cache.encode(spec("x", unreduced={"z", "y"}))


def test_a_mesh_of_another_shape_never_loads_an_executable_from_the_store(tmp_path):
    # end to end through the store, each case in a fresh executable cache (as a fresh worker reads it):
    # the 2x1 mesh computes its own global shape (1,), not the 1x2 mesh's (2,)
    src = "def f(a):\n    return jax.lax.pmin(a, ('x', 'y'))\n"
    one = dict(source=src, ids=(0, 1), names=("x", "y"), spec=P(), arg=np.arange(1, dtype=np.int8), out_spec=P("y"))
    cache.set_store(compile_cache.ExecutableStore(str(tmp_path)))
    hits = cache.stats()["store_hits"]
    try:
        shapes = []
        for shape in ((1, 2), (2, 1), (1, 2)):
            cache.clear_cache()
            program._ENTRY_CALLABLES.clear()
            shapes.append(np.asarray(_case(shape=shape, **one).run(xla_backend)).shape)
    finally:
        cache.set_store(None)
        cache.clear_cache()
    assert shapes == [(2,), (1,), (2,)]
    assert cache.stats()["store_hits"] == hits + 1   # the third run loaded the first one's executable


def test_other_devices_change_the_executable_key():
    two = np.arange(2, dtype=np.float32)
    assert _key_of(_case(ids=(0, 1), arg=two)) != _key_of(_case(ids=(2, 3), arg=two))


def test_versions_flags_and_config_change_the_executable_key(monkeypatch):
    import jax

    base = _key_of(_case())
    with monkeypatch.context() as m:
        m.setattr(jax, "__version__", "0.0.1")
        assert _key_of(_case()) != base
    with monkeypatch.context() as m:
        import jaxlib

        m.setattr(jaxlib, "__version__", "0.0.1", raising=False)
        assert _key_of(_case()) != base
    with monkeypatch.context() as m:
        m.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=false")
        assert _key_of(_case()) != base
    was = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", not was)
    try:
        assert _key_of(_case()) != base
    finally:
        jax.config.update("jax_use_shardy_partitioner", was)
    assert _key_of(_case()) == base


def test_a_function_that_is_not_a_case_source_is_not_stored():
    with pytest.raises(compile_cache.Unstable):
        compile_cache.encode(("shard_map", lambda a: a))
    with pytest.raises(compile_cache.Unstable):
        compile_cache.encode(object())
    assert compile_cache.stable_key(("shard_map", lambda a: a)) is None


def test_the_key_is_the_same_in_another_process():
    import jax

    code = ("import sys; sys.path.insert(0, {root!r})\n"
            "from xla_backend import platform; platform.configure('cpu', {n})\n"
            "import test_rerun_caches as t; print(t._key_of(t._case()))\n").format(root=ROOT, n=len(jax.devices()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(__file__)]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == _key_of(_case())


# -- the executable store ----------------------------------------------------------------------------
def test_the_store_gives_back_an_executable_that_computes_the_same(tmp_path):
    case = _case(ids=(2, 0, 3, 1))
    other = dataclasses.replace(case, args=(np.arange(4, dtype=np.float32) * 3,))
    store = compile_cache.ExecutableStore(str(tmp_path))
    cache.clear_cache()
    cache.set_store(store)
    try:
        first = case.run(xla_backend)
        hits = cache.stats()["store_hits"]
        cache.clear_cache()                     # as a fresh process: only the store has it
        again = other.run(xla_backend)
        assert cache.stats()["store_hits"] == hits + 1
    finally:
        cache.set_store(None)
        cache.clear_cache()
    want = other.run(refsim)
    for got, exp in ((again, want), (first, case.run(refsim))):
        assert sorted((s.device_id, np.asarray(s.data).tolist()) for s in got.shards) == \
            sorted((s.device_id, np.asarray(s.data).tolist()) for s in exp.shards)


def test_nothing_is_read_from_the_store_under_an_injected_fault(tmp_path):
    case = _case()
    store = compile_cache.ExecutableStore(str(tmp_path))
    cache.clear_cache()
    cache.set_store(store)
    try:
        case.run(xla_backend)
        hits = cache.stats()["store_hits"]
        with faults.inject(faults.names()[0]):
            case.run(xla_backend)
        assert cache.stats()["store_hits"] == hits
    finally:
        cache.set_store(None)
        cache.clear_cache()


def test_a_corpus_function_is_keyed_by_its_module_file():
    from conformance.cases import corpus

    fn = corpus.PROGRAMS[0].fn
    key = compile_cache.encode(("shard_map", fn))
    assert corpus.__name__ in key and fn.__name__ in key
    path = corpus.__file__
    was = compile_cache._FILE_DIGESTS.get(path)
    compile_cache._FILE_DIGESTS[path] = "0" * 64   # as if the file had other contents
    try:
        assert compile_cache.encode(("shard_map", fn)) != key
    finally:
        if was is None:
            compile_cache._FILE_DIGESTS.pop(path, None)
        else:
            compile_cache._FILE_DIGESTS[path] = was
    assert compile_cache.encode(("shard_map", fn)) == key


def _not_a_case(a):
    return a


def test_a_function_outside_the_case_modules_is_not_stored():
    with pytest.raises(compile_cache.Unstable):
        compile_cache.encode(("jit", _not_a_case))


def test_worker_environment_names_the_cache_for_workers_without_changing_this_process(tmp_path):
    import os

    from conformance.engine import compile_cache

    before = dict(os.environ)
    env = compile_cache.worker_environment(str(tmp_path / "cc"))
    assert dict(os.environ) == before and (tmp_path / "cc").is_dir()
    assert env == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cc"),
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.0",
                   "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
                   compile_cache.STORE_ENV: str(tmp_path / "cc" / "executables")}
