"""What the allowed set costs: refsim alone against refsim plus the bound walk, as `conformance.check` runs them.

    python -m bench.allowed_cost [--quick] [--passes 9] [--programs NAME,...] [--against DIR]
                                 [--markdown] [--json FILE] [--profile NAME]

The corpus: the four examples' training steps (`examples/*.py`, `train_step(*init())`), the
transformer training step of `scripts/gpu_oracle.py` in float32 and in bfloat16 (one device), and
a few drawn programs of the sharded generator (`conformance.strategies.sharded_programs`, seed
`SEED`, those with a float output that the walk bounds). Named with `--programs`, bench.model_step's
GPT steps too (`model_step_tiny`, `model_step_small`: above the walk's work limit, walked here with
the limit lifted). Each program is checked once with
`conformance.check`; that call's own arguments to refsim's evaluation
(`conformance.oracle.program.refsim_outputs`) and to the allowed set
(`conformance.oracle.policy.allowed_set`, which runs `conformance.verdict.allowed.build`) are
kept, and then, in equal interleaved passes, the bench times (a) refsim's evaluation alone and
(b) refsim's evaluation followed by the allowed set, exactly as the check runs them. The clock
is `time.process_time` (this process's CPU time: descheduling on a shared machine does not
count), BLAS on one thread (`REFSIM_BLAS_THREADS=1`). Reported per program and for the whole
corpus (the sum of the programs' times in each pass; with `--against`, of the programs both
checkouts drew alike): the median of the passes with their range, and (refsim + walk) / refsim,
the issue's cost figure (issue 39: at most 1.5x).

Each measurement runs in a child process that stays up for all passes (`--child`), driven pass
by pass over its stdin. `--against DIR` starts a second child on the checkout in DIR (e.g. `git
worktree add --detach DIR COMMIT`: its refsim, conformance, examples and scripts) and alternates
the two, pass by pass (A B, B A, ...), so load from other processes hits both alike; the table
then shows each side and the ratio of their walks. Each child also reports a digest of every
allowed set it built (centers, bounds, the bounds without relaxations where the verdict reads
them, the notes) and of each program's jaxpr: equal digests
mean the two checkouts give bit-identical verdict data (a drawn program differs where the two
checkouts' generators differ: the table says so instead). `--profile NAME` runs one program's walk
under cProfile in this process and prints the top entries instead.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEVICES = 8
PASSES = 9
SEED = 20261206
SHARDED = 4          # drawn sharded programs kept (those the walk bounds)
EXAMPLES = ("transformer_jit", "transformer_fsdp", "pipeline", "moe")
MODEL_SIZES = ("tiny", "small")   # bench.model_step's steps: measured only when named (--programs model_step_tiny)
QUICK = dict(passes=2, programs=("transformer_jit", "gpu_oracle_f32"))


# -- the child: the corpus, its capture and the timed passes (runs on one checkout's packages) -------------
def _configure():
    """Before JAX loads: 8 virtual CPU devices, BLAS on one thread."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={DEVICES}").strip()
    os.environ.setdefault("REFSIM_BLAS_THREADS", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _gpu_oracle(root: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_gpu_oracle", os.path.join(root, "scripts", "gpu_oracle.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def corpus(root: str, wanted=None):
    """(name, thunk calling conformance.check once) for every program of the corpus (module docstring)."""
    import importlib

    import conformance

    def keep(name):
        return wanted is None or any(name == w or name.startswith(w) for w in wanted)

    for name in EXAMPLES:
        if keep(name):
            mod = importlib.import_module(f"examples.{name}")
            yield name, lambda mod=mod: conformance.check(mod.train_step, *mod.init())
    go = None
    for dname, label in (("float32", "gpu_oracle_f32"), ("bfloat16", "gpu_oracle_bf16")):
        if keep(label):
            go = go or _gpu_oracle(root)
            import ml_dtypes
            import numpy as np

            dtype = np.float32 if dname == "float32" else ml_dtypes.bfloat16
            name, fn, args, kw = next(p for p in go.programs(dtype) if p[0] == "transformer_train_step")
            yield label, lambda fn=fn, args=args, kw=kw, name=name: conformance.check(fn, *args, name=name, **kw)
    if keep("sharded"):
        yield from _sharded(keep)
    for size in MODEL_SIZES:
        name = f"model_step_{size}"
        if wanted is not None and name in wanted:      # only when named: its walk is above the work limit
            yield name, lambda size=size: _model_step(size)


def _model_step(size):
    """bench.model_step's GPT step of `size`, checked with the walk's work limit lifted."""
    import conformance
    from bench import model_step
    from conformance.oracle import policy

    step, placed, _ = model_step.build(size)
    old = os.environ.get(policy.WORK_ENV)
    os.environ[policy.WORK_ENV] = "1e15"
    try:
        return conformance.check(step, *placed)
    finally:
        if old is None:
            os.environ.pop(policy.WORK_ENV)
        else:
            os.environ[policy.WORK_ENV] = old


def _sharded(keep):
    """Drawn sharded programs (jit with shardings), checked as a user would check them."""
    import conformance
    from conformance.strategies.sharded import CLASSES, sharded_programs
    from conformance.suites.base import draw
    from refsim import compat

    cases = draw(sharded_programs(max_devices=DEVICES, classes=CLASSES), 4 * SHARDED, SEED)
    for i, case in enumerate(cases):
        name = f"sharded_{i}"
        if not keep(name) or case.entry != "jit" or getattr(case, "donate_argnums", ()):
            continue

        def thunk(case=case):
            with compat.use_partitioner(case.partitioner):
                return conformance.check(case.fn, *case.args, in_shardings=case.in_shardings,
                                         out_shardings=case.out_shardings)
        yield name, thunk


class Captured:
    """One check's calls to refsim's evaluation and to the allowed set: replayed by the timed passes."""

    def __init__(self):
        self.refsim = None       # (traced, xla outputs)
        self.allowed = None      # (closed, flat_args, pols, mode)
        self.unlimited = False   # the walk's work limit lifted (bench.model_step's programs)

    def time_refsim(self):
        from conformance.oracle import program as prog

        traced, xla = self.refsim
        t = time.process_time()
        ref, _ = prog.refsim_outputs(traced, xla)
        return time.process_time() - t, ref

    def time_walk(self, ref):
        from conformance.oracle import policy

        closed, flat_args, pols, mode = self.allowed
        old = os.environ.get(policy.WORK_ENV)
        if self.unlimited:
            os.environ[policy.WORK_ENV] = "1e15"
        try:
            t = time.process_time()
            out = policy.allowed_set(closed, flat_args, ref, pols, mode)
            return time.process_time() - t, out
        finally:
            if self.unlimited:
                if old is None:
                    os.environ.pop(policy.WORK_ENV)
                else:
                    os.environ[policy.WORK_ENV] = old


def capture(thunk) -> Captured | None:
    """Run one check with its refsim evaluation and allowed-set calls recorded (None: no allowed set)."""
    import conformance
    from conformance.oracle import policy
    from conformance.oracle import program as prog

    cap = Captured()
    real_ref, real_allowed = prog.refsim_outputs, policy.allowed_set

    def ref_spy(traced, xla_outs, probe=None):
        cap.refsim = (traced, xla_outs)
        return real_ref(traced, xla_outs, probe=probe)

    def allowed_spy(closed, flat_args, ref, pols, policy_name="auto", platform="cpu"):
        cap.allowed = (closed, flat_args, list(pols), policy_name)
        return real_allowed(closed, flat_args, ref, pols, policy_name, platform)

    prog.refsim_outputs, policy.allowed_set = ref_spy, allowed_spy
    try:
        thunk()
    except conformance.ConformanceError:
        pass                      # a disagreement: the calls were made all the same
    finally:
        prog.refsim_outputs, policy.allowed_set = real_ref, real_allowed
    if cap.refsim is None or cap.allowed is None:
        return None
    return cap


def digest(out) -> str:
    """sha256 of everything the allowed set hands the verdict: per AllowedSet output, each device's
    center and bound, its bound without relaxations at the elements held to the allowed set (the
    only ones `allowed.verdicts` reads it at), and the notes (paths relative to the checkout)."""
    import numpy as np

    from conformance.verdict.allowed import AllowedSet

    pols, notes, _ = out
    h = hashlib.sha256()
    for k, p in enumerate(pols):
        if not isinstance(p, AllowedSet):
            h.update(f"{k}:{type(p).__name__}".encode())
            continue
        for field in (p.exact, p.abs_sum):
            for d in sorted(field):
                a = np.ascontiguousarray(np.asarray(field[d], np.float64))
                h.update(f"{k}:{d}:{a.shape}".encode())
                h.update(a.tobytes())
        for d in sorted(p.abs_sum):     # the bound without relaxations, where the verdict reads it
            g = p.governed(d)
            s = None if p.strict is None else p.strict.get(d)
            if s is None or not g.any():
                h.update(f"{k}:{d}:no strict".encode())
            else:
                h.update(np.ascontiguousarray(np.where(g, np.asarray(s, np.float64), 0.0)).tobytes())
        h.update(f"{k}:{p.relaxations}:{p.fallback_allowed!r}".encode())
    root = os.getcwd() + os.sep
    for n in notes:           # a note names source lines: by their path inside the checkout
        h.update(n.replace(root, "").encode())
    return h.hexdigest()[:16]


def child(wanted) -> int:
    """Set up the corpus, print one ready line, then one JSON line of timings per "pass" on stdin."""
    _configure()
    script = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != script]
    root = os.getcwd()
    sys.path.insert(0, root)
    from conformance.verdict.allowed import AllowedSet

    caps, info, sharded, programs = {}, {}, set(), {}
    for name, thunk in corpus(root, wanted):
        if name.startswith("sharded_") and len(sharded) >= SHARDED:
            break
        cap = capture(thunk)
        if cap is None:
            info[name] = "no allowed set"
            continue
        cap.unlimited = name.startswith("model_step_")
        _, ref = cap.time_refsim()              # one untimed round: caches, first-touch allocations
        _, out = cap.time_walk(ref)
        dg = digest(out)
        if not any(isinstance(p, AllowedSet) for p in out[0]) or (name.startswith("sharded_") and dg in sharded):
            info[name] = "no allowed set"       # nothing bounded (exact outputs), or a program drawn twice
            continue
        if name.startswith("sharded_"):
            sharded.add(dg)
        caps[name] = cap
        info[name] = dg
        programs[name] = hashlib.sha256(str(cap.allowed[0]).encode()).hexdigest()[:16]
    print(json.dumps({"ready": True, "digests": info, "programs": programs}), flush=True)
    for line in sys.stdin:
        if line.strip() != "pass":
            break
        rec = {}
        for name, cap in caps.items():
            t_a, _ = cap.time_refsim()           # (a) refsim
            t_r, ref = cap.time_refsim()         # (b) refsim, then the allowed set
            t_w, _ = cap.time_walk(ref)
            rec[name] = {"refsim": t_a, "with_walk": t_r + t_w, "walk": t_w}
        print(json.dumps(rec), flush=True)
    return 0


# -- the parent: children, interleaved passes, figures ---------------------------------------------------
class _Child:
    def __init__(self, label: str, checkout: str, wanted):
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        env["REFSIM_BLAS_THREADS"] = "1"
        env["PYTHONPATH"] = checkout + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, os.path.abspath(__file__), "--child"] + (["--programs", ",".join(wanted)] if wanted else [])
        self.label, self.checkout = label, checkout
        self.err = open(os.devnull, "w") if os.environ.get("BENCH_CHILD_STDERR") is None else None
        self.p = subprocess.Popen(cmd, cwd=checkout, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True)
        self.ready = self._read()
        self.passes: list = []

    def _read(self) -> dict:
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"the child on {self.checkout} ended without a result (exit {self.p.wait()}); "
                                   "rerun with BENCH_CHILD_STDERR=1 to see its error.")
            if line.startswith("{"):
                return json.loads(line)

    def one_pass(self) -> None:
        self.p.stdin.write("pass\n")
        self.p.stdin.flush()
        self.passes.append(self._read())

    def close(self) -> None:
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait(timeout=60)
        if self.err is not None:
            self.err.close()


def _summary(passes: list, names: list, together: list) -> dict:
    """Per program and for `together` ("all": each pass's sum over those programs): stats and ratio."""
    from bench import _common as C

    out = {}
    for name in names + ["all"]:
        pick = (lambda r: r[name]) if name != "all" else (lambda r: {
            k: sum(r[n][k] for n in together) for k in ("refsim", "with_walk", "walk")})
        rows = [pick(r) for r in passes]
        st = {k: C.stats([r[k] for r in rows]) for k in ("refsim", "with_walk", "walk")}
        ratios = [r["with_walk"] / r["refsim"] for r in rows if r["refsim"] > 0]
        st["ratio"] = st["with_walk"]["median"] / st["refsim"]["median"] if st["refsim"]["median"] > 0 else None
        st["ratio_range"] = [min(ratios), max(ratios)] if ratios else None
        out[name] = st
    return out


def run(passes: int, wanted=None, against: str | None = None) -> list[dict]:
    """One record per (checkout, program) and one per checkout for the whole corpus."""
    from bench import _common as C

    C.emit(C.machine())
    sides = [("this", ROOT)] + ([("against", os.path.abspath(against))] if against else [])
    children = [_Child(label, path, wanted) for label, path in sides]
    try:
        names = [n for n, d in children[0].ready["digests"].items() if d != "no allowed set"]
        for c in children[1:]:
            names = [n for n in names if c.ready["digests"].get(n, "no allowed set") != "no allowed set"]
        # "all" sums the programs every checkout drew alike (the sharded generator may differ between them)
        together = [n for n in names if len({c.ready["programs"][n] for c in children}) == 1]
        for i in range(passes):
            for c in (children if i % 2 == 0 else children[::-1]):
                c.one_pass()
    finally:
        for c in children:
            c.close()
    records = []
    for c in children:
        summ = _summary(c.passes, names, together)
        for name in names + ["all"]:
            rec = {"bench": "allowed_cost", "side": c.label, "checkout": C.git_commit(c.checkout), "program": name,
                   "passes": passes, **summ[name]}
            if name == "all":
                rec["programs"] = together
            if name != "all":
                rec["digest"] = c.ready["digests"][name]
                rec["jaxpr_digest"] = c.ready["programs"][name]
            records.append(rec)
            C.emit(rec)
    return records


HEADER = ("program", "refsim (CPU)", "refsim + walk (CPU)", "walk (CPU)", "(refsim + walk) / refsim")


def _rows(records: list[dict], side: str = "this"):
    from bench import _common as C

    def ratio(r):
        lo, hi = r["ratio_range"] or (None, None)
        return f"{r['ratio']:.2f}x" + (f" ({lo:.2f}–{hi:.2f})" if lo is not None and r["passes"] > 1 else "")

    for r in records:
        if r["side"] == side:
            yield (r["program"], C.fmt_stat(r["refsim"]), C.fmt_stat(r["with_walk"]), C.fmt_stat(r["walk"]), ratio(r))


def _against_rows(records: list[dict]):
    base = {r["program"]: r for r in records if r["side"] == "against"}
    for r in records:
        if r["side"] != "this" or r["program"] not in base:
            continue
        b = base[r["program"]]
        same = "" if r["program"] == "all" else (
            "other program drawn" if r.get("jaxpr_digest") != b.get("jaxpr_digest") else
            "yes" if r.get("digest") == b.get("digest") else "NO")
        yield (r["program"], f"{b['ratio']:.2f}x", f"{r['ratio']:.2f}x",
               f"{r['walk']['median'] / b['walk']['median']:.2f}" if b["walk"]["median"] > 0 else "-", same)


AGAINST_HEADER = ("program", "before: (refsim + walk) / refsim", "after", "walk after / before",
                  "identical allowed sets")


def show(records: list[dict]) -> None:
    from bench import _common as C

    n = records[0]["passes"]
    C.table(f"refsim alone and refsim + the allowed set's walk, CPU s, medians of {n} interleaved passes (range)",
            HEADER, _rows(records))
    if any(r["side"] == "against" for r in records):
        C.table("the same passes on the --against checkout", HEADER, _rows(records, "against"))
        C.table("before (--against) and after (this checkout)", AGAINST_HEADER, _against_rows(records))


def markdown(records: list[dict], machine: dict, command: str) -> str:
    """The docs block: how and where it was measured, then the tables."""
    m = machine
    lines = [f"`{command}` at commit `{m.get('commit')}`, {m.get('date')}, load average {m.get('load_average')}, "
             f"on {m.get('cpu')} ({m.get('cores')} cores, shared), Python {m.get('python')}, NumPy "
             f"{m.get('numpy')}, JAX {m.get('jax')}; CPU seconds (`time.process_time`), medians of "
             f"{records[0]['passes']} interleaved passes (range):", ""]
    sides = [("this", "")] + ([("against", " (the --against checkout)")]
                              if any(r["side"] == "against" for r in records) else [])
    for side, title in sides:
        if title:
            lines += ["", f"Before{title}, `{next(r['checkout'] for r in records if r['side'] == side)}`:", ""]
        lines += ["| " + " | ".join(HEADER) + " |", "|---|---:|---:|---:|---:|"]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in _rows(records, side)]
    if len(sides) > 1:
        lines += ["", "| " + " | ".join(AGAINST_HEADER) + " |", "|---|---:|---:|---:|---:|"]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in _against_rows(records)]
    return "\n".join(lines)


def profile(name: str, top: int = 30) -> None:
    """One program's allowed set under cProfile (this process, this checkout)."""
    import cProfile
    import pstats

    _configure()
    sys.path.insert(0, ROOT)
    for n, thunk in corpus(ROOT, [name]):
        cap = capture(thunk)
        if cap is None:
            print(f"{n}: no allowed set")
            continue
        cap.unlimited = n.startswith("model_step_")
        t_r, ref = cap.time_refsim()
        cap.time_walk(ref)
        pr = cProfile.Profile()
        t = time.process_time()
        pr.enable()
        cap.time_walk(ref)
        pr.disable()
        print(f"{n}: refsim {t_r:.3f} CPU-s, walk {time.process_time() - t:.3f} CPU-s (profiled)")
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(prog="python -m bench.allowed_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK['passes']} passes over {', '.join(QUICK['programs'])}")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1), default=None,
                    help=f"interleaved passes (default {PASSES})")
    ap.add_argument("--programs", default=None, help="comma-separated names or prefixes (default: the whole corpus)")
    ap.add_argument("--against", metavar="DIR", help="also time the checkout in DIR, interleaved (before / after)")
    ap.add_argument("--markdown", action="store_true", help="also print the docs block of this run")
    ap.add_argument("--json", metavar="FILE", help="also append every JSON line to FILE")
    ap.add_argument("--profile", metavar="NAME", help="profile one program's walk (cProfile) instead")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    wanted = tuple(w for w in args.programs.split(",") if w) if args.programs else None
    if args.child:
        return child(wanted)
    if args.profile:
        profile(args.profile)
        return 0
    if args.against and not os.path.isdir(os.path.join(args.against, "refsim", "bounds")):
        raise SystemExit(f"--against {args.against!r} is not a checkout with refsim/bounds; create one with "
                         "`git worktree add --detach DIR COMMIT`.")
    passes = args.passes or (QUICK["passes"] if args.quick else PASSES)
    if args.quick and wanted is None:
        wanted = QUICK["programs"]
    from bench import _common as C

    C.open_json(args.json)
    try:
        recs = run(passes, wanted, args.against)
    finally:
        C.close_json()
    show(recs)
    if args.markdown:
        cmd = "python -m bench.allowed_cost" + (f" --passes {passes}" if passes != PASSES else "") + (
            f" --programs {args.programs}" if args.programs else "") + (" --against DIR" if args.against else "")
        print(markdown(recs, C.machine(), cmd))
    return recs


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
