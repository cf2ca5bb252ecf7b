"""A run's plan identity, shards of a plan, and the checks that keep two plans from mixing.

The cases of a run are a deterministic function of its *identity*: the suites, seed,
examples, device count, platform and the versions that shape the draws (JAX, jaxlib, NumPy,
Python, hypothesis). `--resume` continues a folder only with the same identity and shard;
`python -m conformance merge` combines folders only of one identity. `--shard K/N` keeps the
cases at plan positions K-1, K-1+N, K-1+2N, ... so the N shards together are the plan, each
case in exactly one shard, and every shard gets a share of every suite and family.

The plan record also lists its case ids (``case_ids``; of the shard, with ``plan_cases`` the
whole plan's count), so a report can say which cases it lacks and `--resume` and `merge` can
refuse a case line that is not in the plan, and the digest of the xfails entries it judged
with (``xfails_digest``): `--resume` refuses another xfails file, since the kept verdicts were
judged with the old one.
"""
from __future__ import annotations

import os

__all__ = ["IDENTITY_KEYS", "check_resume", "differences", "identity", "parse_shard", "select_shard",
           "select_shard_chunks", "shard_size", "structures", "with_data", "xfails_digest"]

IDENTITY_KEYS = ("suite", "seed", "examples", "devices", "platform", "jax", "jaxlib", "numpy", "python",
                 "hypothesis")


def identity(plan: dict) -> dict:
    """The entries of `plan` that decide which cases it draws (absent keys are left out)."""
    return {k: plan[k] for k in IDENTITY_KEYS if k in plan}


def differences(a: dict, b: dict, *, names=("there", "now")) -> list[str]:
    """One text per identity entry where plans `a` and `b` differ, e.g. ``seed: 0 there, 1 now``."""
    ia, ib = identity(a), identity(b)
    out = []
    for k in IDENTITY_KEYS:
        if k in ia and k in ib and ia[k] != ib[k]:
            out.append(f"{k}: {ia[k]!r} {names[0]}, {ib[k]!r} {names[1]}")
    return out


def parse_shard(text) -> tuple[int, int]:
    """``"K/N"`` as (K, N) with 1 <= K <= N; ValueError naming the value otherwise."""
    parts = str(text).split("/")
    try:
        k, n = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--shard {text!r} is not K/N; write e.g. --shard 1/2 for the first of 2 shards.") from None
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K/N needs 1 <= K <= N (shards are numbered from 1), e.g. 1/{max(n, 2)}.")
    return k, n


def select_shard(tasks: list, shard) -> list:
    """The tasks of shard (K, N): plan positions K-1, K-1+N, ... (None: all of them)."""
    if shard is None:
        return list(tasks)
    k, n = shard if isinstance(shard, tuple) else parse_shard(shard)
    return list(tasks[k - 1::n])


def select_shard_chunks(chunks, shard):
    """`select_shard` over a plan drawn in chunks (lists of tasks): yields each chunk's tasks of
    shard (K, N), counting plan positions across chunks, so the concatenation is `select_shard`
    of the whole plan. None: every chunk as it is. A bad `shard` raises here, before any drawing."""
    if shard is None:
        return iter(chunks)
    k, n = shard if isinstance(shard, tuple) else parse_shard(shard)
    return _shard_chunks(chunks, k, n)


def _shard_chunks(chunks, k: int, n: int):
    pos = 0
    for chunk in chunks:
        yield [t for i, t in enumerate(chunk, pos) if i % n == k - 1]
        pos += len(chunk)


def plan_records(path) -> list[dict]:
    """The plan records of a results.jsonl file (one per run that wrote to it), [] when missing."""
    from conformance.report import read_records

    if not os.path.exists(path):
        return []
    return [r for r in read_records(path) if r.get("type") == "plan"]


def shard_size(k: int, n: int, plan_cases: int) -> int:
    """How many of a plan's `plan_cases` cases shard (k, n) holds."""
    return len(range(k - 1, plan_cases, n))


def xfails_digest(xf) -> str:
    """``sha256:<hex>`` of the entries of an `XfailList` that apply (pattern, signature, reason, ...;
    not comments, blank lines or line numbers): two runs with equal digests judge every case alike."""
    import hashlib
    import json

    rows = [[e.pattern, e.reason, e.kind, list(e.classes), e.model, e.exception, e.message, e.sometimes,
             e.version] for e in xf.entries]
    return "sha256:" + hashlib.sha256(json.dumps(rows, default=str).encode("utf-8")).hexdigest()


def check_resume(report_dir, plan: dict, finished=None) -> None:
    """ValueError naming ``report_dir/results.jsonl`` when resuming it with `plan` would mix what must not mix:

    * case records but no plan line (nothing says which plan they belong to);
    * another plan or shard (`differences`);
    * another xfails file (``xfails_digest``): the kept verdicts were judged with the old entries;
    * a case record (`finished`: the loaded {case_id: CaseResult}) whose id is not in `plan`'s
      ``case_ids`` (a foreign line, copied or edited in).
    """
    from conformance.report import JSONL_NAME

    path = os.path.join(os.fspath(report_dir), JSONL_NAME)
    plans = plan_records(path)
    if not plans:
        if finished:
            raise ValueError(
                f"--resume: {path} has case records but no plan line, so nothing says which plan (suites, seed, "
                "examples, devices, platform, versions) they belong to; it was not written by `python -m conformance "
                "run`. Pass a new --report folder, or remove the file to start afresh.")
        return
    old = plans[0]  # resumes append plans of the same identity
    diff = differences(old, plan)
    if old.get("shard") != plan.get("shard"):
        diff.append(f"shard: {old.get('shard') or 'none'} there, {plan.get('shard') or 'none'} now")
    if diff:
        raise ValueError(
            f"--resume: {path} was written by another plan ({'; '.join(diff)}); resuming would mix the cases of "
            "two plans. Resume with the arguments of that run, or pass a new --report folder.")
    if "xfails_digest" in plan and old.get("xfails_digest") != plan["xfails_digest"]:
        was = (f"{old.get('xfails')} ({old['xfails_digest'][:19]}...)" if old.get("xfails_digest")
               else "an xfails file it did not record")
        raise ValueError(
            f"--resume: {path} was judged with other xfails entries ({was}) than now ({plan.get('xfails')} "
            f"({plan['xfails_digest'][:19]}...)); its kept verdicts would not match the new file. Resume with the "
            "xfails file of that run, or pass a new --report folder to judge every case with the new one.")
    if finished and plan.get("case_ids") is not None:
        planned = set(plan["case_ids"])
        foreign = [c for c in finished if c not in planned]
        if foreign:
            raise ValueError(
                f"--resume: {path} holds {len(foreign)} case record(s) that are not in this plan, e.g. {foreign[0]!r}; "
                "a record copied in from another run or edited would count as this plan's result. Remove those "
                "lines, or pass a new --report folder.")


# -- more data per compiled program -------------------------------------------------------------------
def _data_kinds(suite: str) -> tuple:
    """The data kinds (`conformance.suites.base.DATA_KINDS`) a suite's refills may hold, its first
    entry "drawn": collectives have a per-element sum model (special values, rounding data), whole
    programs are compared exactly (exact-friendly data, IEEE special values), sharded programs have
    per-op tolerances for exact-friendly data only."""
    from conformance.suites import base

    return {"collectives": base.COLLECTIVE_DATA, "programs": base.PROGRAM_DATA}.get(suite, ("drawn", "exact"))


def structures(variants: list) -> list[list]:
    """A ProgramTask's variants as runs of one drawn structure each (the drawn case, then its
    refills: `conformance.suites.base.with_data_variants` copies share the case's objects)."""
    groups: list[list] = []
    for case in variants:
        g = groups[-1][0] if groups else None
        if g is not None and case.source is g.source and case.mesh is g.mesh and len(case.args) == len(g.args) and \
                all(getattr(a, "shape", None) == getattr(b, "shape", None) for a, b in zip(case.args, g.args)):
            groups[-1].append(case)
        else:
            groups.append([case])
    return groups


def with_data(chunk: list, count: int | None, seed: int) -> list:
    """`chunk` with every ProgramTask's drawn structures run with at least `count` data sets each
    (None: as drawn): refills of the suite's data kinds, deterministic in `seed` and the case id,
    of the same shapes and dtypes, so they share the structure's compiled executable."""
    import dataclasses
    import zlib

    from conformance.suites import base

    if count is None:
        return chunk
    out = []
    for task in chunk:
        if not isinstance(task, base.ProgramTask):
            out.append(task)
            continue
        variants = []
        for i, group in enumerate(structures(task.variants)):
            variants += group
            if len(group) < count:
                s = seed ^ zlib.crc32(f"{task.case_id}/{i}".encode())
                variants += base.with_data_variants(group[0], count - len(group) + 1, s, _data_kinds(task.suite))[1:]
        out.append(dataclasses.replace(task, variants=variants))
    return out


# -- the drawn plan, cached ---------------------------------------------------------------------------
PLAN_SOURCES = ("conformance/strategies", "conformance/suites", "conformance/cases", "conformance/engine/plan.py")


def sources_digest() -> str:
    """sha256 of the Python sources that decide what a plan draws (`PLAN_SOURCES`: the strategies,
    the suites, the case types, this module), so an edit to any of them draws afresh."""
    import hashlib

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    h = hashlib.sha256()
    for rel in PLAN_SOURCES:
        path = os.path.join(root, rel)
        files = [path] if path.endswith(".py") else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py"))
        for f in sorted(files):
            h.update(os.path.relpath(f, root).encode())
            with open(f, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


class PlanCache:
    """Drawn plans (every chunk of tasks, before sharding) kept in `folder`, keyed by `key`: the
    plan identity (`IDENTITY_KEYS`: suites, seed, examples, devices, platform, JAX, jaxlib, NumPy,
    Python and hypothesis versions), the data sets per program and `sources_digest`. A rerun of
    the same plan reads it back instead of drawing it again (hypothesis's draws are deterministic in
    all of these); an entry that cannot be read is drawn again."""

    def __init__(self, folder):
        self.folder = os.fspath(folder)

    @staticmethod
    def key(identity: dict, data_per_program: int | None = None) -> str:
        import hashlib
        import json

        ident = {k: identity.get(k) for k in IDENTITY_KEYS}
        text = json.dumps([ident, data_per_program, sources_digest()], sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def path(self, key: str) -> str:
        return os.path.join(self.folder, key + ".plan")

    def load(self, key: str) -> list | None:
        """The cached chunks of `key`, or None."""
        import pickle

        try:
            with open(self.path(key), "rb") as fh:
                return pickle.load(fh)
        except Exception:  # noqa: BLE001 - missing, torn or from older classes: draw again
            return None

    def save(self, key: str, chunks: list) -> None:
        import pickle
        import tempfile

        try:
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(chunks, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path(key))   # whole or absent
        except Exception:  # noqa: BLE001 - a plan that cannot be kept is drawn again next time
            pass

    def chunks(self, key: str, draw):
        """The plan's chunks: read back, or from `draw` (an iterator of chunks), kept once all are drawn."""
        cached = self.load(key)
        if cached is not None:
            yield from cached
            return
        drawn = []
        for chunk in draw:
            drawn.append(chunk)
            yield chunk
        self.save(key, drawn)
