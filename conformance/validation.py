"""Numeric arguments, checked in one place: of the right kind, finite, and inside their range.

A tolerance of NaN compares false with everything, so a check such as ``if max_ulp < 0`` lets
it through and then every comparison against it "agrees"; an infinite time-out never ends. Every
numeric option of the command lines (`python -m conformance run / bisect / explain / mutate /
check`, `python -m conformance.mpmd_checks`, `python -m bench ...`) and every numeric argument of
the Python entry points (`conformance.runner.run`, `conformance.explain.explain`,
`conformance.debug.bisect`, ...) goes through here:

* `check(name, value, ...)` for Python arguments: the value, or ValueError (JAX's class for a
  bad argument value; TypeError for a value that is not a number at all) naming the argument,
  the value and the allowed range, e.g. ``max_ulp=nan; pass a finite number >= 0``.
* `option(flag, ...)` for argparse: a ``type=`` function that parses the text and raises
  `argparse.ArgumentTypeError`, so argparse prints
  ``argument --max-ulp: 'nan': pass a finite number >= 0 ...`` and exits with status 2.

Ranges: ``low`` / ``high`` bounds (inclusive unless ``low_open`` / ``high_open``); integers are
ints (never bools), numbers are ints or floats and always finite.
"""
from __future__ import annotations

import argparse
import math
import numbers

from xla_backend.limits import MAX_DEVICE_COUNT

__all__ = ["MAX_SECONDS", "check", "check_seconds", "device_count_option", "option", "range_text", "seconds_option"]

# The longest time-out or time budget accepted (about 11.6 days): larger values overflow the
# platform's wait calls (select, threading) and are not meant anyway.
MAX_SECONDS = 1_000_000


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    def num(v):
        return f"{v:g}" if isinstance(v, float) else str(v)

    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {num(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {num(high)}")
    return " and ".join(parts)


def range_text(*, integer: bool = False, low=None, high=None, low_open: bool = False, high_open: bool = False) -> str:
    """What `check` accepts, in words: ``a positive int``, ``a finite number > 0 and <= 1000000``."""
    if integer and high is None and not low_open and low in (0, 1):
        return "a positive int" if low == 1 else "a non-negative int"
    bounds = _bounds(low, high, low_open, high_open)
    return ("an int" if integer else "a finite number") + (" " + bounds if bounds else "")


def _in_range(v, low, high, low_open, high_open) -> bool:
    if low is not None and (v <= low if low_open else v < low):
        return False
    if high is not None and (v >= high if high_open else v > high):
        return False
    return True


def check(name: str, value, *, integer: bool = False, low=None, high=None, low_open: bool = False,
          high_open: bool = False, none: bool = False, what: str = "", none_means: str = ""):
    """`value` when it is an int (``integer``) or a finite real number within [low, high]; else an error
    naming `name`, the value and the range (`what` says what the value means, e.g. "0: bit-exact").

    none: None is accepted (and returned); `none_means` says what it means ("no limit"). A bool
    is never a number here. NumPy scalars are accepted and returned as Python int / float.
    """
    if value is None and none:
        return None
    want = range_text(integer=integer, low=low, high=high, low_open=low_open, high_open=high_open)
    hint = (f" ({what})" if what else "") + ((", or None" + (f" {none_means}" if none_means else "")) if none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r}; pass {want}{hint}.")
    if integer:
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"{name}={value!r}; pass {want}{hint}.")
        v = int(value)
    else:
        v = float(value) if not isinstance(value, numbers.Integral) else int(value)
        if not math.isfinite(v):
            raise ValueError(f"{name}={value!r}; pass {want}{hint}: NaN and infinity are refused.")
    if not _in_range(v, low, high, low_open, high_open):
        raise ValueError(f"{name}={value!r}; pass {want}{hint}.")
    return v


def check_seconds(name: str, value, *, zero: bool = False, none: bool = False, what: str = "",
                  none_means: str = ""):
    """A time-out or time budget: a finite number of seconds > 0 (>= 0 with `zero`), at most `MAX_SECONDS`."""
    return check(name, value, low=0, low_open=not zero, high=MAX_SECONDS, none=none, what=what,
                 none_means=none_means)


def option(flag: str, *, integer: bool = False, low=None, high=None, low_open: bool = False,
           high_open: bool = False, what: str = "", unit: str = ""):
    """An argparse ``type=`` for option `flag`: the parsed int / float, checked like `check`;
    anything else raises `argparse.ArgumentTypeError` naming the text and the range, e.g.
    ``'nan' must be a finite number >= 0``, ``0 must be >= 1``, ``'two' is not an integer``
    (argparse prefixes ``argument --flag:``). `unit` names what a number counts (" of seconds")."""
    want = range_text(integer=integer, low=low, high=high, low_open=low_open, high_open=high_open)
    bounds = _bounds(low, high, low_open, high_open)
    hint = f" ({what})" if what else ""

    def parse(text: str):
        try:
            v = int(text) if integer else float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if integer else 'a number'}{unit}; "
                                             f"pass {want}{hint}") from None
        if integer:
            if not _in_range(v, low, high, low_open, high_open):
                raise argparse.ArgumentTypeError(f"{v} must be {bounds}{hint}")
        elif not math.isfinite(v) or not _in_range(v, low, high, low_open, high_open):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number{(' ' + bounds) if bounds else ''}{hint}")
        return v

    parse.__name__ = flag.lstrip("-").replace("-", "_")
    return parse


def seconds_option(flag: str, *, zero: bool = False, what: str = ""):
    """`option` for a time-out or time budget (see `check_seconds`)."""
    return option(flag, low=0, low_open=not zero, high=MAX_SECONDS, what=what, unit=" of seconds")


def device_count_option(flag: str = "--devices"):
    """`option` for a CPU device count: an int in [1, 2**31 - 1] (XLA reads the count as a 32-bit int;
    a larger value reached XLA's flag parser, which printed the help of its flags)."""
    return option(flag, integer=True, low=1, high=MAX_DEVICE_COUNT, what="XLA reads the device count as a 32-bit int")
