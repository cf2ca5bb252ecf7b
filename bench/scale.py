"""refsim at pod scale: a 64x64 = 4096-device mesh, psum + all_gather + ppermute on a 64 MiB array.

The program is traced by JAX against an AbstractMesh (no devices) and interpreted by
refsim with one stacked ndarray per value. Prints a table and one JSON line with wall
time and peak memory (tracemalloc peak of allocations made during the call, which
NumPy reports, and the process's peak RSS), relative to the array's bytes.

    python bench/scale.py [--side 64] [--mib 64]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc

import numpy as np


def program(side: int):
    import jax
    from jax import lax

    ring = [(j, (j + 1) % side) for j in range(side)]

    def f(a):
        b = lax.ppermute(a, "x", ring)               # every device sends its block one step along x
        s = lax.psum(b, "y")                         # sum over the 64 devices of each x row
        g = lax.all_gather(s, "x", axis=0, tiled=True)
        return b, g

    del jax
    return f


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=64, help="mesh is side x side devices (default 64)")
    parser.add_argument("--mib", type=int, default=64, help="global array size in MiB (default 64)")
    args = parser.parse_args(argv)

    from xla_backend import platform

    platform.configure("cpu", 1)
    import refsim
    from refsim import Mesh, P

    side = args.side
    n = int(np.sqrt(args.mib * 2**20 // 4))
    n -= n % side
    a = (np.arange(n * n, dtype=np.int64) % 7).astype(np.float32).reshape(n, n)
    nbytes = a.nbytes
    mesh = Mesh((side, side), ("x", "y"))
    fn = refsim.shard_map(program(side), mesh=mesh, in_specs=P("x", "y"), out_specs=(P("x", "y"), P("x")))

    t0 = time.perf_counter()
    fn(a)  # first call: includes JAX tracing of the 4096-device program
    first = time.perf_counter() - t0

    tracemalloc.start()
    t0 = time.perf_counter()
    b, g = fn(a)
    second = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)

    # Spot-check against a direct NumPy computation on two devices' blocks.
    blk = n // side
    blocks = a.reshape(side, blk, side, blk)
    row = 5  # device (x=row, y) receives from x=row-1; psum over y sums that row's 64 blocks
    expect_s = blocks[(row - 1) % side].sum(axis=1)
    np.testing.assert_array_equal(b.shard(int(mesh.device_ids[row, 3])).data, blocks[(row - 1) % side, :, 3])
    np.testing.assert_array_equal(g.shard(int(mesh.device_ids[0, 0])).data[row * blk:(row + 1) * blk], expect_s)

    res = {
        "bench": "refsim_scale", "devices": side * side, "mesh": [side, side], "array_shape": [n, n],
        "array_mib": round(nbytes / 2**20, 2), "first_call_s": round(first, 3), "second_call_s": round(second, 3),
        "peak_traced_mib": round(peak / 2**20, 2), "peak_over_array": round(peak / nbytes, 3),
        "peak_rss_mib": round(rss / 2**20, 1), "numpy": np.__version__,
    }
    import jax

    res["jax"] = jax.__version__
    rows = [("devices", res["devices"]), ("array", f"{n}x{n} f32 = {res['array_mib']} MiB"),
            ("first call (trace + run)", f"{first:.3f} s"), ("second call", f"{second:.3f} s"),
            ("peak traced allocations", f"{res['peak_traced_mib']} MiB = {res['peak_over_array']}x array"),
            ("peak RSS (process)", f"{res['peak_rss_mib']} MiB")]
    w = max(len(k) for k, _ in rows)
    print("refsim scale benchmark: ppermute + psum + all_gather")
    for k, v in rows:
        print(f"  {k.ljust(w)}  {v}")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
