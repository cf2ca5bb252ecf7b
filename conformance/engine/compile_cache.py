"""JAX's persistent compilation cache for conformance runs, trusted only for the code that runs now.

XLA compilation is most of a conformance run's time, so `python -m conformance run` keeps every
compiled executable on disk (`default_dir()`; ``--compile-cache DIR`` elsewhere, ``--compile-cache
off`` or ``CONFORMANCE_COMPILE_CACHE=off`` not at all; `runner.run` leaves JAX's configuration alone
unless given ``compile_cache=``). No stored state may bend a verdict, so:

* **Keyed on the module and the compiler's code.** The executables are JAX's own persistent cache
  entries (XLA's serialized executables), which JAX keys on the lowered module, the compile options,
  the device assignment, ``XLA_FLAGS`` and the jaxlib version: every case is traced and lowered on
  every run, so a changed lowering (an edited JAX, a monkeypatched rule) is a different key. The
  compiler is identified by the *content* of its files, not its version string: the cache lives
  in ``DIR/xla-<digest>``, the digest of `conformance.engine.code_identity` (JAX's, jaxlib's and
  every PJRT plugin's installed files, the project's staging code and version). An entry written
  by other code is never read, and one written by a faulty compiler is never read by a fixed one.
* **Verified before trusted.** A change that touches no file (a site hook that patches the compile
  step) keeps both keys. So the first executable of each of the first `VERIFY_PER_RUN` case families
  that come from the cache in a run (all with ``CONFORMANCE_VERIFY_PER_RUN=all``) is compiled again
  past the cache and the two optimized modules compared (`HitVerifier`); any difference stops the
  cache in every process of the run for the rest of it, and the run says so in one line. An entry
  that a process of the same run wrote (its key is marked beside the run's events file when it is
  put) is not verified: the same code, compiler and hooks made it moments before, so a fresh compile
  can only repeat it; such hits are counted apart ("hits_from_run") and leave the family's first
  stored hit still to be verified.
* **Data, never code, and checked.** Each entry is JAX's bytes behind a header holding the sha256
  of the identity, the key and the bytes (`DigestCache`): an entry that is torn, flipped, copied
  under another key or from another identity is a miss (recompiled, counted in the run's summary),
  never an error blamed on XLA. Nothing is unpickled. The drawn plan is not cached (it held
  program source that would run): a rerun draws again (~2 CPU-s).

Trust boundary: the entries are native executables that XLA loads and runs, exactly as JAX's own
cache. Share a cache folder only between jobs that trust each other.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time

from conformance.engine import code_identity

ENV = "CONFORMANCE_COMPILE_CACHE"
IDENTITY_ENV = "CONFORMANCE_CODE_IDENTITY"    # the parent's identity digest, for its workers
EVENTS_ENV = "CONFORMANCE_CACHE_EVENTS"       # a file each process of a run appends its cache events to

OFF = ("off", "none", "no", "0")
ENTRY_MAGIC = b"refsim-conformance-entry-1\n"   # the header's first line; the next 64 bytes: the digest
FOLDER_PREFIX = "xla-"
MEMO = "file-digests.json"
MEMO_ENV = "CONFORMANCE_FILE_DIGESTS"   # where the file digests are remembered (default: `memo_path()`)
VERIFY_PER_RUN = 8                      # families whose first cache hit a run compiles again (`verify_per_run`)
VERIFY_ENV = "CONFORMANCE_VERIFY_PER_RUN"


def default_dir() -> str | None:
    """``$CONFORMANCE_COMPILE_CACHE`` (None if it says "off"), else
    ``$XDG_CACHE_HOME/refsim-conformance/xla`` (~/.cache by default)."""
    if os.environ.get(ENV):
        value = os.environ[ENV]
        return None if value.strip().lower() in OFF else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refsim-conformance", "xla")


def verify_per_run() -> int:
    """How many case families of a run have their first cache hit compiled again and compared:
    ``$CONFORMANCE_VERIFY_PER_RUN`` ("all" for every family), else `VERIFY_PER_RUN`. A change to the
    compile step that touches no file acts on every module it compiles, so a few families find it; a
    full rerun's every family would cost a third of its CPU (37 families, 14.6 s of 47 CPU-s here)."""
    value = os.environ.get(VERIFY_ENV, "").strip().lower()
    if value == "all":
        return 1 << 30
    try:
        return max(1, int(value)) if value else VERIFY_PER_RUN
    except ValueError:
        return VERIFY_PER_RUN


def memo_path() -> str:
    """Where this machine's file digests are remembered: ``$CONFORMANCE_FILE_DIGESTS``, else
    ``file-digests.json`` in the user's cache folder (not in a compile-cache folder: the digests are
    of this machine's files, and a new cache folder should not hash jaxlib again)."""
    if os.environ.get(MEMO_ENV):
        return os.environ[MEMO_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refsim-conformance", MEMO)


def enable(path: str) -> str | None:
    """Cache every compiled executable under `path` (created if missing), in the folder of the code
    that runs now, in this process and in worker processes started after this call (through the
    environment). Returns that folder; a `path` of "off" (`OFF`) enables nothing and returns None.

    Every entry is kept, however fast it compiled: the suite's programs compile in tens of
    milliseconds each, below JAX's default threshold of one second.
    """
    if str(path).strip().lower() in OFF:
        return None
    folder, settings, env = _settings(path)
    os.environ.update(env)   # spawned workers read these when they import jax, and in `install_from_env`
    import jax  # not at the top: the CLI imports this module before the platform is configured

    for name, value in settings.items():
        jax.config.update(name, value)
    install_from_env()
    return folder


def worker_environment(path: str) -> dict:
    """The environment variables `enable(path)` sets for the worker processes it starts (JAX's
    cache settings, read when they import jax; the identity and events file, read by
    `install_from_env`), without changing anything in this process: for workers started before it
    enables the cache (`conformance.engine.workers.start(env=...)`). Creates the folder. "off": {}."""
    if str(path).strip().lower() in OFF:
        return {}
    return _settings(path)[2]


_EVENTS: dict = {}   # base folder -> this run's events file (one per process that enables a cache)
_IDENTITY_SECONDS = [0.0]   # spent computing the code identity in this process


def _settings(path: str) -> tuple[str, dict, dict]:
    base = os.path.abspath(os.path.expanduser(os.fspath(path)))
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as e:
        raise ValueError(f"compile_cache={base!r} cannot be created ({e}); pass a writable folder, or "
                         "--compile-cache off.") from None
    t0 = time.perf_counter()
    digest = code_identity.identity_digest(memo_path())
    _IDENTITY_SECONDS[0] += time.perf_counter() - t0
    folder = os.path.join(base, FOLDER_PREFIX + digest[:32])
    os.makedirs(folder, exist_ok=True)
    if base not in _EVENTS:
        fd, _EVENTS[base] = tempfile.mkstemp(prefix="conformance-cache-events-", suffix=".jsonl")
        os.close(fd)
    settings = {"jax_compilation_cache_dir": folder, "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": -1}
    env = {name.upper(): str(value) for name, value in settings.items()}
    env[IDENTITY_ENV] = digest
    env[EVENTS_ENV] = _EVENTS[base]
    return folder, settings, env


def install_from_env() -> bool:
    """In a process whose cache `enable` (or its parent) configured: check every entry's digest
    (`DigestCache`) and verify the first cache hit of each family (`HitVerifier`). Whether one is."""
    digest = os.environ.get(IDENTITY_ENV)
    if not digest:
        return False
    from xla_backend import cache

    _install_digest_cache(digest)
    cache.set_hit_check(HitVerifier())
    return True


# -- events: what the processes of a run tell its summary --------------------------------------------
def _event(kind: str, **fields) -> None:
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    line = json.dumps({"event": kind, **fields}, default=str) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode("utf-8"))   # one small O_APPEND write: whole lines from every process
        finally:
            os.close(fd)
    except OSError:
        pass


def run_events(path: str | None = None) -> dict:
    """This run's cache events so far: ``{"hits": N, "hits_from_run": N, "bad_entries": N, "verified": N, "verify_seconds": S,
    "identity_seconds": I, "invalidated": [reason, ...], "bad": [reason, ...]}`` (the first few reasons;
    S: the seconds the verifying compiles took, summed over the processes; I: this process's seconds
    computing the code identity)."""
    path = path or os.environ.get(EVENTS_ENV)
    out = {"hits": 0, "hits_from_run": 0, "bad_entries": 0, "verified": 0, "verify_seconds": 0.0,
           "identity_seconds": _IDENTITY_SECONDS[0], "invalidated": [], "bad": []}
    if not path:
        return out
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "hit":
            out["hits"] += 1
        elif e.get("event") == "hit_from_run":
            out["hits_from_run"] += 1
        elif e.get("event") == "bad_entry":
            out["bad_entries"] += 1
            if len(out["bad"]) < 5:
                out["bad"].append(str(e.get("reason")))
        elif e.get("event") == "verified":
            out["verified"] += 1
            out["verify_seconds"] += float(e.get("seconds") or 0.0)
        elif e.get("event") == "invalidated" and len(out["invalidated"]) < 5:
            out["invalidated"].append(str(e.get("reason")))
    return out


def end_run() -> dict:
    """This run's events (`run_events`), then its events file and markers removed: the next run in
    this process starts afresh."""
    events = run_events()
    path = os.environ.get(EVENTS_ENV)
    for base, p in list(_EVENTS.items()):
        if p == path:
            del _EVENTS[base]
    if path:
        import shutil

        shutil.rmtree(path + ".verified", ignore_errors=True)
        shutil.rmtree(path + ".written", ignore_errors=True)
        try:
            os.remove(path)
        except OSError:
            pass
    return events


def use_line(events: dict) -> str:
    """What the cache did in a run, in one line: executables read back, families verified."""
    own = events.get("hits_from_run", 0)
    return (f"compile cache: {events.get('hits', 0)} executable(s) read back instead of compiled"
            + (f" (and {own} that this run had compiled itself)" if own else "") + "; "
            f"{events.get('verified', 0)} famil{'y' if events.get('verified', 0) == 1 else 'ies'} checked against a "
            "fresh compile")


def summary_line(events: dict) -> str | None:
    """One line on what the cache did that a reader must know (None when it only served good entries)."""
    parts = []
    if events.get("invalidated"):
        parts.append(f"compile cache NOT used after a verification failed ({events['invalidated'][0]}); "
                     "those executables were compiled afresh")
    if events.get("bad_entries"):
        parts.append(f"{events['bad_entries']} compile-cache entr{'y' if events['bad_entries'] == 1 else 'ies'} "
                     f"failed their digest and were compiled afresh (first: {events['bad'][0]})")
    return "; ".join(parts) or None


# -- entries with a digest -------------------------------------------------------------------------
def seal(identity: str, key: str, value: bytes) -> bytes:
    """An entry as stored: `ENTRY_MAGIC`, the hex sha256 of (identity, key, value), then `value`."""
    digest = hashlib.sha256(identity.encode() + b"\0" + key.encode() + b"\0" + value).hexdigest().encode()
    return ENTRY_MAGIC + digest + value


def unseal(identity: str, key: str, stored: bytes) -> tuple[bytes | None, str | None]:
    """(value, None) for an entry `seal` wrote with this identity and key, else (None, why)."""
    if not stored.startswith(ENTRY_MAGIC):
        return None, "no entry header (not written by this project, or an older format)"
    digest, value = stored[len(ENTRY_MAGIC):len(ENTRY_MAGIC) + 64], stored[len(ENTRY_MAGIC) + 64:]
    want = hashlib.sha256(identity.encode() + b"\0" + key.encode() + b"\0" + value).hexdigest().encode()
    if digest != want:
        return None, "digest mismatch (corrupt, or copied in under another key or code identity)"
    return value, None


class DigestCache:
    """A JAX cache (`jax._src.cache_interface.CacheInterface`: get / put by key) over `base` whose
    entries are `seal`ed with the code identity and their key: `get` returns only an entry that
    checks out; any other is a miss, recorded as a "bad_entry" event."""

    def __init__(self, base, identity: str):
        self._base = base
        self.identity = identity
        self.bad_entries = 0
        self._bad: set = set()   # keys whose stored entry failed its check: the next put replaces it

    @property
    def _path(self):
        return self._base._path

    def get(self, key: str):
        _LAST_GET[0] = None   # set below only for an entry that checks out: a miss leaves no key behind
        if _passed_by():
            return None
        stored = self._base.get(key)
        if stored is None:
            return None
        value, why = unseal(self.identity, key, bytes(stored))
        if value is None:
            self.bad_entries += 1
            self._bad.add(key)
            _event("bad_entry", key=key, reason=why)
        _LAST_GET[0] = key if value is not None else None
        return value

    def put(self, key: str, value: bytes) -> None:
        if _passed_by():
            return
        sealed = seal(self.identity, key, bytes(value))
        _mark_written(key)
        if key in self._bad and self._replace(key, sealed):
            self._bad.discard(key)
            return
        self._base.put(key, sealed)   # JAX's file cache keeps an existing entry: see _replace

    def _replace(self, key: str, sealed: bytes) -> bool:
        """Write over a bad entry (JAX's file cache never replaces one: a bad entry would be a miss on
        every run), whole or not at all; whether it was written."""
        folder = getattr(self._base, "path", None)
        if folder is None:
            return False
        try:
            fd, tmp = tempfile.mkstemp(dir=os.fspath(folder), suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(sealed)
            os.replace(tmp, os.path.join(os.fspath(folder), f"{key}-cache"))
            return True
        except OSError:
            return False

    def clear(self):
        clear = getattr(self._base, "clear", None)
        if clear is not None:
            clear()


def _install_digest_cache(identity: str) -> None:
    """Make JAX build its persistent cache as a `DigestCache` (JAX's cache module is private; both
    supported versions build it with `get_file_cache(path)` on first use and drop it in
    `reset_cache()`, which this relies on)."""
    from refsim import compat

    jcc = compat.persistent_cache_module()

    made = getattr(jcc.get_file_cache, "_conformance_identity", None)
    if made == identity:
        return
    plain = getattr(jcc.get_file_cache, "_conformance_plain", jcc.get_file_cache)

    def get_file_cache(path):
        got = plain(path)
        if got is None:
            return None
        base, where = got
        return DigestCache(base, identity), where

    get_file_cache._conformance_identity = identity
    get_file_cache._conformance_plain = plain
    jcc.get_file_cache = get_file_cache
    jcc.reset_cache()   # a cache JAX already built would read entries unchecked


# -- verification of cache hits ---------------------------------------------------------------------
class HitVerifier:
    """`xla_backend.cache`'s check of an executable JAX read from its persistent cache: the first
    such hit of each scope (the case family the runner names) in the run (the first process to meet
    it checks it) is compiled again with the cache off and the optimized modules compared. On a difference the cache is switched
    off in this process (the run's summary says so) and the fresh executable is used."""

    def __init__(self):
        self.checked: set = set()
        self.failed: str | None = None

    def __call__(self, scope, executable, recompile_fn):
        key, _LAST_GET[0] = _LAST_GET[0], None   # each hit consumes the key its own read left
        if _written_in_run(key):
            # written by this run's own code moments ago: a fresh compile could only repeat it
            _event("hit_from_run")
            return recompile_fn() if self.failed is not None or _invalidated_in_run() else executable
        _event("hit")
        if self.failed is None and _invalidated_in_run():
            # another process of this run found the cache untrustworthy: nothing from it is used here either
            self.failed = "another process of this run found a cached executable that differs from a fresh compile"
            _OFF[0] = True
            return recompile_fn()
        if self.failed is not None or scope in self.checked:
            return executable
        self.checked.add(scope)
        if not _first_in_run(scope):
            return executable   # another process of this run checks this family
        t0 = time.perf_counter()
        with bypass():
            fresh = recompile_fn()
        same = _module_text(fresh) == _module_text(executable)
        seconds = time.perf_counter() - t0
        if same:
            _event("verified", scope=scope, seconds=seconds)
            return executable
        self.failed = (f"the cached executable of a {scope} case differs from a fresh compile of the same "
                       "lowered module: the compiler changed without a change to its files")
        _event("invalidated", scope=scope, reason=self.failed, seconds=seconds)
        _mark_invalidated()
        _OFF[0] = True
        return fresh


# The cache is passed by (reads miss, writes are dropped) while `bypass` is active or once `_OFF`: JAX's own
# switch, jax_enable_compilation_cache, is read once per process by jax 0.12, so it cannot turn the cache
# off after the first compile.
_BYPASS = [0]
_OFF = [False]


@contextlib.contextmanager
def bypass():
    """Inside, nothing is read from or written to the cache (`DigestCache`) in this process: a
    compile that must not be answered from it, or must not leave its result in it."""
    _BYPASS[0] += 1
    try:
        yield
    finally:
        _BYPASS[0] -= 1


def _passed_by() -> bool:
    return _OFF[0] or _BYPASS[0] > 0


_DEBUG_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}|,?\s*stack_frame_id=\d+")


_LAST_GET: list = [None]   # the key of the last entry `DigestCache.get` returned in this process


def _written_folder() -> str | None:
    events = os.environ.get(EVENTS_ENV)
    return None if not events else events + ".written"


def _key_marker(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _mark_written(key: str) -> None:
    """Mark `key` as written by this run (a file beside the run's events file; nothing without one)."""
    folder = _written_folder()
    if folder is None:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, _key_marker(key)), "w").close()
    except OSError:
        pass


def _written_in_run(key: str | None) -> bool:
    """Whether a process of this run wrote the entry under `key` (False without a run's events file)."""
    folder = _written_folder()
    return key is not None and folder is not None and os.path.exists(os.path.join(folder, _key_marker(key)))


def _run_folder() -> str | None:
    events = os.environ.get(EVENTS_ENV)
    return None if not events else events + ".verified"


def _invalidated_in_run() -> bool:
    folder = _run_folder()
    return folder is not None and os.path.exists(os.path.join(folder, "INVALIDATED"))


def _mark_invalidated() -> None:
    folder = _run_folder()
    if folder is not None:
        try:
            os.makedirs(folder, exist_ok=True)
            open(os.path.join(folder, "INVALIDATED"), "w").close()
        except OSError:
            pass


def _first_in_run(scope: str) -> bool:
    """Whether this process is the first of the run to check `scope` (a marker file created
    exclusively beside the run's events file; True where there is none)."""
    folder = _run_folder()
    if folder is None:
        return True
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, hashlib.sha256(scope.encode()).hexdigest()[:32]),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        claimed = sum(1 for name in os.listdir(folder) if name != "INVALIDATED")
        return claimed <= verify_per_run()
    except FileExistsError:
        return False
    except OSError:
        return True


_NAME = re.compile(r"%[A-Za-z_][\w.\-]*")
_HEADER_PARAM = re.compile(r"([\(,]\s*)[A-Za-z_][\w.\-]*(?=:\s)")
_MODULE_NAME = re.compile(r"^HloModule \S+?(,|$)")


def _module_text(executable) -> str:
    """The optimized module XLA built, as a text that two lowerings of one program share: without its
    debug information (source lines, call stacks) and with every name (module, computations,
    instructions, parameters: JAX names them after the function and the primitives, which the cache
    key leaves out) replaced by its order of first appearance."""
    texts = executable.as_text()
    text = texts if isinstance(texts, str) else "\n".join(texts)
    out, skipping = [], False
    names: dict = {}

    def rename(m):
        return names.setdefault(m.group(0), f"%n{len(names)}")

    for line in text.splitlines():
        if line.strip() in _DEBUG_TABLES:
            skipping = True
            continue
        if skipping:
            if not line.strip() or line[:1].isdigit():
                continue
            skipping = False
        line = _MODULE_NAME.sub(r"HloModule m\1", _METADATA.sub("", line))
        if line.rstrip().endswith("{") and " -> " in line:   # a computation's header: its parameters' labels
            line = _HEADER_PARAM.sub(r"\1p", line)
        out.append(_NAME.sub(rename, line))
    return "\n".join(out)
