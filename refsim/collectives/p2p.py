"""One-sided send/receive pairs: psend and precv.

`psend(x, axis_name, perm)` returns a token; `precv(token, out_shape, axis_name, perm)`
returns the data. Run by every device of an SPMD program, a matched pair moves data
as `ppermute` with the same `perm` does (XLA Send/Recv with source-target pairs):
a device that is no pair's target receives zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refsim.collectives.groups import normalize_axis_name
from refsim.collectives.permute import normalize_perm, ppermute
from refsim.collectives.groups import GroupLayout


@dataclass(frozen=True)
class SendToken:
    """The token `psend` returns: the stacked data in flight and how it is routed."""

    data: np.ndarray
    axis_name: tuple
    perm: tuple


def psend(x, *, mesh, axis_name, perm):
    """`psend_p`: start sending `x` along `perm`; returns a SendToken for `precv`."""
    lay = GroupLayout(mesh, axis_name, "psend")
    lay.check(x, "psend")
    normalize_perm(perm, lay.k, "psend")
    return SendToken(np.asarray(x), normalize_axis_name(axis_name), tuple(map(tuple, perm)))


def precv(token, *, mesh, out_shape, axis_name, perm):
    """`precv_p`: receive what the matching `psend` sent; the result equals ppermute's."""
    names = normalize_axis_name(axis_name)
    if not isinstance(token, SendToken):
        raise ValueError(
            f"precv: token {token!r} does not come from a psend, so no data is in flight; pass "
            "the token returned by the matching psend.")
    if token.axis_name != names or token.perm != tuple(map(tuple, perm)):
        raise ValueError(
            f"precv: axis_name={names!r}, perm={tuple(map(tuple, perm))!r} do not match the "
            f"psend's axis_name={token.axis_name!r}, perm={token.perm!r}; use the same on both.")
    shape = tuple(getattr(out_shape, "shape", ()))
    dtype = np.dtype(getattr(out_shape, "dtype", token.data.dtype))
    local = token.data.shape[mesh.ndim:]
    if shape != local or dtype != token.data.dtype:
        raise ValueError(
            f"precv: out_shape {dtype}{list(shape)} differs from the data sent, "
            f"{token.data.dtype}{list(local)}; pass the sent value's shape and dtype.")
    return ppermute(token.data, mesh=mesh, axis_name=names, perm=perm, api="precv")
