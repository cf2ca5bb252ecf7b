"""Element errors between refsim's and XLA's values: ULP distance, absolute error, index ranges.

ULP distance counts representable floats between two values (the bit patterns mapped to
ordered integers, so +0 and -0 are 0 apart and adjacent floats 1 apart); NaN is 0 ULP from
NaN and infinitely far from anything else. Integer and bool values have no ULP: their
"ULP" is the absolute difference, so any inequality is nonzero.
"""
from __future__ import annotations

import dataclasses

import numpy as np


def _is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name in ("bfloat16",) or dtype.name.startswith("float8")


def _ordered(x: np.ndarray) -> np.ndarray:
    """Float bit patterns as integers ordered like the floats (sign-magnitude to two's complement)."""
    bits = x.view(np.dtype(f"i{x.dtype.itemsize}")).astype(np.int64)
    magnitude = bits & np.int64((1 << (8 * x.dtype.itemsize - 1)) - 1)
    return np.where(bits < 0, -magnitude, magnitude)


def ulp_error(expected, actual) -> np.ndarray:
    """Elementwise ULP distance (float64; inf where exactly one side is NaN)."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.dtype.kind == "c":
        return np.maximum(ulp_error(e.real, a.real), ulp_error(e.imag, a.imag))
    if not _is_float(e.dtype):
        return abs_error(e, a)
    shape = np.broadcast_shapes(e.shape, a.shape)
    # ravel, not ascontiguousarray: that makes a 0-d value (a per-device scalar) 1-d
    e = np.broadcast_to(e, shape).ravel()
    a = np.broadcast_to(a.astype(e.dtype), shape).ravel()
    dist = np.abs(_ordered(e).astype(np.float64) - _ordered(a))
    ne, na = np.isnan(e.astype(np.float64)), np.isnan(a.astype(np.float64))
    return np.where(ne & na, 0.0, np.where(ne | na, np.inf, dist)).reshape(shape)


def abs_error(expected, actual) -> np.ndarray:
    """Elementwise |actual - expected| in float64 (0 for NaN vs NaN, inf for NaN vs a number)."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.dtype.kind == "b":
        return (e != a).astype(np.float64)
    if e.dtype.kind == "c":
        return np.abs(e.astype(np.complex128) - a.astype(np.complex128))
    ef, af = e.astype(np.float64), a.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(af - ef)
    both_nan = np.isnan(ef) & np.isnan(af)
    same_inf = np.isinf(ef) & (ef == af)
    return np.where(both_nan | same_inf, 0.0, np.where(np.isnan(d), np.inf, d))


@dataclasses.dataclass(frozen=True)
class DeviceDiff:
    """One device's comparison of one value: matched, max ULP / abs error, both blocks."""

    device_id: int
    position: tuple | None
    index: tuple
    expected: np.ndarray
    actual: np.ndarray
    max_ulp: float
    max_abs: float
    bad: int
    bound: float | None = None  # the allowed |xla - refsim| (None: ULP distance only)

    @property
    def matched(self) -> bool:
        return self.bad == 0

    def bad_mask(self, max_ulp: float = 0) -> np.ndarray:
        """The elements outside the rule: more than `max_ulp` ULP apart and, with a bound, more than
        `bound` apart too."""
        return outside(self.expected, self.actual, max_ulp, self.bound)

    def ranges(self, max_ulp: float = 0) -> list[str]:
        """The differing index ranges of this device's block, as `[a:b, c:d]` boxes."""
        return differing_ranges(self.bad_mask(max_ulp))


def outside(expected, actual, max_ulp: float = 0, bound: float | None = None) -> np.ndarray:
    """Elements more than `max_ulp` ULP apart and, when `bound` is given, more than `bound` apart
    (|actual - expected|; NaN positions and infinities must match either way)."""
    bad = ulp_error(expected, actual) > max_ulp
    if bound is not None:
        bad &= abs_error(expected, actual) > bound
    return bad


def compare_shards(ref_global: np.ndarray, array, max_ulp: float = 0, local_shape=None,
                   bound: float | None = None) -> dict[int, DeviceDiff]:
    """Each shard of `array` (XLA's) against `ref_global[shard.index]` (refsim's), by device id.

    `local_shape` reshapes both blocks (a shard_map value's block without its size-1 mesh dims).
    An element matches within `max_ulp` ULP or, with `bound` (a number, or per element an array of
    `ref_global`'s shape), within |xla - refsim| <= bound.
    """
    mesh = getattr(getattr(array, "sharding", None), "mesh", None)
    out = {}
    for s in array.shards:
        exp = np.asarray(ref_global[tuple(s.index)])
        act = np.asarray(s.data)
        if exp.shape != act.shape or exp.dtype != act.dtype:
            raise ValueError(
                f"device {s.device_id}: refsim block {exp.shape} {exp.dtype} vs XLA block {act.shape} "
                f"{act.dtype} at index {s.index}; the XLA runner must return the probed values unchanged."
            )
        b = bound
        if bound is not None and np.ndim(bound):          # a per-element bound, in `ref_global`'s shape
            b = np.asarray(bound[tuple(s.index)])
        if local_shape is not None:
            exp, act = exp.reshape(local_shape), act.reshape(local_shape)
            b = b.reshape(local_shape) if b is not None and np.ndim(b) else b
        ulp = ulp_error(exp, act)
        ae = abs_error(exp, act)
        try:
            pos = mesh.device_position(int(s.device_id)) if mesh is not None else None
        except (ValueError, AttributeError):
            pos = None
        bad = (ulp > max_ulp) & (ae > b) if b is not None else ulp > max_ulp
        out[int(s.device_id)] = DeviceDiff(
            int(s.device_id), pos, tuple(s.index), exp, act,
            float(ulp.max()) if ulp.size else 0.0, float(ae.max()) if ae.size else 0.0,
            int(bad.sum()), b)
    return out


def differing_ranges(mask: np.ndarray, limit: int = 16) -> list[str]:
    """Boxes covering exactly the True elements of `mask`, as index strings, at most `limit`.

    Consecutive indices of the leading dimension whose sub-masks are identical merge into
    one range; the rest is split recursively. A 0-d True mask is `[]`.
    """
    mask = np.asarray(mask, dtype=bool)
    boxes = _boxes(mask)
    text = ["[" + ", ".join(f"{a}" if b == a + 1 else f"{a}:{b}" for a, b in box) + "]" for box in boxes]
    if len(text) > limit:
        text = text[:limit] + [f"... {len(boxes) - limit} more ranges"]
    return text


def first_differing(mask, limit: int = 3) -> list[tuple]:
    """The index tuples of the first `limit` True elements of `mask`, in row-major order; a 0-d
    mask (a per-device scalar, such as a loss) has the one index `()`."""
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim == 0:      # np.argwhere reads a 0-d array as 1-d: its index would be (0,)
        return [()] if mask else []
    return [tuple(int(i) for i in loc) for loc in np.argwhere(mask)[:limit]]


def _boxes(mask: np.ndarray) -> list[tuple]:
    if mask.ndim == 0:
        return [()] if mask else []
    out = []
    i, n = 0, mask.shape[0]
    while i < n:
        if not mask[i].any():
            i += 1
            continue
        j = i + 1
        while j < n and np.array_equal(mask[j], mask[i]):
            j += 1
        out += [((i, j),) + rest for rest in _boxes(mask[i])]
        i = j
    return out


def device_lines(result, max_ulp: float, max_devices: int, *, positions: bool = True) -> list[str]:
    """Text lines for the devices where an output differs: element counts, the differing index
    ranges, and the first three differing elements (refsim vs XLA) of each device."""
    lines = []
    for dev in result.differing[:max_devices]:
        dd = result.devices[dev]
        where = f"device {dev} (mesh position {dd.position})" if positions else f"device {dev}"
        lines.append(f"    {where}: {dd.bad} of {dd.expected.size} elements differ at "
                     f"{', '.join(dd.ranges(max_ulp))}")
        for loc in first_differing(dd.bad_mask(max_ulp)):
            lines.append(f"      element {list(loc)}: refsim {np.asarray(dd.expected)[loc].item()!r}, "
                         f"xla {np.asarray(dd.actual)[loc].item()!r}")
    if len(result.differing) > max_devices:
        lines.append(f"    ... {len(result.differing) - max_devices} more devices differ")
    return lines
