"""A GPT-style training step, plain and under `conformance.check`: what the oracle costs at model scale.

    python -m bench.model_step [--quick] [--sizes tiny,small,medium] [--passes 3] [--repeats 3]
                               [--against DIR] [--profile SIZE] [--json FILE]

The step (`step`): token + position embedding, pre-LN decoder blocks (causal softmax
attention, GELU(tanh) MLP), a final LayerNorm, logits tied to the embedding, mean
cross-entropy, `jax.value_and_grad` and an SGD update; under `jax.jit` with NamedSharding on a
2x4 mesh of 8 virtual CPU devices ('data' x 'model': the batch split over 'data', attention and
MLP weights Megatron-style over 'model'). Sizes:

| size | d | layers | heads | seq | batch | vocab | params |
|---|---|---|---|---|---|---|---|
| tiny | 64 | 2 | 4 | 32 | 8 | 256 | 0.12 M |
| small | 256 | 4 | 8 | 128 | 8 | 2048 | 3.7 M |
| medium | 512 | 6 | 8 | 256 | 8 | 4096 | 21 M |

Each figure is one fresh process (`--child`), the two sides interleaved (plain, check, plain,
check, ... `--passes` times per size): `plain` times the jitted step's first call (trace +
compile + run) and then `--repeats` calls; `check` times `conformance.check(step, ...)`'s first
call and `--repeats` more. Both read the process's CPU time (`time.process_time`: all its
threads, XLA's and BLAS's included, with any child process's) and the wall clock; a call ends when its results are ready.
Reported: medians over the processes (each process's repeated-call figure is the median of its
repeats) with their range, the ratio check / plain, and the 1-minute load average when each
size started and ended. `--against DIR` adds a third process per pass, `check` with the project
(conformance, refsim) of the checkout in DIR (e.g. `git archive` of an older commit), interleaved
with the other two: a before / after of the check's cost. The scaling line fits check's repeated-call CPU against the parameter
count (log-log slope). `--profile SIZE` runs one check process under cProfile and prints the
top entries (cumulative and own time) instead.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEVICES = 8
SIZES = {  # name: (d, layers, heads, seq, batch, vocab)
    "tiny": (64, 2, 4, 32, 8, 256),
    "small": (256, 4, 8, 128, 8, 2048),
    "medium": (512, 6, 8, 256, 8, 4096),
}
MODES = ("plain", "check")
PASSES, REPEATS = 3, 3
QUICK = dict(sizes=("tiny",), passes=1, repeats=1)


# -- the model (imports JAX: only in the child) --------------------------------------------------------
def build(size: str):
    """(jitted step, params, tokens, targets, parameter count) for `size`, placed on the 2x4 mesh."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    d, layers, heads, seq, batch, vocab = SIZES[size]
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:DEVICES],
                         axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)

    def w(*shape, scale=None):
        return (rng.normal(size=shape) * (scale or 1 / math.sqrt(shape[0]))).astype(np.float32)

    col, row, rep = P(None, "model"), P("model", None), P()
    params, specs = {"wte": w(vocab, d, scale=0.02), "wpe": w(seq, d, scale=0.01),
                     "lnf_g": np.ones(d, np.float32), "lnf_b": np.zeros(d, np.float32)}, \
        {"wte": rep, "wpe": rep, "lnf_g": rep, "lnf_b": rep}
    for i in range(layers):
        layer = {"ln1_g": np.ones(d, np.float32), "ln1_b": np.zeros(d, np.float32), "qkv": w(d, 3 * d),
                 "proj": w(d, d), "ln2_g": np.ones(d, np.float32), "ln2_b": np.zeros(d, np.float32),
                 "fc": w(d, 4 * d), "fc_out": w(4 * d, d)}
        params[f"h{i}"] = layer
        specs[f"h{i}"] = {"ln1_g": rep, "ln1_b": rep, "qkv": col, "proj": row, "ln2_g": rep, "ln2_b": rep,
                          "fc": col, "fc_out": row}

    def layer_norm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def attention(x, p):
        bsz, t, _ = x.shape
        q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
        split = lambda a: a.reshape(bsz, t, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d // heads)
        causal = jnp.tril(jnp.ones((t, t), bool))
        att = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        return (att @ v).transpose(0, 2, 1, 3).reshape(bsz, t, d) @ p["proj"]

    def loss_fn(p, tokens, targets):
        x = p["wte"][tokens] + p["wpe"][None, :tokens.shape[1]]
        for i in range(layers):
            h = p[f"h{i}"]
            x = x + attention(layer_norm(x, h["ln1_g"], h["ln1_b"]), h)
            x = x + jax.nn.gelu(layer_norm(x, h["ln2_g"], h["ln2_b"]) @ h["fc"], approximate=True) @ h["fc_out"]
        logits = layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["wte"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    def step(p, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens, targets)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

    shard = lambda s: NamedSharding(mesh, s)  # noqa: E731
    pshard = jax.tree.map(shard, specs)
    data = shard(P("data", None))
    jitted = jax.jit(step, in_shardings=(pshard, data, data), out_shardings=(pshard, shard(rep)))
    tokens = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    placed = (jax.device_put(params, pshard), jax.device_put(tokens, data), jax.device_put(targets, data))
    count = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
    return jitted, placed, count


def _child(size: str, mode: str, repeats: int, profile: bool) -> None:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}")
    # JAX reads XLA_FLAGS when it loads: imported only now
    import jax

    import conformance

    jitted, args, count = build(size)

    def call():
        if mode == "plain":
            jax.block_until_ready(jitted(*args))
            return None
        res = conformance.check(jitted, *args)
        assert res.ok, res.report()
        return res

    if profile:
        import cProfile
        import pstats

        call()
        prof = cProfile.Profile(time.process_time)  # CPU seconds: a busy machine does not inflate them
        prof.enable()
        call()
        prof.disable()
        st = pstats.Stats(prof, stream=sys.stderr)
        st.sort_stats("cumulative").print_stats(45)
        st.sort_stats("tottime").print_stats(35)
        return
    def cpu():  # this process's CPU seconds, all threads, and any child process's it waited for
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + kids.ru_utime + kids.ru_stime

    times = []
    for _ in range(1 + repeats):
        c, t = cpu(), time.perf_counter()
        res = call()
        times.append((cpu() - c, time.perf_counter() - t,
                      dict(res.seconds) if res is not None and isinstance(getattr(res, "seconds", None), dict) else {}))
    print(json.dumps({"size": size, "mode": mode, "params": count, "first_cpu": times[0][0], "first_wall": times[0][1],
                      "cpu": [t[0] for t in times[1:]], "wall": [t[1] for t in times[1:]],
                      "phases": [t[2] for t in times[1:]]}), flush=True)


def _run_child(size: str, mode: str, repeats: int, checkout: str = ROOT) -> dict:
    """One fresh process: this file's step, the project (conformance, refsim) from `checkout`."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", size, mode, "--repeats", str(repeats)]
    env = dict(os.environ, PYTHONPATH=checkout + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=checkout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.model_step child ({size}, {mode}, {checkout}) failed:\n{proc.stderr[-3000:]}")
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run(quick: bool = False, sizes=None, passes: int | None = None, repeats: int | None = None,
        against: str | None = None) -> list[dict]:
    """One record per size: plain and check, first and repeated call, CPU and wall (and `check` on the
    checkout in `against`, interleaved with them, as ``baseline``); then the scaling line."""
    import statistics

    from bench import _common as C

    sizes = tuple(sizes or (QUICK["sizes"] if quick else SIZES))
    passes = passes or (QUICK["passes"] if quick else PASSES)
    repeats = repeats or (QUICK["repeats"] if quick else REPEATS)
    records = []
    for size in sizes:
        load0 = _load()
        sides = [(m, m, ROOT) for m in MODES] + ([("baseline", "check", os.path.abspath(against))] if against else [])
        runs = {label: [] for label, _, _ in sides}
        for _ in range(passes):          # plain, check, plain, check, ...: load hits both alike
            for label, mode, checkout in sides:
                runs[label].append(_run_child(size, mode, repeats, checkout))
        rec = dict(bench="model_step", size=size, params=runs["plain"][0]["params"], devices=DEVICES, mesh="2x4",
                   passes=passes, repeats=repeats, load_average=[load0, _load()], commit=C.git_commit(ROOT))
        if against:
            rec["baseline_commit"] = C.git_commit(against)
            if rec["baseline_commit"] == "unknown":   # an exported tree (git archive): named by its folder
                rec["baseline_commit"] = os.path.basename(os.path.abspath(against).rstrip(os.sep))
        for mode in runs:
            rs = runs[mode]
            rec[mode] = {"first_cpu": C.stats([r["first_cpu"] for r in rs]),
                         "first_wall": C.stats([r["first_wall"] for r in rs]),
                         "cpu": C.stats([statistics.median(r["cpu"]) for r in rs]),
                         "wall": C.stats([statistics.median(r["wall"]) for r in rs])}
        phases = [p for r in runs["check"] for p in r["phases"]]
        keys = list(dict.fromkeys(k for p in phases for k in p if isinstance(p.get(k), (int, float))))
        rec["check_phases"] = {k: statistics.median([p.get(k, 0.0) for p in phases]) for k in keys}
        for key in ("first_cpu", "first_wall", "cpu", "wall"):
            p = rec["plain"][key]["median"]
            rec[f"ratio_{key}"] = rec["check"][key]["median"] / p if p > 0 else None
            if against:
                rec[f"baseline_ratio_{key}"] = rec["baseline"][key]["median"] / p if p > 0 else None
        C.emit(rec)
        records.append(rec)
    if len(records) >= 2:
        xs = [math.log(r["params"]) for r in records]
        ys = [math.log(r["check"]["cpu"]["median"]) for r in records]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        line = dict(bench="model_step_scaling", sizes=[r["size"] for r in records], params=[r["params"] for r in records],
                    check_cpu=[r["check"]["cpu"]["median"] for r in records],
                    check_cpu_per_mparam=[r["check"]["cpu"]["median"] / (r["params"] / 1e6) for r in records],
                    plain_cpu=[r["plain"]["cpu"]["median"] for r in records], loglog_slope=slope)
        C.emit(line)
        records.append(line)
    return records


def show(records: list[dict]) -> None:
    from bench import _common as C

    rows = []
    for r in records:
        if r.get("bench") != "model_step":
            continue
        for kind, first in (("repeated call", False), ("first call", True)):
            cpu, wall = ("first_cpu", "first_wall") if first else ("cpu", "wall")
            base = ((C.fmt_stat(r["baseline"][cpu]), f"{r[f'baseline_ratio_{cpu}']:.1f}x") if "baseline" in r
                    else ("-", "-"))
            rows.append((r["size"], f"{r['params'] / 1e6:.2f} M", kind, C.fmt_stat(r["plain"][cpu]),
                         C.fmt_stat(r["check"][cpu]), f"{r[f'ratio_{cpu}']:.1f}x", *base, C.fmt_stat(r["plain"][wall]),
                         C.fmt_stat(r["check"][wall]), f"{r[f'ratio_{wall}']:.1f}x",
                         " / ".join("-" if x is None else f"{x:g}" for x in r["load_average"])))
    C.table("GPT-style step on a 2x4 mesh of 8 CPU devices: jitted step vs conformance.check (fresh processes)",
            ["size", "params", "call", "plain CPU", "check CPU", "ratio", "baseline check CPU", "ratio",
             "plain wall", "check wall", "ratio", "load (start / end)"], rows)
    for r in records:
        if r.get("bench") == "model_step_scaling":
            print("scaling: check CPU per repeated call " + ", ".join(
                f"{s} {C.fmt_seconds(c)} ({c / (p / 1e6):.3g} s per M params)"
                for s, p, c in zip(r["sizes"], r["params"], r["check_cpu"]))
                + f"; log-log slope against parameter count {r['loglog_slope']:.2f}")


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(prog="python -m bench.model_step", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny only, one pass, one repeat: checks the code paths")
    ap.add_argument("--sizes", help=f"comma-separated subset of {','.join(SIZES)}")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1))
    ap.add_argument("--repeats", type=validation.option("--repeats", integer=True, low=1))
    ap.add_argument("--profile", metavar="SIZE", choices=tuple(SIZES), help="cProfile one repeated check call")
    ap.add_argument("--against", metavar="DIR", help="also run check on the checkout in DIR (its conformance/refsim)")
    ap.add_argument("--json", metavar="FILE", help="also append every JSON line to FILE")
    ap.add_argument("--child", nargs=2, metavar=("SIZE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",")] if args.sizes else None
    bad = [s for s in sizes or () if s not in SIZES]
    if bad:
        ap.error(f"--sizes={args.sizes!r}: unknown size(s) {bad}; choose from {','.join(SIZES)}.")
    if args.child:
        size, mode = args.child
        _child(size, mode, args.repeats or REPEATS, profile=False)
        return []
    if args.profile:
        _child(args.profile, "check", 1, profile=True)
        return []
    from bench import _common as C

    C.open_json(args.json)
    try:
        if args.json:
            C.emit(C.machine())
        recs = run(args.quick, sizes, args.passes, args.repeats, args.against)
    finally:
        C.close_json()
    show(recs)
    return recs


if __name__ == "__main__":
    # the child runs by path, its conformance/refsim from its checkout's PYTHONPATH
    main()
