"""A `device_put` reproducer, checked device by device: the whole program is one data movement.

`jax.device_put(jax.device_put(x, source), target)` has no jaxpr equations to bisect (a
reshard onto another spec, mesh or device order is a transfer, not a traced program), so the
"diverging step" is the movement itself. `compare_device_put` runs it on refsim and on XLA
and reports, for every device of the target, whether XLA placed the block refsim places there
(same index) and whether the data agree.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

import refsim
import xla_backend
from conformance.debug import diff
from conformance.debug.bisect import ValueReport
from conformance.validation import check

MovementRunner = Callable  # (x, source NamedSharding, target NamedSharding) -> refsim.Array


def xla_device_put(x, source, target):
    """`xla_backend.device_put` of `x` laid out by `source`, then resharded to `target` (as the
    conformance runner and the reproducer run a device_put case)."""
    return xla_backend.device_put(xla_backend.device_put(x, source), target)


@dataclasses.dataclass(frozen=True)
class MovementResult:
    """refsim's and XLA's placement of one device_put: `ok` when every device holds the same
    block (index and data) on both sides."""

    source: object
    target: object
    aval: str
    output: ValueReport          # data, per device of XLA's result, against refsim's global value
    misplaced: dict              # device id -> (XLA's index, refsim's index) where they differ
    missing: tuple               # devices refsim places a block on and XLA does not
    extra: tuple                 # devices XLA places a block on and refsim does not
    max_ulp: float = 0

    @property
    def ok(self) -> bool:
        return self.output.matched and not self.misplaced and not self.missing and not self.extra

    @property
    def mesh(self):
        return self.target.mesh

    def _what(self) -> str:
        s, t = self.source, self.target
        return (f"device_put of {self.aval} from {s.spec!r} on devices {np.asarray(s.mesh.device_ids).tolist()} to "
                f"{t.spec!r} on devices {np.asarray(t.mesh.device_ids).tolist()} (mesh {dict(t.mesh.shape)})")

    def report(self, *, max_devices: int = 4) -> str:
        """The verdict and, on a mismatch, each wrong device: misplaced blocks, differing elements."""
        from conformance.debug import picture

        if self.ok:
            return (f"MATCH: refsim and XLA agree on every device. The program is one data movement, "
                    f"{self._what()}; it has no equations to bisect.")
        lines = [f"MISMATCH: the program is one data movement, {self._what()}; it has no equations to "
                 "bisect, so the movement itself is where XLA and refsim diverge."]
        if self.missing:
            lines.append(f"  XLA placed no block on devices {list(self.missing)}, where refsim places one")
        if self.extra:
            lines.append(f"  XLA placed blocks on devices {list(self.extra)}, which the target sharding does not use")
        for dev, (got, want) in sorted(self.misplaced.items()):
            lines.append(f"  device {dev}: XLA holds block {_fmt(got)}, refsim places {_fmt(want)} there")
        r = self.output
        if not r.matched:
            lines.append(f"  data: differs on {len(r.differing)} of {len(r.devices)} devices {r.differing}; "
                         f"max ULP {r.max_ulp:g}, max abs error {r.max_abs:g} (each XLA block against the "
                         "global value at the block's own index)")
            lines.append(picture.render(self.mesh, r, metric="ulp", format="text").rstrip())
            lines += diff.device_lines(r, self.max_ulp, max_devices, positions=False)
        return "\n".join(lines)

    __str__ = report


def compare_device_put(x, source, target, *, runner: MovementRunner | None = None,
                       max_ulp: float = 0) -> MovementResult:
    """Run `device_put(device_put(x, source), target)` on refsim and with `runner` (default
    `xla_device_put`) and compare every device's index and data; values differ where some
    element is more than `max_ulp` ULP apart (ints/bools: unequal; NaN equals NaN)."""
    check("max_ulp", max_ulp, low=0, what="0: bit-exact, NaN equals NaN")
    x = np.asarray(x)
    want = refsim.device_put(refsim.device_put(x, source), target)
    got = (runner or xla_device_put)(x, source, target)
    ref_global = np.asarray(want)
    want_index = {int(s.device_id): _norm(s.index, x.shape) for s in want.shards}
    got_index = {int(s.device_id): _norm(s.index, x.shape) for s in got.shards}
    misplaced = {d: (got_index[d], want_index[d]) for d in sorted(set(got_index) & set(want_index))
                 if got_index[d] != want_index[d]}
    devices = diff.compare_shards(ref_global, got, max_ulp)
    aval = f"{x.dtype}{list(x.shape)}"
    return MovementResult(source, target, aval, ValueReport("output 0", aval, devices), misplaced,
                          tuple(sorted(set(want_index) - set(got_index))),
                          tuple(sorted(set(got_index) - set(want_index))), max_ulp)


def _norm(index, shape) -> tuple:
    """An index tuple as (start, stop) pairs, so `slice(None)` and `slice(0, n)` compare equal."""
    out = []
    for i, n in zip(tuple(index) + (slice(None),) * (len(shape) - len(tuple(index))), shape):
        out.append(i.indices(n)[:2] if isinstance(i, slice) else (int(i), int(i) + 1))
    return tuple(out)


def _fmt(pairs) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in pairs) + "]"
