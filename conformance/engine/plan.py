"""A run's plan identity, shards of a plan, and the checks that keep two plans from mixing.

The cases of a run, and how each is judged, are a deterministic function of its *identity*
(`IDENTITY_KEYS`), which the plan record carries:

* what is drawn: ``suite``, ``seed``, ``examples``, ``devices``, ``platform``, and the versions
  that shape the draws (``jax``, ``jaxlib``, ``numpy``, ``python``, ``hypothesis``);
* ``data_per_program`` (``--data-per-program``: how many data sets each drawn structure runs with;
  None through `conformance.engine.runner.run`'s default, each suite's own count);
* ``strict_xfails`` (``--strict-xfails``: stale or too-broad entries fail the run);
* ``partitioner`` ("shardy" or "gspmd": JAX's ``jax_use_shardy_partitioner`` in the run, which
  compiles every program that does not pick its own) and ``x64`` (``jax_enable_x64``, which decides
  the dtypes of the programs), read from JAX's config when the plan is recorded;
* ``project``: the code doing the checking (`project_identity`: the installed distribution's version
  and a digest of refsim/, xla_backend/ and conformance/'s Python sources), since an edit to a rule,
  a strategy or the comparator changes the cases or their verdicts under the same options;
* where the plan record has them (the command line's, from the platform preflight):
  ``process_count`` (a multi-process run checks collectives across processes) and
  ``device_kinds`` (the hardware checked).

`--resume` continues a folder only with the same identity and shard; `python -m conformance
merge` combines folders only of one identity. Each refusal names the field
(`differences`: ``data_per_program: 10 there, 3 now``). A record written before a field was part
of the identity (`RECORDED_KEYS`: every plan of this version has them) cannot be shown to match:
`differences` names it as ``not recorded`` and the folder is refused as well.

The other ``run`` options do not change what is checked and are not part of it: ``--processes``
and ``--case-timeout`` (how the cases run; a case over its time is a "timeout" result, whatever
the limit), ``--shrink-seconds`` (how far a failure's reproducer is cut down), ``--compile-cache``
(a cache answers only for the code that runs), ``--report``, ``--resume``, ``--no-progress`` and
``--force``. The shard (``--shard``) and the xfails entries (``xfails_digest``) are checked on their
own: `--resume` needs the same shard, `merge` distinct shards of one plan, and both refuse another
xfails file, since the kept verdicts were judged with the old entries.

`--shard K/N` keeps the cases at plan positions K-1, K-1+N, K-1+2N, ... so the N shards together
are the plan, each case in exactly one shard, and every shard gets a share of every suite and
family. The plan record also lists its case ids (``case_ids``; of the shard, with ``plan_cases``
the whole plan's count), so a report can say which cases it lacks and `--resume` and `merge` can
refuse a case line that is not in the plan.
"""
from __future__ import annotations

import functools
import hashlib
import os

__all__ = ["IDENTITY_KEYS", "RECORDED_KEYS", "check_resume", "config_entries", "differences", "identity",
           "parse_shard", "project_identity", "select_shard", "select_shard_chunks", "shard_size", "structures",
           "unrecorded", "with_data", "xfails_digest"]

#: Every plan record of this version has these (a record without one cannot be shown to match).
RECORDED_KEYS = ("suite", "seed", "examples", "devices", "platform", "jax", "jaxlib", "numpy", "python",
                 "hypothesis", "data_per_program", "strict_xfails", "partitioner", "x64", "project")
#: The plan identity: `RECORDED_KEYS`, and the hardware entries compared where both records have them.
IDENTITY_KEYS = RECORDED_KEYS + ("process_count", "device_kinds")

PROJECT_DISTRIBUTION = "jax-conformance"
PROJECT_PACKAGES = ("refsim", "xla_backend", "conformance")


@functools.lru_cache(maxsize=None)
def project_identity() -> str:
    """``<version>+sha256:<hex>``: the installed ``jax-conformance`` distribution's version
    (``unknown`` when it is not installed) and a sha256 of the Python sources of refsim/,
    xla_backend/ and conformance/ (each file's path below the packages' folder and content), as
    this process loaded them. Computed once per process (a few milliseconds)."""
    from importlib import metadata

    try:
        version = metadata.version(PROJECT_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    h = hashlib.sha256()
    for package in PROJECT_PACKAGES:
        for folder, dirs, names in os.walk(os.path.join(root, package)):
            dirs.sort()
            for name in sorted(names):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).replace(os.sep, "/").encode("utf-8") + b"\0")
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
    return f"{version}+sha256:{h.hexdigest()}"


def config_entries() -> dict:
    """The identity entries that come from this process rather than the run's options: ``project``
    (`project_identity`), and JAX's ``partitioner`` and ``x64`` in force now."""
    import jax  # the caller has configured the platform: JAX is loaded by now

    shardy = getattr(jax.config, "jax_use_shardy_partitioner", True)
    return {"partitioner": "shardy" if shardy else "gspmd", "x64": bool(jax.config.jax_enable_x64),
            "project": project_identity()}


def identity(plan: dict) -> dict:
    """The entries of `plan` that decide which cases it draws and how they are judged (absent keys are left out)."""
    return {k: plan[k] for k in IDENTITY_KEYS if k in plan}


def unrecorded(plan: dict) -> list[str]:
    """The `RECORDED_KEYS` that `plan` lacks (an older version wrote it)."""
    return [k for k in RECORDED_KEYS if k not in plan]


def differences(a: dict, b: dict, *, names=("there", "now")) -> list[str]:
    """One text per identity entry where plans `a` and `b` differ, e.g. ``seed: 0 there, 1 now``,
    or where one of them lacks a `RECORDED_KEYS` entry the other has
    (``data_per_program: not recorded there, 3 now``)."""
    ia, ib = identity(a), identity(b)
    out = []
    for k in IDENTITY_KEYS:
        if k in ia and k in ib:
            if ia[k] != ib[k]:
                out.append(f"{k}: {ia[k]!r} {names[0]}, {ib[k]!r} {names[1]}")
        elif k in RECORDED_KEYS and (k in ia or k in ib):
            out.append(f"{k}: {repr(ia[k]) if k in ia else 'not recorded'} {names[0]}, "
                       f"{repr(ib[k]) if k in ib else 'not recorded'} {names[1]}")
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
    * another plan or shard (`differences`), a plan record without a field of the identity
      (`RECORDED_KEYS`: written by an older version) included;
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
        older = [k for k in unrecorded(old) if k in plan]
        why = (f" (its plan record has no {', '.join(older)}: an older version wrote it, so it cannot be shown to "
               "be this plan)" if older else "")
        raise ValueError(
            f"--resume: {path} was written by another plan ({'; '.join(diff)}){why}; resuming would mix the cases "
            "of two plans. Resume with the arguments of that run, or pass a new --report folder.")
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
