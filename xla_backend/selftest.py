"""`python -m xla_backend selftest`: collectives across all processes, checked per device.

Runs psum, all_gather, all_to_all, ppermute (jit(shard_map) over a 1-D mesh of every
device of every process) and a reshard onto a 2-D mesh in reversed device order.
Each process checks its own addressable shards, then gathers every process's shards
and checks all of them, against expected blocks computed per device by plain
NumPy loops from the collectives' documented semantics. Writes a JSON report; the
exit status is 0 only when every check passed.
"""
from __future__ import annotations

import json
import sys
import traceback

import numpy as np


def _expected_blocks(name, x, n):
    """{mesh position: expected block} for device at position k of the 1-D mesh of n."""
    rows = x.shape[0] // n
    blk = [x[k * rows:(k + 1) * rows] for k in range(n)]
    if name == "psum":  # every device: sum of all blocks
        total = np.zeros_like(blk[0])
        for b in blk:
            total = total + b
        return {k: total for k in range(n)}
    if name == "all_gather":  # every device: all blocks in position order
        return {k: x for k in range(n)}
    if name == "all_to_all":  # device j receives chunk j (a column) of every device's row
        return {j: np.array([[x[i, j]] for i in range(n)], dtype=x.dtype) for j in range(n)}
    if name == "ppermute":  # shift by one: device k receives the block of device k-1
        return {k: blk[(k - 1) % n] for k in range(n)}
    raise ValueError(name)


def _programs(n):
    import jax

    # all_gather's result is typed varying over 'x' (JAX's vma rule), so its replicated
    # out_specs needs check_vma=False; the per-device check below verifies the replication.
    return {
        "psum": (lambda a: jax.lax.psum(a, "x"), ("x", None), ()),
        "all_gather": (lambda a: jax.lax.all_gather(a, "x", tiled=True), ("x", None), ()),
        "all_to_all": (lambda a: jax.lax.all_to_all(a, "x", 1, 0, tiled=True), ("x", None),
                       (None, "x")),
        "ppermute": (lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % n) for i in range(n)]),
                     ("x", None), ("x", None)),
    }


def _check_shards(shards, expected_by_id, what):
    seen = []
    for s in shards:
        want = expected_by_id[s.device_id]
        if s.data.shape != want.shape or s.data.dtype != want.dtype or not np.array_equal(s.data, want):
            raise AssertionError(
                f"{what}: device {s.device_id} holds {s.data.tolist()} ({s.data.dtype}), "
                f"expected {want.tolist()} ({want.dtype})"
            )
        seen.append(s.device_id)
    return seen


def run_checks() -> dict:
    import jax

    import xla_backend
    from refsim import NamedSharding, PartitionSpec as P
    from xla_backend import distributed

    n = jax.device_count()
    mesh = xla_backend.mesh((n,), ("x",))
    ids = mesh.device_ids.ravel().tolist()
    x = (np.arange(n * n, dtype=np.float32).reshape(n, n) % 7) - 3  # exact-friendly
    report = {"process_id": jax.process_index(), "process_count": jax.process_count(),
              "devices": n, "local_devices": [d.id for d in jax.local_devices()], "checks": {}}
    for name, (fn, in_spec, out_spec) in _programs(n).items():
        report["checks"][name] = _one(name, lambda: xla_backend.shard_map(
            fn, mesh=mesh, in_specs=P(*in_spec), out_specs=P(*out_spec),
            check_vma=name != "all_gather")(x),
            {ids[k]: v for k, v in _expected_blocks(name, x, n).items()}, distributed)
    # Reshard across processes onto a 2-D mesh in reversed device order.
    mesh2 = xla_backend.mesh((2, n // 2), ("a", "b"), order="reversed")
    target = NamedSharding(mesh2, P("b", "a"))
    src = xla_backend.device_put(x, NamedSharding(mesh, P("x", None)))
    idx = target.devices_indices_map(x.shape)
    report["checks"]["reshard"] = _one(
        "reshard", lambda: xla_backend.device_put(src, target),
        {d: x[i] for d, i in idx.items()}, distributed)
    report["ok"] = all(c["ok"] for c in report["checks"].values())
    return report


def _one(name, run, expected_by_id, distributed) -> dict:
    out = {"ok": False}
    try:
        res = run()
        out["local_devices"] = _check_shards(res.shards, expected_by_id, f"{name} (local shards)")
        full = distributed.gather(res)
        out["all_devices"] = _check_shards(full.shards, expected_by_id, f"{name} (gathered shards)")
        if sorted(out["all_devices"]) != sorted(expected_by_id):
            raise AssertionError(f"{name}: gathered devices {out['all_devices']} != "
                                 f"{sorted(expected_by_id)}")
        out["ok"] = True
    except Exception as e:  # reported per check, and the exit status says it failed
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    return out


def main(argv) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m xla_backend selftest")
    ap.add_argument("--json", help="write the report here ({process_id} is replaced)")
    ap.add_argument("--distributed", action="store_true",
                    help="call xla_backend.distributed.initialize() first (set by launch)")
    args = ap.parse_args(argv)
    from xla_backend import distributed, platform

    if args.distributed:
        distributed.initialize()
    else:
        platform.configure()
    report = run_checks()
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json.format(process_id=report["process_id"]), "w") as f:
            f.write(text)
    for name, c in report["checks"].items():
        print(f"[process {report['process_id']}] {name}: {'ok' if c['ok'] else c['error']}")
    if args.distributed:
        distributed.shutdown()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
