"""`python -m conformance merge DIR... --out DIR`: one report from the folders of a plan's shards.

Each DIR is a ``--report`` folder (its results.jsonl is the record). The folders must come
from one plan (`conformance.engine.plan.identity`: suites, seed, examples, devices, platform,
versions, data sets per program, xfails strictness, partitioner, x64 and the project's own
version) and hold distinct shards (or distinct cases); anything else is refused, naming the
folder and the field that differs. A folder whose plan record lacks a field of the identity
(written by an older version) is refused too, naming the field. The merged folder gets results.jsonl, junit.xml, report.html
and repros/ as a single run writes them, the cases of shard 1 first (each folder's cases in
the order it finished them), and a summary over all of them.

The merged report covers the whole plan or says it does not: the union of the folders must be
every case of the plan (each plan record lists its case ids, and a shard's the whole plan's case
count; older folders are checked by counts and shard coverage). Missing shards, or cases missing
from a shard whose run was interrupted, make the merged verdict INCOMPLETE (never AGREE), naming
the missing shards and cases. A case line whose id is not in its folder's plan is refused. The
exit status is the merged run's: 0 (AGREE), 1 (DISAGREE), 3 (INCOMPLETE); 2 when the folders
cannot be merged or --out is in use by another run (`conformance.report.lock`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from conformance.engine import plan as plan_mod
from conformance.report import JSONL_NAME, lock as lock_mod, open_report_dir, print_table, read_records
from conformance.report.lock import acquire
from conformance.report.results import CaseResult, cover, exit_status, summarize

__all__ = ["Folder", "main", "merge", "read_folder"]


class Folder:
    """What one report folder holds: its first plan, its cases (latest record per id, in file order), its summary."""

    def __init__(self, path: str, plan: dict, cases: list, summary: dict | None):
        self.path, self.plan, self.cases, self.summary = path, plan, cases, summary

    @property
    def shard(self):
        text = self.plan.get("shard")
        return None if not text else plan_mod.parse_shard(text)


def read_folder(path) -> Folder:
    """The Folder at `path`; ValueError when it has no results.jsonl or no plan record."""
    path = os.fspath(path)
    jsonl = os.path.join(path, JSONL_NAME)
    if not os.path.exists(jsonl):
        raise ValueError(f"{path!r} is not a report folder: it has no {JSONL_NAME}; pass folders written by "
                         "`python -m conformance run --report DIR`.")
    records = read_records(jsonl)  # ValueError for a FIFO, device or folder there
    plans = [r for r in records if r["type"] == "plan"]
    if not plans:
        raise ValueError(f"{jsonl} has no plan record; it was not written by `python -m conformance run`.")
    cases: dict[str, CaseResult] = {}
    for r in records:
        if r["type"] == "case":
            # the latest record of a case wins, at the case's first position (plan order)
            cases[r["case_id"]] = CaseResult.from_json(r)
    summaries = [r for r in records if r["type"] == "summary"]
    return Folder(path, plans[0], list(cases.values()), summaries[-1] if summaries else None)


def _check(folders: list[Folder]) -> None:
    first = folders[0]
    for f in folders[1:]:
        diff = plan_mod.differences(first.plan, f.plan, names=(f"in {first.path}", f"in {f.path}"))
        if diff:
            raise ValueError(f"{f.path} comes from another plan than {first.path} ({'; '.join(diff)}); only the "
                             "folders of one plan (same suites, seed, examples, devices, platform, versions, data "
                             "sets per program, strictness, partitioner, project version) merge.")
    for f in folders:
        lacking = plan_mod.unrecorded(f.plan)
        if lacking:
            raise ValueError(f"{f.path}'s plan record has no {', '.join(lacking)}: an older version of conformance "
                             "wrote it, so it cannot be shown to come from the same plan (and the same code) as the "
                             "others; rerun it with this version.")
    shards = [f.shard for f in folders]
    if any(shards) and not all(shards):
        raise ValueError("cannot merge sharded and unsharded folders: "
                         + ", ".join(f"{f.path} ({f.plan.get('shard') or 'unsharded'})" for f in folders))
    if all(shards):
        counts = {n for _, n in shards}
        if len(counts) > 1:
            raise ValueError("the folders split the plan into different numbers of shards: "
                             + ", ".join(f"{f.path} ({f.plan['shard']})" for f in folders))
        seen: dict = {}
        for f in folders:
            if f.shard in seen:
                raise ValueError(f"{f.path} and {seen[f.shard]} are both shard {f.plan['shard']}; pass each shard once.")
            seen[f.shard] = f.path
    digests = {f.plan.get("xfails_digest") for f in folders} - {None}
    if len(digests) > 1:
        raise ValueError("the folders were judged with different xfails entries: "
                         + ", ".join(f"{f.path} ({f.plan.get('xfails')})" for f in folders)
                         + "; rerun the shards with one xfails file.")
    for f in folders:
        ids = f.plan.get("case_ids")
        if ids is None:
            continue
        planned = set(ids)
        foreign = [r.case_id for r in f.cases if r.case_id not in planned]
        if foreign:
            raise ValueError(f"{f.path} holds {len(foreign)} case record(s) that are not in its plan, e.g. "
                             f"{foreign[0]!r} (copied in from another run, or edited); remove those lines from "
                             f"{os.path.join(f.path, 'results.jsonl')}.")
    owner: dict = {}
    for f in folders:
        for r in f.cases:
            if r.case_id in owner:
                raise ValueError(f"case {r.case_id} is in both {owner[r.case_id]} and {f.path}; pass folders that "
                                 "hold distinct cases (the shards of one plan).")
            owner[r.case_id] = f.path


def _ordered(folders: list[Folder]) -> list[CaseResult]:
    """Every folder's cases, shard 1 first (folders without a shard in the order given)."""
    ranked = sorted(folders, key=lambda f: f.shard or (0, 0))  # sorted() is stable
    return [r for f in ranked for r in f.cases]


def merge(dirs, out) -> dict:
    """Merge the report folders `dirs` into `out` (created; must not be one of them); return the summary.

    Raises ValueError naming the folder when they cannot be merged; nothing is written then.
    """
    if not dirs:
        raise ValueError("no report folders given; pass the --report folders of the shards, e.g. shard1 shard2.")
    out = os.fspath(out)
    folders = [read_folder(d) for d in dirs]
    if any(os.path.abspath(f.path) == os.path.abspath(out) for f in folders):
        raise ValueError(f"--out {out!r} is one of the folders to merge; write the merged report to a new folder.")
    _check(folders)

    for f in folders:
        owner = lock_mod.read(f.path)
        if owner is not None:
            print(f"note: {f.path} is locked by {lock_mod.describe(owner)}: a run may still be writing it; the "
                  "cases it recorded so far are merged", file=sys.stderr)
    results = _ordered(folders)
    repro_dir = os.path.join(out, "repros")
    for r in results:
        if r.repro_path:
            src = _find_repro(r.repro_path, folders)
            if src is not None:
                os.makedirs(repro_dir, exist_ok=True)
                dst = os.path.join(repro_dir, os.path.basename(src))
                shutil.copyfile(src, dst)
                r.repro_path = dst
    first = folders[0].plan
    shards = [f.plan.get("shard") for f in folders if f.plan.get("shard")]
    planned_ids, planned, known_missing, missing_shards = _coverage(folders)
    plan = {**{k: v for k, v in first.items() if k not in ("type", "shard", "cases", "resumed", "case_ids")},
            "cases": planned if planned is not None else len(results), "merged_from": [f.path for f in folders],
            "shards": shards}
    if planned_ids is not None:
        plan["case_ids"] = planned_ids
    if missing_shards:
        plan["missing_shards"] = missing_shards
    summaries = [f.summary or {} for f in folders]
    wall = max((s.get("wall_seconds", 0.0) for s in summaries), default=0.0)  # the shards ran side by side
    summary = summarize(results, wall_seconds=wall, compile_seconds=sum(r.compile_seconds for r in results))
    summary["machine_seconds"] = sum(s.get("wall_seconds", 0.0) for s in summaries)
    summary["stale_xfails"] = [r.case_id for r in results if r.status == "xpass"]
    # an entry is unused only if no shard used it
    unused = [set(s.get("unused_xfails", ())) for s in summaries]
    summary["unused_xfails"] = sorted(set.intersection(*unused)) if unused else []
    summary["plan"] = {k: v for k, v in plan.items() if k != "case_ids"}
    if missing_shards:
        summary["missing_shards"] = missing_shards
    cover(summary, planned_ids, results, planned=planned, missing_ids=known_missing)
    os.makedirs(out, exist_ok=True)

    with acquire(out) as lock:  # FolderLocked (nothing written) when a run writes there
        if lock.took_over:
            print(lock.note(), file=sys.stderr)
        reporters = open_report_dir(out)
        for rep in reporters:
            rep.start(plan)
        for r in results:
            for rep in reporters:
                rep.case_finished(r)
        for rep in reporters:
            rep.finish(summary)
    return summary


def _coverage(folders: list[Folder]):
    """What the folders' plan is and what they lack: (the plan's case ids in plan order, or None
    when not every id is known; the planned case count, or None; the missing case ids known;
    the missing shards "K/N")."""
    got = {r.case_id for f in folders for r in f.cases}
    known_missing = [c for f in folders for c in (f.plan.get("case_ids") or ()) if c not in got]
    if all(f.shard for f in folders):
        n = folders[0].shard[1]
        present = {f.shard[0]: f for f in folders}
        missing_shards = [f"{k}/{n}" for k in range(1, n + 1) if k not in present]
        whole = next((f.plan["plan_cases"] for f in folders if isinstance(f.plan.get("plan_cases"), int)), None)
        if whole is None and not missing_shards:  # older folders: the shards' own counts add up to it
            whole = sum(f.plan.get("cases", len(f.cases)) for f in folders)
        ids = None
        if not missing_shards and all(f.plan.get("case_ids") is not None for f in folders):
            # position p of the plan is shard p % n + 1's case p // n
            per = [present[k].plan["case_ids"] for k in range(1, n + 1)]
            total = sum(len(x) for x in per)
            if all(len(per[k - 1]) == plan_mod.shard_size(k, n, total) for k in range(1, n + 1)):
                ids = [per[p % n][p // n] for p in range(total)]
        return ids, whole, known_missing, missing_shards
    ids = folders[0].plan.get("case_ids")  # one plan: every folder records the same ids
    planned = len(ids) if ids is not None else folders[0].plan.get("cases")
    return ids, planned, known_missing, []


def _find_repro(path: str, folders: list[Folder]) -> str | None:
    if os.path.isfile(path):
        return path
    for f in folders:  # the folder moved between machines: look in its own repros/
        candidate = os.path.join(f.path, "repros", os.path.basename(path))
        if os.path.isfile(candidate):
            return candidate
    return None


def main(argv=None) -> int:
    """`python -m conformance merge DIR... --out DIR`; the exit status."""
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            self.exit(2, f"merge: error: {message}\n")

    ap = Parser(prog="python -m conformance merge",
                description="Merge the --report folders of a plan's shards into one report.")
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="report folders (e.g. of --shard 1/2 and --shard 2/2)")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the merged report")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        summary = merge(args.dirs, args.out)
    except ValueError as e:
        print(f"merge: error: {e}", file=sys.stderr)
        return 2
    print_table(summary, None)
    print(f"report: {args.out}/report.html, {args.out}/junit.xml, {args.out}/results.jsonl")
    return exit_status(summary)
