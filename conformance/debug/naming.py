"""Readable names for a jaxpr's variables and a one-line text of an equation.

Variables are named in order of definition (constvars, invars, then each equation's
outputs) with the alphabetic scheme of JAX's jaxpr printer (a, b, ..., z, ba, bb, ...), so
the names match `print(jaxpr)` of the same region.
"""
from __future__ import annotations

import string


def _alpha(i: int) -> str:
    letters = string.ascii_lowercase
    out = letters[i % 26]
    i //= 26
    while i:
        out = letters[i % 26] + out
        i //= 26
    return out


class Names:
    """`names[var]` -> its name; `names.aval(var)` -> `f32[2,2]{V:x}`; `names.eqn(eqn)` -> text."""

    def __init__(self, jaxpr):
        self._names: dict = {}
        for v in list(jaxpr.constvars) + list(jaxpr.invars):
            self._add(v)
        for e in jaxpr.eqns:
            for v in e.outvars:
                if type(v).__name__ != "DropVar":
                    self._add(v)

    def _add(self, v) -> None:
        if v not in self._names:
            self._names[v] = _alpha(len(self._names))

    def __getitem__(self, v) -> str:
        if type(v).__name__ == "Literal":
            return repr(v.val)
        if type(v).__name__ == "DropVar":
            return "_"
        return self._names.get(v, "?")

    @staticmethod
    def aval(v) -> str:
        aval = v.aval
        short = getattr(aval, "str_short", None)
        return short(short_dtypes=True) if short is not None else str(aval)

    def eqn(self, eqn) -> str:
        outs = " ".join(f"{self[v]}:{self.aval(v)}" for v in eqn.outvars)
        params = ", ".join(f"{k}={_short(v)}" for k, v in sorted(eqn.params.items()))
        ins = " ".join(self[v] for v in eqn.invars)
        return f"{outs} = {eqn.primitive.name}[{params}] {ins}"


def _short(value) -> str:
    text = repr(value)
    if "\n" in text or len(text) > 120:
        first = text.splitlines()[0]
        return (first[:100] + " ...") if len(first) > 100 else first + " ..."
    return text
