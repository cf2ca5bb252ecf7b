"""Whether a planted fault fired: how many times it changed what XLA compiles or runs.

A fault that targets something the program does not have (a ppermute fault in a program without
ppermute, a strided-groups fault on a psum without groups) plants nothing: XLA runs the right
program and an agreement says nothing about the fault. Each `inject` block therefore counts, per
fault name, the times a replaced lowering rule emitted something other than JAX's own rule, a
module edit changed the module, a jaxpr runner rewrote an equation, or a patch took effect
(`note`). `Planted` is what a block yields: the names planted, as a list (so `planted == [...]`
reads as before), with `fired` the counts.
"""
from __future__ import annotations

import dataclasses

__all__ = ["FaultNotFired", "NothingToEdit", "Planted", "active", "is_planted", "note", "same_param"]


class FaultNotFired(UserWarning):
    """A fault planted for a block changed nothing XLA compiled or ran inside it (`warnings.warn`)."""


class NothingToEdit(ValueError):
    """A module edit (`conformance.faults.compiler`) found nothing it targets in the module: raised
    when it is called directly; a planted edit leaves such a module unchanged (and never fires)."""


class Planted(list):
    """The names a block planted (a list) with `fired` ({name: count}) and `targets` ({name: what
    the fault acts on, in words})."""

    def __init__(self, names, targets=None):
        super().__init__(names)
        self.fired: dict[str, int] = {n: 0 for n in names}
        self.targets: dict[str, str] = dict(targets or {})

    @property
    def silent(self) -> list[str]:
        """The planted names that never fired."""
        return [n for n in self if not self.fired.get(n)]

    def summary(self) -> str:
        """One line: each name with its count, e.g. `ppermute_pairs_reversed fired 2 times`."""
        return "; ".join(f"{n} fired {_times(self.fired.get(n, 0))}" for n in self)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


_ACTIVE: list[Planted] = []


def note(name: str, times: int = 1) -> None:
    """Count `times` firings of fault `name` in every active block that planted it."""
    for planted in _ACTIVE:
        if name in planted.fired:
            planted.fired[name] += times


def is_planted(name: str) -> bool:
    """Whether an active block planted fault `name`."""
    return any(name in planted.fired for planted in _ACTIVE)


@dataclasses.dataclass
class active:
    """Context manager: `planted` receives the `note`s made while it is open (blocks may nest)."""

    planted: Planted

    def __enter__(self) -> Planted:
        _ACTIVE.append(self.planted)
        return self.planted

    def __exit__(self, *exc) -> None:
        # by identity: two blocks planting the same names are equal lists
        del _ACTIVE[next(i for i, p in enumerate(_ACTIVE) if p is self.planted)]


def same_param(a, b, key: str = "") -> bool:
    """Whether two params (or args) are the same for the lowering: identical, or equal; a ppermute's
    `perm` as a set of pairs (a swap reversed is the same swap)."""
    if a is b:
        return True
    if key == "perm":
        try:
            return {tuple(map(int, p)) for p in a} == {tuple(map(int, p)) for p in b}
        except (TypeError, ValueError):
            return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays, jaxprs: not comparable, so not known to be the same
        return False
