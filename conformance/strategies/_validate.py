"""Up-front argument checks for the public strategies (as hypothesis.extra.numpy does).

Every check raises `hypothesis.errors.InvalidArgument` naming the argument, the
value and what would be accepted, before anything is drawn.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument


def is_strategy(value: Any) -> bool:
    return isinstance(value, st.SearchStrategy)


def as_strategy(value: Any) -> st.SearchStrategy:
    """`value` itself if it is a strategy, else `just(value)`."""
    return value if is_strategy(value) else st.just(value)


def check_int(name: str, value: Any, *, min_value: int | None = None, max_value: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int.")
    if min_value is not None and value < min_value:
        raise InvalidArgument(f"{name}={value!r} must be at least {min_value}.")
    if max_value is not None and value > max_value:
        raise InvalidArgument(f"{name}={value!r} must be at most {max_value}.")
    return value


def check_order(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} must not exceed {hi_name}={hi!r}.")


def check_options(name: str, values: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    """A non-empty tuple of distinct option names, each one of `allowed`."""
    if isinstance(values, str):
        values = (values,)
    try:
        values = tuple(values)
    except TypeError:
        raise InvalidArgument(f"{name}={values!r} must be a sequence of options from {tuple(allowed)!r}.") from None
    if not values:
        raise InvalidArgument(f"{name}=() is empty; pick at least one of {tuple(allowed)!r}.")
    for v in values:
        if v not in allowed:
            raise InvalidArgument(f"{name} contains {v!r}, which is not one of {tuple(allowed)!r}.")
    if len(set(values)) != len(values):
        raise InvalidArgument(f"{name}={values!r} repeats an option; list each once.")
    return values


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise InvalidArgument(f"{name}={value!r} must be one of {allowed!r}.")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be True or False.")
    return value


def check_int_or_strategy(name: str, value: Any, *, min_value: int | None = None,
                          max_value: int | None = None) -> st.SearchStrategy:
    """Validate a literal int now; a strategy's draws are validated when drawn."""
    if is_strategy(value):
        return value
    return st.just(check_int(name, value, min_value=min_value, max_value=max_value))


def check_drawn_int(name: str, value: Any, *, min_value: int | None = None,
                    max_value: int | None = None) -> int:
    """The same check for a value a user strategy produced (reported as that strategy's fault)."""
    try:
        return check_int(name, value, min_value=min_value, max_value=max_value)
    except InvalidArgument as e:
        raise InvalidArgument(f"the strategy passed as {name} drew an invalid value: {e}") from None
