"""A five-minute tour: a layout, its texts and picture, and one program on refsim and on XLA.

Run with ``python -m conformance.demo``. It configures 8 virtual CPU devices for the
XLA half, so run it in a fresh process.
"""
from __future__ import annotations

import numpy as np
from rich.console import Console

import refsim
import xla_backend
from conformance.verdict.compare import compare
from refsim import Mesh, NamedSharding, P
from xla_backend import platform


def main() -> int:
    platform.configure("cpu", 8)
    # JAX after the platform is chosen: it reads the platform once, when it loads
    import jax

    console = Console()
    ids = np.array([[3, 1, 0, 2], [7, 6, 5, 4]])
    mesh = Mesh((2, 4), ("x", "y"), device_ids=ids)
    sharding = NamedSharding(mesh, P("x", "y"))
    console.rule("1. A layout: NamedSharding(Mesh 2x4 with permuted ids, P('x', 'y')) on an (8, 8) array")
    console.print(f"mesh             {mesh!r}")
    console.print(f"shard_shape      {sharding.shard_shape((8, 8))}")
    console.print(f"HLO sharding     {sharding.to_hlo(2)}")
    console.print(f"Shardy           {sharding.to_shardy(2)}")
    refsim.visualize(sharding, (8, 8))

    console.rule("2. One program, two engines: psum over 'x', then a ring ppermute over 'y'")

    def program(a):
        s = jax.lax.psum(a, "x")
        return jax.lax.ppermute(s, "y", [(i, (i + 1) % 4) for i in range(4)])

    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    kw = dict(mesh=mesh, in_specs=P("x", "y"), out_specs=P(None, "y"))
    expected = refsim.shard_map(program, **kw)(x)
    actual = xla_backend.shard_map(program, **kw)(x)
    console.print("refsim result (global value):")
    console.print(np.asarray(expected))
    result = compare(expected, actual)
    verdict = "[green]XLA agrees with refsim on every device[/green]" if result.ok else "[red]XLA disagrees[/red]"
    console.print(f"{verdict}: {len(actual.shards)} shards compared, device by device")
    if not result.ok:
        console.print(result.report())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
