"""The one divisibility rule every tiled layout shares (NamedSharding, HloSharding)."""
from __future__ import annotations

from typing import Callable

from refsim.errors import IndivisibleError


def block_shape(what: "str | Callable[[], str]", shape: tuple[int, ...], counts: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` cut into `counts` equal blocks per dimension; IndivisibleError (JAX's wording)
    naming `what` when a dimension does not divide evenly. `what` may be a function giving the
    text, called only for the error: a sharding's repr costs more than the division itself."""
    for d, (n, c) in enumerate(zip(shape, counts)):
        if n % c:
            if callable(what):
                what = what()
            raise IndivisibleError(
                f"{what} implies that array axis {d} is partitioned {c} times, but the dimension "
                f"size is {n} (full shape: {shape}, per-dimension tiling factors: {list(counts)} "
                "should evenly divide the shape)"
            )
    return tuple(n // c for n, c in zip(shape, counts))
