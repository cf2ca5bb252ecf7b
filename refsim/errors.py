"""Exception types of refsim that JAX has no class for."""
from __future__ import annotations


class UnsupportedPrimitive(NotImplementedError):
    """A jaxpr equation uses a primitive that refsim has no rule for.

    A NotImplementedError, as JAX raises for a primitive with no lowering on a platform.
    """

    def __init__(self, name: str, hint: str = ""):
        self.primitive = name
        msg = (
            f"refsim has no rule for primitive {name!r}. Add one with "
            f"@register({name!r}) in refsim/interpreter/rules/, or run with "
            "fallback=True to evaluate it with JAX on CPU (the result is then reported as "
            "not independent)."
        )
        super().__init__(msg + (" " + hint if hint else ""))


class UnsupportedUnreducedKind(NotImplementedError):
    """A value unreduced with partial values combined by max or min (jax 0.12's
    `unreduced_kind`): refsim models partial sums only."""


class ReplicationError(ValueError):
    """Devices that should hold the same value (replicas) hold different values."""


class DuplicateSpecError(Exception):
    """A PartitionSpec maps one mesh axis to two array dimensions (JAX's class of that name)."""


class IndivisibleError(ValueError):
    """An array dimension is not divisible by the number of shards a sharding cuts it into."""
