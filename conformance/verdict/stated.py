"""A program's own stated tolerance as a per-element comparison policy.

A corpus program whose result rounds states how far XLA may stray from refsim: ``tol``
(``|xla - refsim| <= tol + tol * |refsim|``, NumPy's ``isclose``) or ``ulps`` (``|xla - refsim|
<= ulps * ulp(refsim)``, the spacing of refsim's value in the output's dtype). `StatedBound` is
that rule for every element of an output; the programs suite uses it as the fallback of the
allowed set (`conformance.verdict.allowed.build`), so each element is held to the tighter of the
two, and where the bound walk has no rule for an output, to the stated tolerance alone.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from conformance.verdict import compare


@dataclasses.dataclass(frozen=True)
class StatedBound(compare.SumBound):
    """Per element: |xla - refsim| <= `abs_sum` (the stated allowance, see the module);
    `exact[d]` holds refsim's shard (float64). Build it with `StatedBound.of`."""

    tol: float = 0.0
    ulps: int = 0

    @classmethod
    def of(cls, array, *, tol: float = 0.0, ulps: int = 0) -> "StatedBound":
        """The stated rule for refsim's output `array` (a refsim.Array): exactly one of `tol` > 0
        or `ulps` > 0."""
        if (tol > 0) == (ulps > 0):
            raise ValueError(f"StatedBound.of(tol={tol!r}, ulps={ulps!r}): state exactly one of a positive "
                             "tol or a positive number of ulps.")
        exact, allow = {}, {}
        for s in array.shards:
            ref = np.asarray(s.data).astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                if tol:
                    a = tol + tol * np.abs(ref)
                else:
                    a = ulps * np.spacing(np.abs(np.asarray(s.data))).astype(np.float64)
                a = np.where(np.isfinite(ref), a, 0.0)
            exact[int(s.device_id)] = ref
            allow[int(s.device_id)] = a
        return cls(n=1, exact=exact, abs_sum=allow, tol=float(tol), ulps=int(ulps))

    def describe(self) -> str:
        if self.tol:
            return f"stated tolerance: |diff| <= {self.tol:g} + {self.tol:g} * |refsim|"
        return f"stated bound: |diff| <= {self.ulps} ulp of refsim's value"

    def why(self, exact: bool = False) -> str:
        return (f"{self.describe()}, the program's own statement of how far a correct implementation may stray "
                "(conformance.cases.corpus)")

    def per_element_allowed(self) -> dict:
        """Each device's allowed |diff| per element (what AllowedSet takes as its fallback)."""
        return dict(self.abs_sum)

    def allowed(self, out_dtype) -> float:
        """The largest allowed |diff| over the output."""
        return max((float(np.max(a)) for a in self.abs_sum.values() if np.size(a)), default=0.0)

    def reference_and_bound(self, device_id: int, out_dtype):
        return np.array(self.exact[device_id]), np.asarray(self.abs_sum[device_id], np.float64)

    def exact_elements(self, device_id: int, out_dtype) -> np.ndarray:
        return np.zeros(np.shape(self.exact[device_id]), bool)

    def allowed_nonfinite(self, device_id: int, out_dtype):
        no = np.zeros(np.shape(self.exact[device_id]), bool)
        return no, no, no

    @property
    def scale(self) -> float:
        finite = [np.abs(x[np.isfinite(x)]) for x in self.exact.values()]
        return max((float(f.max()) for f in finite if f.size), default=0.0)

    def ulps_of(self, diff: float, out_dtype) -> float:
        unit = compare.unit_roundoff(out_dtype) * self.scale
        return float(diff / unit) if unit > 0 else (0.0 if diff == 0 else float("inf"))
