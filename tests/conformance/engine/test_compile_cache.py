"""The compile cache answers only for the code that runs (`conformance.engine.compile_cache`,
`conformance.engine.code_identity`): its folder is keyed on the content of the compiler's files,
its entries carry a digest of the identity, key and bytes, nothing read back is unpickled, and the
first hit of each family is compiled again and compared."""
import os
import pickle

import numpy as np
import pytest

import refsim
import xla_backend
from conformance.cases.program import Program
from conformance.engine import code_identity, compile_cache, plan as plan_mod, runner
from refsim.layouts.mesh import Mesh
from refsim.layouts.partition_spec import PartitionSpec as P
from xla_backend import cache

ID = "a" * 64


# -- code identity ---------------------------------------------------------------------------------
def _fake_install(root, text="X = 1\n"):
    pkg = root / "jax"
    (pkg / "_src").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_src" / "lowering.py").write_text(text)
    return pkg


def test_an_edit_to_an_installed_file_changes_the_identity_under_the_same_version(tmp_path, monkeypatch):
    pkg = _fake_install(tmp_path)
    monkeypatch.setattr(code_identity, "_package_dirs", lambda name: [str(pkg)] if name == "jax" else [])
    memo = str(tmp_path / "memo.json")
    code_identity.reset()
    try:
        before = code_identity.identity_digest(memo)
        code_identity.reset()
        assert code_identity.identity_digest(memo) == before           # read back through the memo
        (pkg / "_src" / "lowering.py").write_text("X = 2\n")           # same size, same version string
        code_identity.reset()
        after = code_identity.identity_digest(memo)
    finally:
        code_identity.reset()
    assert after != before


def test_file_digests_rehash_a_file_whose_stat_changed_and_survive_a_bad_memo(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("one")
    memo = tmp_path / "memo.json"
    d = code_identity.FileDigests(str(memo))
    first = d.digest(str(f))
    d.save()
    f.write_text("two")
    assert code_identity.FileDigests(str(memo)).digest(str(f)) != first
    memo.write_bytes(pickle.dumps({"format": 1}))                      # not JSON: ignored, hashed afresh
    assert code_identity.FileDigests(str(memo)).digest(str(f)) == code_identity.FileDigests(None).digest(str(f))


def test_the_identity_names_jax_jaxlib_and_the_project():
    ident = code_identity.identity()
    assert set(ident) >= {"jax", "jaxlib", "plugins", "project", "project_version", "python"}
    files = code_identity.code_files()
    assert any(name.endswith(os.path.join("jax", "_src", "lax", "parallel.py")) for name, _ in files["jax"])
    assert any(name.endswith(os.path.join("xla_backend", "run.py")) for name, _ in files["project"])


def test_the_cache_folder_is_named_by_the_identity(tmp_path):
    folder, _, env = compile_cache._settings(str(tmp_path))
    assert os.path.basename(folder) == "xla-" + code_identity.identity_digest()[:32]
    assert env["JAX_COMPILATION_CACHE_DIR"] == folder and env[compile_cache.IDENTITY_ENV] == code_identity.identity_digest()


def test_worker_environment_names_the_cache_without_changing_this_process(tmp_path):
    before = dict(os.environ)
    env = compile_cache.worker_environment(str(tmp_path / "cc"))
    assert dict(os.environ) == before and (tmp_path / "cc").is_dir()
    assert set(env) == {"JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", compile_cache.IDENTITY_ENV, compile_cache.EVENTS_ENV}
    assert env["JAX_COMPILATION_CACHE_DIR"].startswith(str(tmp_path / "cc" / "xla-"))


# -- entries: sealed data ----------------------------------------------------------------------------
class _Dict:
    """A stand-in for JAX's file cache."""

    def __init__(self):
        self.d = {}
        self._path = "memory"

    def get(self, key):
        return self.d.get(key)

    def put(self, key, value):
        self.d[key] = value


def test_a_sealed_entry_reads_back_and_any_other_is_a_counted_miss(tmp_path, monkeypatch):
    events = tmp_path / "events.jsonl"
    events.write_text("")
    monkeypatch.setenv(compile_cache.EVENTS_ENV, str(events))
    base = _Dict()
    c = compile_cache.DigestCache(base, ID)
    c.put("k1", b"executable bytes")
    assert c.get("k1") == b"executable bytes" and c.get("absent") is None
    stored = base.d["k1"]
    base.d["k2"] = stored                                               # copied under another key
    flipped = bytearray(stored)
    flipped[-3] ^= 1
    base.d["k3"] = bytes(flipped)                                       # one byte flipped
    base.d["k4"] = stored[:len(stored) // 2]                            # torn
    base.d["k5"] = b"plain bytes without a header"                      # not ours
    assert [c.get(k) for k in ("k2", "k3", "k4", "k5")] == [None] * 4
    assert compile_cache.DigestCache(base, "b" * 64).get("k1") is None  # another code identity
    got = compile_cache.run_events(str(events))
    assert got["bad_entries"] == 5 and "digest mismatch" in got["bad"][0]
    assert "5 compile-cache entries failed their digest" in compile_cache.summary_line(got)


class _Payload:
    def __reduce__(self):
        return (open, (os.environ["PAYLOAD_MARK"], "w"))


def test_a_planted_pickle_is_never_loaded(tmp_path, monkeypatch):
    mark = tmp_path / "ran"
    monkeypatch.setenv("PAYLOAD_MARK", str(mark))
    blob = pickle.dumps(_Payload())
    base = _Dict()
    base.d["k"] = blob
    assert compile_cache.DigestCache(base, ID).get("k") is None
    base.d["k"] = compile_cache.ENTRY_MAGIC + b"0" * 64 + blob          # a header with a forged digest
    assert compile_cache.DigestCache(base, ID).get("k") is None
    assert not mark.exists()


def test_no_module_of_the_project_unpickles_what_it_reads_back():
    # pickle may cross a pipe to a child process it started (workers, the isolated runner); nothing
    # read from a file may go through pickle, marshal or eval
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    offenders = []
    for pkg in ("conformance", "refsim", "xla_backend"):
        for d, _, files in os.walk(os.path.join(root, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                text = open(os.path.join(d, f), encoding="utf-8").read()
                rel = os.path.relpath(os.path.join(d, f), root)
                for bad in ("pickle.load(", "pickle.loads(", "marshal.load", "allow_pickle=True", "shelve."):
                    if bad in text and (rel, bad) not in _IPC:
                        offenders.append(f"{rel}: {bad}")
    assert offenders == []


# pickle between live processes of one run, never through a file: the isolated runner's pipe from the child
# it started, and a distributed job's key-value store between its own processes
_IPC = {(os.path.join("xla_backend", "isolated.py"), "pickle.loads("),
        (os.path.join("conformance", "engine", "distributed.py"), "pickle.loads(")}


# -- through JAX: a warm cache, a verified hit -------------------------------------------------------
_SRC = "def f(a):\n    return jax.lax.psum(a, 'x')\n"


def _case():
    mesh = Mesh((4,), ("x",), device_ids=np.array([2, 0, 3, 1]))
    return Program("t", _SRC, "shard_map", mesh, (np.arange(4, dtype=np.float32) + 1,), in_specs=(P("x"),),
                   out_specs=P())


def _values(arr):
    return sorted((s.device_id, np.asarray(s.data).tolist()) for s in arr.shards)


@pytest.fixture
def enabled(tmp_path, monkeypatch):
    """The cache enabled in this process on a fresh folder, and everything put back after."""
    import jax
    from jax._src import compilation_cache as jcc

    saved = {k: os.environ.get(k) for k in ("JAX_COMPILATION_CACHE_DIR", compile_cache.IDENTITY_ENV,
                                            compile_cache.EVENTS_ENV, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                                            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")}
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes", "jax_enable_compilation_cache")
    config = {n: getattr(jax.config, n) for n in names}
    plain = getattr(jcc.get_file_cache, "_conformance_plain", jcc.get_file_cache)
    compile_cache._EVENTS.clear()
    folder = compile_cache.enable(str(tmp_path / "cc"))
    cache.clear_cache()
    jax.clear_caches()
    try:
        yield folder
    finally:
        compile_cache._OFF[0] = False
        cache.set_hit_check(None)
        cache.clear_cache()
        jax.clear_caches()
        for n, v in config.items():
            jax.config.update(n, v)
        jcc.get_file_cache = plain
        jcc.reset_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _next_run(tmp_path):
    """End this run (its events and markers go) and start the next on the same cache folder, as a
    second `python -m conformance run` would."""
    compile_cache.end_run()
    compile_cache.enable(str(tmp_path / "cc"))


def test_a_warm_cache_gives_back_the_same_values_with_every_entry_sealed(enabled, tmp_path):
    import jax

    case = _case()
    first = case.run(xla_backend)
    hits = cache.stats()["persistent_hits"]
    _next_run(tmp_path)                                              # the next run reads what this one kept
    cache.clear_cache()
    jax.clear_caches()
    again = case.run(xla_backend)
    assert cache.stats()["persistent_hits"] == hits + 1             # read back, not compiled
    assert _values(again) == _values(first) == _values(case.run(refsim))
    entries = [os.path.join(d, f) for d, _, fs in os.walk(enabled) for f in fs if f.endswith("-cache")]
    assert entries and all(open(p, "rb").read().startswith(compile_cache.ENTRY_MAGIC) for p in entries)
    assert compile_cache.run_events()["verified"] == 1                # the first hit of its family was checked


def _max_instead_of_add(plain):
    """XLA's compile step patched, as a site hook could, so psum's region adds with max: the module
    JAX keys its cache on is unchanged."""
    def patched(backend, module, *args, **kw):
        from jax._src.interpreters import mlir

        text = str(module).replace("stablehlo.add", "stablehlo.maximum")
        with module.context:
            module = mlir.ir.Module.parse(text)
        return plain(backend, module, *args, **kw)

    return patched


def test_a_compile_step_patched_without_a_file_change_is_caught_by_the_hit_check(enabled, monkeypatch, tmp_path):
    import jax
    from jax._src import compiler

    case = _case()
    want = _values(case.run(refsim))
    assert _values(case.run(xla_backend)) == want                    # clean: compiled and kept
    _next_run(tmp_path)                                              # a later run, with the compile step patched
    cache.clear_cache()
    jax.clear_caches()
    monkeypatch.setattr(compiler, "backend_compile_and_load", _max_instead_of_add(compiler.backend_compile_and_load))
    got = _values(case.run(xla_backend))                             # the key is the clean one: a cache hit
    assert got != want                                               # but the fresh compile was used
    events = compile_cache.run_events()
    assert events["invalidated"] and "compile cache NOT used" in compile_cache.summary_line(events)
    assert compile_cache._passed_by()                                 # for the rest of this process


def test_an_entry_this_run_wrote_is_read_back_unverified_and_counted_apart(enabled, tmp_path):
    # a sibling worker (here: this process) compiled it moments ago with the same code: a fresh
    # compile could only repeat it, so it costs no second compile and leaves the family unchecked
    import jax

    case = _case()
    first = case.run(xla_backend)
    cache.clear_cache()
    jax.clear_caches()
    again = case.run(xla_backend)
    events = compile_cache.run_events()
    assert _values(again) == _values(first)
    assert (events["hits_from_run"], events["hits"], events["verified"]) == (1, 0, 0)
    assert "(and 1 that this run had compiled itself)" in compile_cache.use_line(events)
    _next_run(tmp_path)                                              # the next run: a stored entry, verified
    cache.clear_cache()
    jax.clear_caches()
    case.run(xla_backend)
    events = compile_cache.run_events()
    assert (events["hits_from_run"], events["hits"], events["verified"]) == (0, 1, 1)


def test_without_the_hit_check_that_patch_would_have_agreed(enabled, monkeypatch):
    # the check above is what catches it: the cached executable alone computes the clean answer
    import jax
    from jax._src import compiler

    case = _case()
    want = _values(case.run(refsim))
    case.run(xla_backend)
    cache.clear_cache()
    jax.clear_caches()
    cache.set_hit_check(None)
    monkeypatch.setattr(compiler, "backend_compile_and_load", _max_instead_of_add(compiler.backend_compile_and_load))
    assert _values(case.run(xla_backend)) == want


# -- the plan is not cached ----------------------------------------------------------------------------
def test_there_is_no_plan_cache_and_run_takes_no_plan_cache_option():
    assert not hasattr(plan_mod, "PlanCache")
    with pytest.raises(TypeError):
        runner.run(suite="collectives", examples=1, plan_cache="/tmp/x")


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
    assert plan_mod.with_data([task], 2, seed=0)[0].variants == task.variants
    assert plan_mod.with_data([task], None, seed=0)[0] is task


def test_a_family_is_checked_once_per_run_and_an_invalidation_reaches_every_process(enabled):
    import jax

    v = compile_cache.HitVerifier()
    calls = []

    def recompile():
        calls.append(1)
        return "fresh"

    assert compile_cache._first_in_run("fam") and not compile_cache._first_in_run("fam")  # another process took it
    assert v("fam", "cached", recompile) == "cached" and calls == []                       # so this one does not
    compile_cache._mark_invalidated()                                                      # as another process would
    assert v("other", "cached", recompile) == "fresh" and calls == [1]
    assert compile_cache._passed_by()
    assert v("third", "cached", recompile) == "cached"   # the cache is off here: no further hit can come


def test_off_enables_nothing_and_creates_no_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert compile_cache.worker_environment("off") == {} and compile_cache.enable("OFF") is None
    assert os.listdir(tmp_path) == []


def test_a_run_verifies_at_most_its_budget_of_families(enabled, monkeypatch):
    monkeypatch.setenv(compile_cache.VERIFY_ENV, "2")
    assert [compile_cache._first_in_run(f"family{i}") for i in range(4)] == [True, True, False, False]
    monkeypatch.setenv(compile_cache.VERIFY_ENV, "all")
    assert compile_cache._first_in_run("family9")
    monkeypatch.delenv(compile_cache.VERIFY_ENV)
    assert compile_cache.verify_per_run() == compile_cache.VERIFY_PER_RUN


def test_a_bad_entry_on_disk_is_replaced_by_the_fresh_compile(enabled):
    import jax

    case = _case()
    case.run(xla_backend)
    (entry,) = [os.path.join(d, f) for d, _, fs in os.walk(enabled) for f in fs if f.endswith("-cache")]
    with open(entry, "wb") as fh:
        fh.write(b"not an entry")
    cache.clear_cache()
    jax.clear_caches()
    assert _values(case.run(xla_backend)) == _values(case.run(refsim))
    assert open(entry, "rb").read().startswith(compile_cache.ENTRY_MAGIC)   # written over, not kept bad
    assert compile_cache.run_events()["bad_entries"] == 1


def test_the_verified_text_ignores_names_and_sees_the_computation():
    # two programs that lower to one module up to names share one cache key: the hit check must not call
    # their executables different, and must tell a psum from a pmax
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as JP

    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, JP("x")))

    def compiled(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=JP("x"), out_specs=JP())).lower(x).compile()

    def f(a):
        return jax.lax.psum(a * 2, "x")

    def g(b):
        return jax.lax.psum(b * 2, "x")

    def h(b):
        return jax.lax.pmax(b * 2, "x")

    tf, tg, th = (compile_cache._module_text(compiled(fn)) for fn in (f, g, h))
    assert tf == tg and tf != th
    assert "metadata" not in tf and "%n0" in tf


def test_a_hit_is_judged_from_its_own_read_only(enabled):
    # a key left by an earlier read must not make a later hit look like one this run wrote
    class Exe:
        def as_text(self):
            return "HloModule m\nENTRY e { ROOT c = f32[] constant(1) }"

    cached = Exe()
    compile_cache._mark_written("written-this-run")
    compile_cache._LAST_GET[0] = "written-this-run"
    v = compile_cache.HitVerifier()
    calls = []

    def recompile():
        calls.append(1)
        return Exe()

    assert v("fam-a", cached, recompile) is cached and calls == []            # its own read: not verified
    assert compile_cache._LAST_GET[0] is None                                 # consumed
    assert v("fam-b", cached, recompile) is cached and calls == [1]           # no read of its own: verified
    assert compile_cache.run_events()["verified"] == 1
