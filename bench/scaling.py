"""Scaling: the five-collective program from 8 to 65536 virtual devices, refsim against XLA:CPU.

The program (ring ppermute, tiled all_to_all, tiled psum_scatter, tiled all_gather, psum)
runs over a 2-D mesh ('x', 'y') on one float32 array of 4 or 64 MiB laid out P('x', 'y');
every intermediate holds at most the array's bytes over all devices. Each
(engine, devices, size) runs in its own process, so its peak RSS is its own, and XLA gets
``--xla_force_host_platform_device_count=devices`` and a timeout (XLA:CPU refuses more
than 2048 devices in one process and can hang on large all_to_all).

Each timed call reads its result back with `np.asarray` (the global value on the host).
refsim: NumPy in, `refsim.shard_map` (its trace cached after the first call), `np.asarray`
of the refsim.Array out. XLA: the compiled executable on device-resident input, and
`np.asarray` of its output. Both engines get the same number of repeated calls; the
figure is their median, with the spread; the first call (refsim: with tracing; XLA: after
compiling) is reported apart. Peak RSS is counted above the process's RSS just before the
first call (imports, backend, input).

The "overhead" program (`--program tiny`) is a ring ppermute and a psum over one float32
element per device: what a cached call costs apart from moving data.

    python -m bench.scaling [--quick] [--devices 8 64 ...] [--mib 4 64] [--timeout 300] [--program five|tiny]
    python -m bench.scaling --against DIR [DIR ...] --devices 65536 --mib 64 [--passes 5]

`--against` times refsim alone: for each pass, one child process per checkout (each DIR, e.g. a
`git worktree add --detach DIR COMMIT`, then this checkout), interleaved, each running this file's
child code with the checkout's own `refsim` and `xla_backend` first on its path. A child reports
the median of its repeated calls by the process's CPU time and by the wall clock; the table gives
the medians over passes, their range, and each checkout's ratio to this one.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np

from bench import _common as C

DEVICES = (8, 64, 256, 1024, 4096, 16384, 65536)
# XLA:CPU's all_to_all rendezvous never completes at 1024 devices and it refuses more than 2048
# in one process (both recorded in docs/performance.md); measuring them again costs minutes.
XLA_DEVICES = (8, 64, 256)
TINY_DEVICES = (8, 64, 256, 1024, 4096, 16384, 65536)
SIZES_MIB = (4, 64)
QUICK = dict(devices=(8, 64), mib=(1,), repeat=2, timeout=120)
REPEAT = 5


def layout(devices: int, mib: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """(mesh shape (X, Y), global array shape) for `devices` and `mib` MiB of float32.

    Y is the largest power of two <= sqrt(devices) that each device's block can be split
    into (all_to_all and psum_scatter run over 'y'); the local block is (r, c) with r a
    multiple of Y, so every tiled collective divides evenly.
    """
    if devices < 1 or devices & (devices - 1):
        raise ValueError(f"devices={devices} must be a power of two (the mesh is X x Y, powers of two).")
    elements = int(mib * 2**20) // 4
    local = elements // devices
    if local < 1 or local & (local - 1) or local * devices != elements:
        raise ValueError(f"mib={mib} gives {elements} float32 elements, not a power-of-two multiple of "
                         f"devices={devices}; pass a power-of-two size of at least {devices * 4} bytes.")
    y = 2 ** (int(math.log2(devices)) // 2)
    while y > local:
        y //= 2
    x = devices // y
    r = max(y, 2 ** (int(math.log2(local)) // 2))
    return (x, y), (x * r, y * (local // r))


def program(x_size: int):
    """The benchmarked function, for a mesh whose 'x' axis has `x_size` devices."""
    from jax import lax

    ring = [(j, (j + 1) % x_size) for j in range(x_size)]

    def five_collectives(a):
        b = lax.ppermute(a, "x", ring)                                 # (r, c)
        t = lax.all_to_all(b, "y", 0, 1, tiled=True)                   # (r/Y, c*Y)
        s = lax.psum_scatter(t, "y", scatter_dimension=1, tiled=True)  # (r/Y, c)
        g = lax.all_gather(s, "y", axis=0, tiled=True)                 # (r, c)
        return lax.psum(g, "x")                                        # (r, c), invariant over x

    return five_collectives


def tiny_layout(devices: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(mesh shape, global shape) of the overhead program: one element per device on X x Y."""
    if devices < 1 or devices & (devices - 1):
        raise ValueError(f"devices={devices} must be a power of two (the mesh is X x Y, powers of two).")
    y = 2 ** (int(math.log2(devices)) // 2)
    return (devices // y, y), (devices // y, y)


def tiny_program(x_size: int):
    """A ring ppermute over x and a psum over x on one element per device."""
    from jax import lax

    ring = [(j, (j + 1) % x_size) for j in range(x_size)]

    def ppermute_psum(a):
        return lax.psum(lax.ppermute(a, "x", ring), "x")

    return ppermute_psum


def tiny_expected(a: np.ndarray) -> np.ndarray:
    """Every device of column j ends with the sum of column j (the ring only reorders x)."""
    return a.sum(axis=0, keepdims=True, dtype=np.float64).astype(np.float32)


def _setup(program_name: str, devices: int, mib: float):
    """(mesh shape, global shape, fn of x_size, expected(a, mesh_shape), out spec names)."""
    if program_name == "tiny":
        mesh_shape, shape = tiny_layout(devices)
        return mesh_shape, shape, tiny_program, lambda a, ms: tiny_expected(a)
    mesh_shape, shape = layout(devices, mib)
    return mesh_shape, shape, program, expected


def make_input(shape) -> np.ndarray:
    """Small integers (0..6): every sum is exact in float32 in any order."""
    a = np.empty(shape, np.float32)
    a.reshape(-1)[:] = np.arange(a.size, dtype=np.int32) % 7
    return a


def expected(a: np.ndarray, mesh_shape) -> np.ndarray:
    """The program's global output (out_specs P(None, 'y')), computed directly with NumPy.

    Device (i, j) holds block A[i, j] (r x c). The ring ppermute moves blocks along x, which
    the final psum over x undoes. all_to_all over y gives device k row-chunk k of every
    block of its x row, side by side; psum_scatter + all_gather over y then leave every
    device with rows [sum_k chunk k of block (., j')] for j' = 0..Y-1, summed over x.
    Every device holds that (r, c) value, so the global output tiles it Y times.
    """
    x, y = mesh_shape
    r, c = a.shape[0] // x, a.shape[1] // y
    per_col = a.reshape(x, r, y, c).sum(axis=0, dtype=np.float64)       # (r, j', c), over x
    chunks = per_col.reshape(y, r // y, y, c).sum(axis=0)               # (r/Y, j', c), over k
    value = chunks.transpose(1, 0, 2).reshape(r, c)                     # row block j' = chunk sum of j'
    return np.tile(value, (1, y)).astype(np.float32)


# -- child processes: one (engine, devices, size) each ----------------------------------------

def _timed_calls(call, repeat: int, cpu: list | None = None) -> tuple[float, dict]:
    """(first call's seconds, stats of `repeat` further calls); each call reads its result back.
    `cpu`, a list: each repeated call's process CPU seconds are appended to it."""
    t0 = time.perf_counter()
    out = call()
    first = time.perf_counter() - t0
    del out
    times = []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
        del out
    return first, C.stats(times)


def _child_refsim(devices: int, mib: float, repeat: int, program_name: str = "five") -> dict:
    from xla_backend import platform

    platform.configure("cpu", 1)
    import refsim
    from refsim import Mesh, P

    mesh_shape, shape, prog, want = _setup(program_name, devices, mib)
    a = make_input(shape)
    fn = refsim.shard_map(prog(mesh_shape[0]), mesh=Mesh(mesh_shape, ("x", "y")),
                          in_specs=P("x", "y"), out_specs=P(None, "y"))
    base = C.current_rss()
    C.reset_peak_rss()
    cpu: list = []
    first, st = _timed_calls(lambda: np.asarray(fn(a)), repeat, cpu)
    peak = C.peak_rss() - base
    ok = bool(np.array_equal(np.asarray(fn(a)), want(a, mesh_shape)))
    return dict(first_s=first, seconds=st["median"], timing=st, cpu_seconds=C.stats(cpu)["median"],
                rss_above_baseline=peak, baseline_rss=base, data_bytes=a.nbytes, correct=ok)


def _child_xla(devices: int, mib: float, repeat: int, program_name: str = "five") -> dict:
    from xla_backend import platform

    platform.configure("cpu", devices)
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh_shape, shape, prog, want = _setup(program_name, devices, mib)
    a = make_input(shape)
    mesh = Mesh(np.asarray(platform.require(devices)[:devices]).reshape(mesh_shape), ("x", "y"))
    f = jax.jit(jax.shard_map(prog(mesh_shape[0]), mesh=mesh, in_specs=P("x", "y"),
                              out_specs=P(None, "y")))
    base = C.current_rss()
    C.reset_peak_rss()
    t0 = time.perf_counter()
    arg = jax.device_put(a, NamedSharding(mesh, P("x", "y")))
    exe = f.lower(arg).compile()
    compile_s = time.perf_counter() - t0
    first, st = _timed_calls(lambda: np.asarray(exe(arg)), repeat)
    peak = C.peak_rss() - base
    ok = bool(np.array_equal(np.asarray(exe(arg)), want(a, mesh_shape)))
    return dict(compile_s=compile_s, first_s=first, seconds=st["median"], timing=st, rss_above_baseline=peak,
                baseline_rss=base, data_bytes=a.nbytes, correct=ok)


def _reason(text: str) -> str:
    """The line of a crashed child's output that says why: an exception, or XLA's fatal log
    line (without its glog prefix and the long device lists)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in (re.compile(r"^\w+(\.\w+)*(Error|Exception): "), re.compile(r"^F\d{4} |Check failed|FATAL")):
        found = [ln for ln in lines if pattern.search(ln)]
        if found:
            line = re.sub(r"^[FE]\d{4} [\d:.]+\s+\d+ \S+\] (\[id=\d+\] )?", "", found[-1])
            return re.sub(r"\{[^{}]*\}", "{...}", line)[:200]
    return lines[-1][:200] if lines else "no output"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_child(engine: str, devices: int, mib: float, repeat: int, timeout: float, program_name: str = "five",
               checkout: str | None = None) -> dict:
    """Run one measurement in a fresh interpreter; a timeout or crash becomes `status`.
    `checkout`: run this file's child code on that checkout's packages (its folder first on the
    path; the script runs by its file name, so `bench` too is the checkout's)."""
    args = ["--child", engine, "--devices", str(devices), "--mib", str(mib), "--repeat", str(repeat),
            "--program", program_name]
    cmd = [sys.executable, *(["-m", "bench.scaling"] if checkout is None else [os.path.abspath(__file__)]), *args]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the child configures its own device count
    root = ROOT if checkout is None else os.path.abspath(checkout)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    mesh_shape = tiny_layout(devices)[0] if program_name == "tiny" else layout(devices, mib)[0]
    rec = dict(bench="overhead" if program_name == "tiny" else "scaling", engine=engine, devices=devices,
               mib=mib, mesh=list(mesh_shape))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return dict(rec, status="timeout", reason=f"no result within {timeout:g} s (killed)")
    rec["process_s"] = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return dict(rec, status="failed", reason=f"exit {p.returncode}: {_reason(p.stderr or p.stdout)}")
    return dict(rec, status="ok", **json.loads(lines[-1]))


def run(quick: bool = False, devices=None, mibs=None, repeat: int | None = None,
        timeout: float | None = None, program_name: str = "five", xla_devices=None) -> list[dict]:
    """Measure every (size, devices) on refsim and, for `xla_devices` (default XLA_DEVICES), on
    XLA; one record each. `program_name="tiny"`: the overhead program (sizes ignored)."""
    devices = tuple(devices or (QUICK["devices"] if quick else (TINY_DEVICES if program_name == "tiny" else DEVICES)))
    mibs = (0,) if program_name == "tiny" else tuple(mibs or (QUICK["mib"] if quick else SIZES_MIB))
    repeat = repeat or (QUICK["repeat"] if quick else REPEAT)
    timeout = timeout or (QUICK["timeout"] if quick else 300)
    xla_devices = tuple(XLA_DEVICES if xla_devices is None else xla_devices)
    out = []
    for mib in mibs:
        for n in devices:
            rs = _run_child("refsim", n, mib, repeat, timeout, program_name)
            C.emit(rs)
            out.append(rs)
            if n in xla_devices:
                xs = _run_child("xla", n, mib, repeat, timeout, program_name)
                if rs.get("status") == "ok" and xs.get("status") == "ok":
                    xs["ratio_xla_over_refsim"] = xs["seconds"] / rs["seconds"]
                C.emit(xs)
                out.append(xs)
    return out


def against(checkouts, devices, mibs, repeat: int | None = None, passes: int = 5, timeout: float | None = None,
            program_name: str = "five") -> list[dict]:
    """refsim's repeated call in each checkout and in this one, `passes` interleaved child processes
    each: one record per (checkout, size, devices) with the medians over passes and the ratio to
    this checkout (CPU and wall)."""
    repeat, timeout = repeat or REPEAT, timeout or 300
    sides = [("this", None)] + [(os.path.abspath(d), os.path.abspath(d)) for d in checkouts]
    for _name, d in sides[1:]:
        if not os.path.isdir(os.path.join(d, "refsim")):
            raise ValueError(f"--against {d!r} is not a checkout with a refsim/ package; create one with "
                             "`git worktree add --detach DIR COMMIT`.")
    out = []
    for mib in ((0,) if program_name == "tiny" else tuple(mibs)):
        for n in devices:
            runs: dict = {name: [] for name, _ in sides}
            loads = [round(os.getloadavg()[0], 2)]
            for _ in range(passes):
                for name, d in sides[1:] + sides[:1]:   # the baselines first in each pass
                    r = _run_child("refsim", n, mib, repeat, timeout, program_name, checkout=d)
                    if r.get("status") != "ok":
                        raise RuntimeError(f"refsim child of {name} at {n} devices, {mib} MiB: {r.get('reason')}")
                    runs[name].append(r)
            loads.append(round(os.getloadavg()[0], 2))
            this = runs["this"]
            med = lambda rs, k: C.stats([r[k] for r in rs])  # noqa: E731
            for name, d in sides:
                cpu, wall = med(runs[name], "cpu_seconds"), med(runs[name], "seconds")
                rec = dict(bench="scaling_against", checkout=C.git_commit(d or ROOT), devices=n, mib=mib,
                           passes=passes, repeat=repeat, cpu=cpu, wall=wall, load_average=loads,
                           cpu_ratio_to_this=cpu["median"] / med(this, "cpu_seconds")["median"],
                           wall_ratio_to_this=wall["median"] / med(this, "seconds")["median"],
                           correct=all(r["correct"] for r in runs[name]))
                C.emit(rec)
                out.append(rec)
    return out


def show_against(records: list[dict]) -> None:
    rows = [(r["checkout"], r["devices"], f"{r['mib']:g} MiB", C.fmt_stat(r["cpu"]), C.fmt_stat(r["wall"]),
             f"{1 / r['cpu_ratio_to_this']:.2f}x", f"{1 / r['wall_ratio_to_this']:.2f}x",
             "yes" if r["correct"] else "NO", " -> ".join(map(str, r["load_average"]))) for r in records]
    C.table("refsim's repeated call, interleaved child processes (medians over passes of each child's median)",
            ["checkout", "devices", "size", "CPU per call", "wall per call", "this / it (CPU)", "this / it (wall)",
             "correct", "load"], rows)


def show(records: list[dict]) -> None:
    tiny = bool(records) and records[0].get("bench") == "overhead"
    by = {(r["mib"], r["devices"], r["engine"]): r for r in records}
    rows, notes = [], []
    for mib, n in dict.fromkeys((r["mib"], r["devices"]) for r in records):
        rs, xs = by.get((mib, n, "refsim"), {}), by.get((mib, n, "xla"), {})

        def cell(r, f):
            if not r:
                return "not run"
            if r["status"] == "ok":
                return f(r)
            text = f"{r['engine']} at {r['devices']} devices, {r['mib']} MiB: {r['status']}, {r['reason']}"
            if text not in notes:
                notes.append(text)
            return f"{r['status']} [{notes.index(text) + 1}]"

        def mem(r):
            if tiny:  # a few bytes of data: the ratio would say nothing
                return C.fmt_bytes(r["rss_above_baseline"])
            return f"{C.fmt_bytes(r['rss_above_baseline'])} = {r['rss_above_baseline'] / r['data_bytes']:.1f}x"

        rows.append((("-" if tiny else f"{mib:g} MiB"), n, "x".join(map(str, rs.get("mesh", xs.get("mesh", [])))),
                     cell(rs, lambda r: C.fmt_stat(r["timing"])), cell(rs, lambda r: C.fmt_seconds(r["first_s"])),
                     cell(rs, mem), cell(xs, lambda r: C.fmt_stat(r["timing"])),
                     cell(xs, lambda r: C.fmt_seconds(r["first_s"])), cell(xs, mem),
                     C.fmt_ratio(xs.get("ratio_xla_over_refsim"))))
    title = ("overhead: ring ppermute + psum on one element per device, result read back" if tiny else
             "scaling: ppermute + all_to_all + psum_scatter + all_gather + psum, result read back")
    C.table(title, ["size", "devices", "mesh", "refsim call (median)", "refsim first", "refsim peak RSS / data",
                    "XLA call (median)", "XLA first", "XLA peak RSS / data", "XLA/refsim"], rows)
    for i, text in enumerate(notes, 1):
        print(f"[{i}] {text}")


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 and 64 devices on 1 MiB")
    ap.add_argument("--devices", type=validation.option("--devices", integer=True, low=1), nargs="+")
    ap.add_argument("--mib", type=validation.option("--mib", low=0), nargs="+")
    ap.add_argument("--repeat", type=validation.option("--repeat", integer=True, low=1))
    ap.add_argument("--timeout", type=validation.seconds_option("--timeout"),
                    help="seconds per child process (default 300)")
    ap.add_argument("--program", choices=("five", "tiny"), default="five",
                    help="five collectives on --mib MiB (default), or the overhead program (one element per device)")
    ap.add_argument("--xla-devices", type=validation.option("--xla-devices", integer=True, low=1),
                    nargs="*", help=f"device counts XLA runs at (default {XLA_DEVICES})")
    ap.add_argument("--against", metavar="DIR", nargs="+",
                    help="refsim alone, side by side with these checkouts (interleaved child processes)")
    ap.add_argument("--passes", type=validation.option("--passes", integer=True, low=1), default=5,
                    help="--against: child processes per checkout and size (default 5)")
    ap.add_argument("--child", choices=("refsim", "xla"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        fn = _child_refsim if args.child == "refsim" else _child_xla
        res = fn(args.devices[0], args.mib[0], args.repeat or REPEAT, args.program)
        print(json.dumps(res))
        return res
    if args.against:
        records = against(args.against, args.devices or (65536,), args.mib or (64,), args.repeat, args.passes,
                          args.timeout, args.program)
        show_against(records)
        return records
    records = run(args.quick, args.devices, args.mib, args.repeat, args.timeout, args.program, args.xla_devices)
    show(records)
    return records


if __name__ == "__main__":
    main()
