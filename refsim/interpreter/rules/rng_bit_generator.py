"""XLA's RngBitGenerator in NumPy: the bits XLA:CPU produces, for the `rbg` PRNG impls.

Follows XLA's RngBitGeneratorExpander (xla/service/rng_bit_generator_expander.cc) and
its bit generators (xla/hlo/builder/lib/prng.cc), which is what XLA:CPU runs:

* The state is u64[2] (JAX passes u32[4] and bitcasts: u64[i] = k[2i] | k[2i+1] << 32).
  state[0] is the key and is returned unchanged.
* RNG_DEFAULT is RNG_PHILOX on CPU.
* PHILOX (Philox-4x32-10, Salmon et al. SC'11): the 128-bit counter is (low = state[1],
  high = state[0]) (a u64[2] state is reversed); block i hashes counter + i (128-bit add);
  the four 32-bit words of block i are values 4i..4i+3 (64-bit outputs: words (0,1) and
  (2,3) form values 2i, 2i+1, with 2n words generated). The new state[1] is the low 64
  bits of counter + number of blocks.
* THREE_FRY (Threefry-2x32-20): the counter is state[1]. 32-bit outputs: the shape is
  split in halves on its first even dimension (else its largest), element j of the half
  shape hashes counter + j (as lo, hi words) and its two output words are values
  (…, 2i, …) and (…, 2i+1, …); 64-bit outputs hash counter + j for each element and join
  the words as lo | hi << 32. The new state[1] is counter + elements hashed.
* 8 / 16-bit outputs are the 32-bit outputs truncated (the low bits).
"""
from __future__ import annotations

import numpy as np

from refsim.interpreter.rules.random import threefry2x32

_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_W = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))
_U32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def _lo(x):
    return (x & _U32).astype(np.uint32)


def _hi(x):
    return (x >> _S32).astype(np.uint32)


def philox4x32(x0, x1, x2, x3, k0, k1):
    """Philox-4x32 with 10 rounds on broadcastable uint32 arrays; returns four words."""
    k0, k1 = np.asarray(k0, np.uint32), np.asarray(k1, np.uint32)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0 = x0.astype(np.uint64) * _M[0]
            p1 = x2.astype(np.uint64) * _M[1]
            x0, x1, x2, x3 = _hi(p1) ^ x1 ^ k0, _lo(p1), _hi(p0) ^ x3 ^ k1, _lo(p0)
            k0, k1 = k0 + _W[0], k1 + _W[1]
    return x0, x1, x2, x3


def _philox(key, ctr_lo, ctr_hi, n, width):
    """`n` values of `width` bits (32 or 64) from Philox; key/counter are uint64 arrays of
    shape (B,); returns values (B, n) and the new low counter word (B,)."""
    words = n if width == 32 else 2 * n
    blocks = -(-words // 4)
    i = np.arange(blocks, dtype=np.uint64)
    with np.errstate(over="ignore"):
        low = ctr_lo[:, None] + i
        high = ctr_hi[:, None] + (low < ctr_lo[:, None]).astype(np.uint64)
        out = philox4x32(_lo(low), _hi(low), _lo(high), _hi(high),
                         _lo(key)[:, None], _hi(key)[:, None])
        new_lo = ctr_lo + np.uint64(blocks)
    w = np.stack(out, axis=-1)  # (B, blocks, 4)
    if width == 64:
        w64 = w.astype(np.uint64)
        vals = (w64[..., 0::2] | (w64[..., 1::2] << _S32)).reshape(len(key), -1)
    else:
        vals = w.reshape(len(key), -1)
    return vals[:, :n], new_lo


def _split_dim(shape):
    for i, d in enumerate(shape):
        if d % 2 == 0:
            return i
    return int(np.argmax(shape))


def _threefry(key, ctr, shape, width):
    """Values of `shape` from XLA's ThreeFryBitGenerator; key/ctr uint64 (B,)."""
    k0, k1 = _lo(key), _hi(key)
    b = len(key)
    if width == 64:
        n = int(np.prod(shape, dtype=np.int64))
        with np.errstate(over="ignore"):
            c = ctr[:, None] + np.arange(n, dtype=np.uint64)
        a, bb = threefry2x32(k0[:, None], k1[:, None], _lo(c), _hi(c))
        vals = a.astype(np.uint64) | (bb.astype(np.uint64) << _S32)
        with np.errstate(over="ignore"):
            return vals.reshape((b,) + shape), ctr + np.uint64(n)
    if not shape:
        half, d = (1,), 0
    else:
        d = _split_dim(shape)
        half = shape[:d] + (-(-shape[d] // 2),) + shape[d + 1:]
    n = int(np.prod(half, dtype=np.int64))
    with np.errstate(over="ignore"):
        c = ctr[:, None] + np.arange(n, dtype=np.uint64)
    a, bb = threefry2x32(k0[:, None], k1[:, None], _lo(c), _hi(c))
    pair = np.stack([a.reshape((b,) + half), bb.reshape((b,) + half)], axis=d + 2)
    full = half[:d] + (2 * half[d],) + half[d + 1:]
    vals = pair.reshape((b,) + full)
    vals = vals[(slice(None),) + tuple(slice(0, s) for s in shape)] if shape else vals[:, 0]
    with np.errstate(over="ignore"):
        return vals.reshape((b,) + shape), ctr + np.uint64(n)


ALGORITHMS = ("RNG_DEFAULT", "RNG_THREE_FRY", "RNG_PHILOX")


def rng_bit_generator(state, shape, dtype, algorithm="RNG_DEFAULT"):
    """XLA:CPU's RngBitGenerator over a batch of states.

    state: uint32 (..., 4) (JAX's layout) or uint64 (..., 2); shape: the output shape per
    state; dtype: an unsigned integer dtype of 8/16/32/64 bits. Returns (new_state with
    state's dtype and shape, bits of shape state.shape[:-1] + shape).
    """
    state = np.asarray(state)
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"rng_bit_generator: algorithm={algorithm!r} is not one of {ALGORITHMS}.")
    if dtype.kind != "u" or dtype.itemsize not in (1, 2, 4, 8):
        raise TypeError(f"rng_bit_generator: dtype={dtype} must be uint8/16/32/64.")
    u32_key = state.dtype == np.uint32
    if u32_key:
        if state.shape[-1:] != (4,):
            raise TypeError(f"rng_bit_generator: a uint32 key must have last dim 4, got shape {state.shape}.")
        w = np.ascontiguousarray(state).astype(np.uint64)
        s64 = w[..., 0::2] | (w[..., 1::2] << _S32)
    elif state.dtype == np.uint64 and state.shape[-1:] == (2,):
        s64 = state
    else:
        raise TypeError(f"rng_bit_generator: key must be uint32[4] or uint64[2], got {state.dtype}{list(state.shape)}.")
    lead = s64.shape[:-1]
    flat = s64.reshape(-1, 2)
    width = 64 if dtype.itemsize == 8 else 32
    if algorithm == "RNG_THREE_FRY":
        vals, new1 = _threefry(flat[:, 0], flat[:, 1], shape, width)
    else:
        n = int(np.prod(shape, dtype=np.int64))
        vals, new1 = _philox(flat[:, 0], flat[:, 1], flat[:, 0], n, width)
    new = np.stack([flat[:, 0], new1], axis=-1).reshape(lead + (2,))
    if u32_key:
        new = np.stack([_lo(new), _hi(new)], axis=-1).reshape(lead + (4,))
    return new, vals.astype(dtype).reshape(lead + shape)


# --- the rule ---------------------------------------------------------------------------

from refsim.interpreter.registry import register  # noqa: E402


@register("rng_bit_generator")
def rng_bit_generator_rule(ctx, key, *, shape, dtype, algorithm, out_sharding=None):
    """lax.rng_bit_generator: per device, its own key (mesh dims are devices)."""
    alg = getattr(algorithm, "name", str(algorithm))
    alg = alg if alg.startswith("RNG_") else f"RNG_{alg}"
    out_dtype = np.dtype(dtype)
    gen = out_dtype if out_dtype.kind == "u" else np.dtype(np.uint32)
    new_key, bits = rng_bit_generator(key, shape, gen, alg)
    return [new_key, bits.astype(out_dtype)]
