"""End to end, as a JAX developer and a CI owner would meet it: a cache warm from a clean run must
not answer for a JAX that changed (edited on disk under the same version, or monkeypatched by a site
hook), and nothing planted in the cache or a report folder may run. Each run is a real
`python -m conformance run` of the collectives suite (about 10 s)."""
import os
import pickle
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# seed 1 draws a psum over a group of two devices in its first two examples
RUN = ["-m", "conformance", "run", "--suite", "collectives", "--examples", "2", "--seed", "1", "--no-progress",
       "--shrink-seconds", "0"]

pytestmark = pytest.mark.slow


def _run(cache, *extra, pythonpath=(), timeout=600):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*pythonpath, ROOT]))
    env.pop("XLA_FLAGS", None)   # the run configures its own devices
    out = subprocess.run([sys.executable, *RUN, "--compile-cache", str(cache), *extra], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


def _folders(cache):
    return sorted(p for p in os.listdir(cache) if p.startswith("xla-"))


def _hits(text):
    m = re.search(r"compile cache: (\d+) executable\(s\) read back", text)
    assert m, text[-2000:]
    return int(m.group(1))


@pytest.fixture
def warm(tmp_path):
    """A cache folder after one clean run. (JAX's cache key includes the cache folder's path, so a
    copy of a warm folder elsewhere is cold: each test warms its own, in place.)"""
    cache = tmp_path / "cc"
    code, text = _run(cache)
    assert code == 0 and "AGREE" in text, text[-3000:]
    assert len(_folders(cache)) == 1
    return cache


SITE_HOOK = '''
# a site hook that replaces psum's lowering, as a patch under development would
import jax   # every primitive registered first: the fault replaces their rules
import conformance.faults.lowering as _lowering
_ACTIVE = _lowering.inject("psum_drop_member")
_ACTIVE.__enter__()
'''


def test_the_clean_rerun_reads_its_executables_back(warm):
    code, text = _run(warm)
    assert code == 0 and _hits(text) >= 10, text[-2000:]


def test_a_lowering_monkeypatched_by_a_site_hook_disagrees_on_a_warm_cache(warm, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITE_HOOK)
    code, text = _run(warm, pythonpath=[str(hook)])
    assert code == 1 and "DISAGREE" in text, text[-3000:]
    assert "psum" in text
    assert _hits(text) >= 5   # the cache was warm: the programs without a psum were read back


def _planted_jax_copy(tmp_path):
    """A copy of the installed JAX whose all-reduce lowerings take the max instead of the sum: the
    same files, the same version string, one file edited."""
    import jax

    src = os.path.dirname(jax.__file__)
    dst = tmp_path / "jaxcopy" / "jax"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    path = dst / "_src" / "lax" / "parallel.py"
    text = path.read_text()
    edited, n = re.subn(r"(_all_?reduce_lowering,?\s*\(?\s*)lax\.add_p, lax\.reduce_sum", r"\1lax.max_p, lax.reduce_max",
                        text)
    assert n >= 1, "no all-reduce lowering of psum found to edit in this JAX"
    path.write_text(edited)
    return str(dst.parent)


def test_a_jax_edited_on_disk_under_the_same_version_disagrees_on_a_warm_cache(warm, tmp_path):
    (clean,) = _folders(warm)
    before = sorted(os.listdir(warm / clean))
    code, text = _run(warm, pythonpath=[_planted_jax_copy(tmp_path)])
    assert code == 1 and "DISAGREE" in text, text[-3000:]
    assert len(_folders(warm)) == 2            # the edited JAX has its own folder: the clean one was not read
    assert sorted(os.listdir(warm / clean)) == before


MARK_ENV = "CONFORMANCE_TEST_PAYLOAD_MARK"


class _Payload:
    """Unpickling this creates the file `$CONFORMANCE_TEST_PAYLOAD_MARK`."""

    def __reduce__(self):
        return (exec, (f"import os; open(os.environ[{MARK_ENV!r}], 'w').close()",))


def test_payloads_planted_in_every_cache_file_never_run_and_the_run_still_agrees(warm, tmp_path):
    cache = warm
    blob = pickle.dumps(_Payload())
    entries = 0
    for d, _, files in os.walk(cache):
        for f in files:
            path = os.path.join(d, f)
            if f.endswith("-cache"):
                entries += 1
            with open(path, "wb") as fh:
                fh.write(blob)                  # every entry, the digest memo, everything
    # and where earlier formats kept pickles: plans and pre-trace executables
    for rel in ("plans/0123.plan", "executables/ab/abcd.exe"):
        os.makedirs(os.path.dirname(cache / rel), exist_ok=True)
        (cache / rel).write_bytes(blob)
    mark = tmp_path / "payload-ran"
    os.environ[MARK_ENV] = str(mark)
    try:
        code, text = _run(cache)
    finally:
        os.environ.pop(MARK_ENV, None)
    assert not mark.exists(), "a planted payload ran"
    assert code == 0 and "AGREE" in text, text[-3000:]
    m = re.search(r"(\d+) compile-cache entr(?:y|ies) failed their digest", text)
    assert m and int(m.group(1)) >= 1, text[-2000:]   # (two workers may each meet one bad entry)
    # every entry the run needed was compiled afresh and written back sealed
    from conformance.engine import compile_cache

    resealed = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith("-cache")]
    assert entries >= 1 and len(resealed) == entries
    assert all(open(p, "rb").read().startswith(compile_cache.ENTRY_MAGIC) for p in resealed)


def test_payloads_planted_in_every_report_file_never_run_and_a_resumed_run_still_agrees(tmp_path):
    report = tmp_path / "report"
    code, text = _run("off", "--report", str(report))
    assert code == 0, text[-2000:]
    blob = pickle.dumps(_Payload())
    planted = 0
    for d, _, files in os.walk(report):
        for f in files:
            if f.endswith(".py"):
                continue   # reproducers are scripts a person chooses to run; the run never reads them back
            with open(os.path.join(d, f), "wb") as fh:
                fh.write(blob)
            planted += 1
    assert planted >= 3                         # results.jsonl, junit.xml, report.html at least
    mark = tmp_path / "payload-ran"
    os.environ[MARK_ENV] = str(mark)
    try:
        code, text = _run("off", "--report", str(report), "--resume")
    finally:
        os.environ.pop(MARK_ENV, None)
    assert not mark.exists(), "a planted payload ran"
    assert code == 0 and "AGREE" in text, text[-2000:]
