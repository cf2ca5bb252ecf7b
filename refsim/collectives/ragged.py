"""Ragged all-to-all kernel, vectorised over every (device, slice) pair at once.

Semantics of `jax.lax.ragged_all_to_all`'s docstring (XLA `ragged-all-to-all`): with
N offsets per device and group size G (N % G == 0, N // G slices per peer), sender s
sends rows `operand_s[input_offsets_s[i] : input_offsets_s[i] + send_sizes_s[i]]` to the
member at group position i // (N // G), which writes them at rows
`output_offsets_s[i] : + send_sizes_s[i]` of its copy of `output`. Rows no one writes
keep `output`'s values. `recv_sizes` must equal `all_to_all(send_sizes)`.
"""
from __future__ import annotations

import numpy as np

from refsim.collectives.groups import GroupLayout, device_groups, member_index


def _as_k(lay, a, name, api):
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{api}: {name} must be integer type, got dtype {a.dtype}.")
    if a.ndim != lay.nm + 1 or a.shape[-1] < 1:
        raise ValueError(
            f"{api}: {name} must be rank 1 with positive dimension size per device, but got "
            f"local shape {a.shape[lay.nm:]}."
        )
    return lay.to_k(lay.check(a, api)).astype(np.int64)


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                      mesh, axis_name, axis_index_groups=None, api: str = "ragged_all_to_all"):
    """`ragged_all_to_all_p`: move ragged row-slices between the members of each group."""
    lay = GroupLayout(mesh, axis_name, api)
    operand = lay.check(operand, api)
    output = lay.check(output, api)
    groups = device_groups(mesh, lay.names, axis_index_groups, equal_sizes=True, api=api)
    ng, gs = groups.shape
    if operand.shape[lay.nm + 1:] != output.shape[lay.nm + 1:] or operand.dtype != output.dtype:
        raise ValueError(
            f"{api}: operand {operand.dtype}{list(operand.shape[lay.nm:])} and output "
            f"{output.dtype}{list(output.shape[lay.nm:])} must share dtype and trailing dims."
        )
    arrs = [_as_k(lay, a, n, api) for a, n in (
        (input_offsets, "input_offsets"), (send_sizes, "send_sizes"),
        (output_offsets, "output_offsets"), (recv_sizes, "recv_sizes"))]
    n = {a.shape[-1] for a in arrs}
    if len(n) != 1:
        raise ValueError(f"{api}: input_offsets, send_sizes, output_offsets and recv_sizes must "
                         f"have one length, got {[a.shape[-1] for a in arrs]}.")
    n = n.pop()
    if n % gs:
        raise ValueError(f"{api}: the offsets' length {n} must be divisible by the group size "
                         f"{gs} of axis_name={lay.names!r}.")
    spd = n // gs
    ok = lay.to_k(operand)  # (K, *rest, N_op, ...)
    outk = np.array(lay.to_k(output))  # writable copy, (K, *rest, M, ...)
    rest = tuple(np.broadcast_shapes(ok.shape[1:1 + len(lay.others)],
                                     outk.shape[1:1 + len(lay.others)],
                                     *(a.shape[1:-1] for a in arrs)))
    r = int(np.prod(rest, dtype=np.int64))
    ok = np.broadcast_to(ok, (lay.k,) + rest + ok.shape[1 + len(rest):]).reshape(
        (lay.k * r,) + ok.shape[1 + len(rest):])
    outk = np.broadcast_to(outk, (lay.k,) + rest + outk.shape[1 + len(rest):]).reshape(
        (lay.k * r,) + outk.shape[1 + len(rest):]).copy()
    ioff, ssz, ooff, rsz = (np.broadcast_to(a, (lay.k,) + rest + (n,)).reshape(lay.k * r, n)
                            for a in arrs)
    gidx, jidx = member_index(groups, lay.k)
    # devices are (k, r) pairs flattened as k * r + rr; peers differ only in k
    dev_k = np.repeat(np.arange(lay.k), r)
    dev_r = np.tile(np.arange(r), lay.k)
    dst_k = groups[gidx[dev_k][:, None], np.arange(n)[None, :] // spd]  # (K*r, n)
    dst = dst_k * r + dev_r[:, None]
    # recv_sizes must be the all_to_all of send_sizes: receiver d's slice for sender position
    # j, peer-slot q is send_sizes of that sender at slot (pos(d) * spd + q)
    src_pos = jidx[dev_k]
    want = rsz.reshape(lay.k * r, gs, spd)
    sender = groups[gidx[dev_k][:, None], np.arange(gs)[None, :]] * r + dev_r[:, None]  # (K*r, gs)
    got = ssz[sender[:, :, None], src_pos[:, None, None] * spd + np.arange(spd)[None, None, :]]
    if not np.array_equal(want, got):
        bad = int(np.argwhere(want != got)[0][0])
        raise ValueError(
            f"{api}: recv_sizes does not match the senders' send_sizes on device {bad} (linear "
            f"index over {lay.names!r}, other mesh position {bad % r}): recv_sizes="
            f"{want[bad].ravel().tolist()}, senders send {got[bad].ravel().tolist()}; recv_sizes "
            "must equal all_to_all(send_sizes, axis_name, 0, 0, tiled=True)."
        )
    if (ssz < 0).any() or (ioff < 0).any() or (ooff < 0).any() or \
            (ioff + ssz > ok.shape[1]).any() or (ooff + ssz > outk.shape[1]).any():
        raise ValueError(
            f"{api}: a slice runs outside its array: input rows must lie in [0, {ok.shape[1]}) "
            f"and output rows in [0, {outk.shape[1]}); check input_offsets, send_sizes and "
            "output_offsets (sizes must be >= 0)."
        )
    sizes = ssz.ravel()
    total = int(sizes.sum())
    if total:
        starts = np.cumsum(sizes) - sizes
        t = np.arange(total) - np.repeat(starts, sizes)
        src_dev = np.repeat(np.repeat(np.arange(lay.k * r), n), sizes)
        src_row = np.repeat(ioff.ravel(), sizes) + t
        dst_dev = np.repeat(dst.ravel(), sizes)
        dst_row = np.repeat(ooff.ravel(), sizes) + t
        outk[dst_dev, dst_row] = ok[src_dev, src_row]
    out = outk.reshape((lay.k,) + rest + outk.shape[1:])
    return lay.from_k(out)
