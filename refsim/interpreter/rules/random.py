"""PRNG primitives for JAX's default threefry2x32 impl, so `jax.random` programs run.

Threefry-2x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
20 rounds of add/rotate/xor on two uint32 words with a key injection every 4 rounds,
rotation constants (13, 15, 26, 6) and (17, 29, 16, 24), parity 0x1BD11BDA. Key
derivation follows jax/_src/random/threefry2x32.py: seeds are the 64-bit seed split
into two words, `split`/`random_bits` hash a 64-bit iota (hi, lo words) when
``jax_threefry_partitionable`` is on (the default) and the original counter layout
when it is off, `fold_in` hashes the seed-key of the data.

A key array is a structured ndarray (see refsim.compat.key_numpy_dtype): the usual
leading mesh dims, the key array's shape, one uint32 field of the impl's key_shape.
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter.registry import register
from refsim.interpreter.rules import _util as U

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
_THREEFRY = "threefry2x32"


def _rotl(x, r):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 block cipher (20 rounds) on broadcastable uint32 arrays."""
    k1, k2, x1, x2 = (np.asarray(a, dtype=np.uint32) for a in (k1, k2, x1, x2))
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps by design
        ks = (k1, k2, k1 ^ k2 ^ _PARITY)
        a, b = x1 + ks[0], x2 + ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                a = a + b
                b = _rotl(b, r) ^ a
            a = a + ks[(i + 1) % 3]
            b = b + ks[(i + 2) % 3] + np.uint32(i + 1)
    return np.asarray(a, np.uint32), np.asarray(b, np.uint32)


# --- key representation ---------------------------------------------------------------

_RBG = ("rbg", "unsafe_rbg")  # XLA RngBitGenerator impls (jax._src.random.rbg), key_shape (4,)


def _check_impl(impl, where):
    if impl.name != _THREEFRY and impl.name not in _RBG:
        raise ValueError(
            f"{where}: PRNG impl {impl.name!r} has no refsim rule; refsim implements "
            f"{(_THREEFRY,) + _RBG!r} (jax.random.key(seed, impl=...) or jax_default_prng_impl)."
        )


def impl_name(keys: np.ndarray) -> str:
    """The PRNG impl name of a refsim key array (its one structured field)."""
    return keys.dtype.names[0]


def key_words(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two uint32 words of threefry keys (views)."""
    if keys.dtype.names != (_THREEFRY,):
        raise TypeError(f"expected a refsim threefry key array, got dtype {keys.dtype}.")
    data = keys[_THREEFRY]
    return data[..., 0], data[..., 1]


def make_keys(k1: np.ndarray, k2: np.ndarray) -> np.ndarray:
    """Threefry keys from two broadcastable uint32 word arrays."""
    k1, k2 = np.broadcast_arrays(np.asarray(k1, np.uint32), np.asarray(k2, np.uint32))
    data = np.ascontiguousarray(np.stack([k1, k2], axis=-1))
    return data.view(compat.key_numpy_dtype(_Impl))[..., 0]


class _Impl:  # the two fields key_numpy_dtype reads, for threefry
    name = _THREEFRY
    key_shape = (2,)


def keys_from_jax(x) -> np.ndarray:
    """A JAX key array (e.g. jax.random.key(0)) as refsim's structured key array."""
    import jax

    impl = compat.prng_impl_of(x.dtype)
    _check_impl(impl, "keys_from_jax")
    if len(impl.key_shape) != 1:
        raise ValueError(f"keys_from_jax: key_shape {impl.key_shape} is not 1-D.")
    data = np.ascontiguousarray(np.asarray(jax.random.key_data(x)))
    return data.view(compat.key_numpy_dtype(impl))[..., 0]


def keys_to_jax(keys: np.ndarray):
    """refsim's structured key array as a JAX key array of the same impl."""
    import jax

    name = impl_name(keys)
    return jax.random.wrap_key_data(np.ascontiguousarray(keys[name]), impl=name)


# --- counters as JAX lays them out --------------------------------------------------------

def _iota_2x32(shape):
    """Row-major 64-bit iota of `shape` as (hi, lo) uint32 words (prng.iota_2x32_shape)."""
    n = int(np.prod(shape, dtype=np.int64))
    flat = np.arange(n, dtype=np.uint64)
    hi = (flat >> np.uint64(32)).astype(np.uint32).reshape(shape)
    lo = (flat & np.uint64(0xFFFFFFFF)).astype(np.uint32).reshape(shape)
    return hi, lo


def _expand(a, n):
    return a.reshape(a.shape + (1,) * n)


def _hash_counts(keys, counts):
    """threefry_2x32(key, counts) of JAX's original layout: the flat counts (padded to even
    length) are split in halves that form the two words; output concatenated back."""
    k1, k2 = key_words(keys)
    flat = counts.reshape(-1)
    odd = flat.size % 2
    if odd:
        flat = np.concatenate([flat, np.zeros(1, np.uint32)])
    half = flat.size // 2
    a, b = threefry2x32(_expand(k1, 1), _expand(k2, 1), flat[:half], flat[half:])
    out = np.concatenate([a, b], axis=-1)
    if odd:
        out = out[..., :-1]
    return out.reshape(k1.shape + counts.shape)


def _partitionable() -> bool:
    import jax

    return bool(jax.config.jax_threefry_partitionable)


def random_bits(keys, bit_width, shape):
    """Uniform bits of `bit_width` with shape keys.shape + shape (threefry_random_bits)."""
    dtype = np.dtype(f"u{bit_width // 8}")
    k1, k2 = key_words(keys)
    n = len(shape)
    if _partitionable():
        hi, lo = _iota_2x32(tuple(shape))
        a, b = threefry2x32(_expand(k1, n), _expand(k2, n), hi, lo)
        if bit_width == 64:
            return (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)
        return (a ^ b).astype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    words = -(-bit_width * size // 32)
    if words >= np.iinfo(np.uint32).max:
        raise ValueError(
            f"random_bits: {size} values of {bit_width} bits exceed one threefry counter block "
            "in the non-partitionable layout; set jax_threefry_partitionable=True."
        )
    bits = _hash_counts(keys, np.arange(words, dtype=np.uint32))
    if bit_width == 64:
        half = bits.shape[-1] // 2
        out = (bits[..., :half].astype(np.uint64) << np.uint64(32)) | bits[..., half:].astype(np.uint64)
    elif bit_width == 32:
        out = bits
    else:  # little-endian unpacking of each word into 32/bit_width values
        per = 32 // bit_width
        shifts = (np.arange(per, dtype=np.uint32) * np.uint32(bit_width))
        parts = (bits[..., None] >> shifts) & np.uint32((1 << bit_width) - 1)
        out = parts.reshape(bits.shape[:-1] + (-1,))[..., :size].astype(dtype)
    return out.reshape(k1.shape + tuple(shape))


def split(keys, shape):
    """New keys of shape keys.shape + shape (threefry_split)."""
    k1, k2 = key_words(keys)
    n = len(shape)
    if _partitionable():
        hi, lo = _iota_2x32(tuple(shape))
        a, b = threefry2x32(_expand(k1, n), _expand(k2, n), hi, lo)
        return make_keys(a, b)
    num = int(np.prod(shape, dtype=np.int64))
    out = _hash_counts(keys, np.arange(num * 2, dtype=np.uint32))
    out = out.reshape(k1.shape + tuple(shape) + (2,))
    return make_keys(out[..., 0], out[..., 1])


def seed_words(seeds):
    """threefry_seed: the seed's bits above 32 (0 for 32-bit seeds) and its low 32 bits."""
    seeds = np.asarray(seeds)
    if not U.is_int(seeds.dtype):
        raise TypeError(f"random_seed: seeds must be integers, got dtype {seeds.dtype}.")
    if seeds.dtype.itemsize == 8:
        u = seeds.view(np.uint64)
        return (u >> np.uint64(32)).astype(np.uint32), (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return np.zeros(seeds.shape, np.uint32), seeds.astype(np.int64).astype(np.uint32)


def fold_in(keys, msgs):
    """threefry_fold_in: hash the key with counts (0, msg) i.e. threefry_seed(msg)."""
    k1, k2 = key_words(keys)
    hi, lo = seed_words(np.asarray(msgs).astype(np.uint32))
    a, b = threefry2x32(k1, k2, hi, lo)
    return make_keys(a, b)


# --- rules ----------------------------------------------------------------------------

@register("random_seed")
def random_seed_rule(ctx, seeds, *, impl):
    _check_impl(impl, "random_seed")
    if impl.name in _RBG:
        return rbg.seed(impl.name, seeds)
    return make_keys(*seed_words(seeds))


@register("random_bits")
def random_bits_rule(ctx, keys, *, bit_width, shape):
    if impl_name(keys) in _RBG:
        return rbg.random_bits(keys, ctx.nm, bit_width, shape)
    return random_bits(keys, bit_width, shape)


@register("random_split")
def random_split_rule(ctx, keys, *, shape):
    if impl_name(keys) in _RBG:
        return rbg.split(keys, ctx.nm, shape)
    return split(keys, shape)


@register("random_fold_in")
def random_fold_in_rule(ctx, keys, msgs):
    if impl_name(keys) in _RBG:
        return rbg.fold_in(keys, ctx.nm, np.asarray(msgs))
    keys, msgs = U.bcast_local_rank(ctx.nm, [keys, np.asarray(msgs)])
    return fold_in(keys, msgs)


@register("random_wrap")
def random_wrap_rule(ctx, base, *, impl):
    """uint32 data of shape (..., *key_shape) as keys of shape (...)."""
    _check_impl(impl, "random_wrap")
    data = np.ascontiguousarray(np.asarray(base, np.uint32))
    return data.view(compat.key_numpy_dtype(impl))[..., 0]


@register("random_unwrap")
def random_unwrap_rule(ctx, keys):
    return np.array(keys[impl_name(keys)])


@register("random_clone")
def random_clone_rule(ctx, keys):
    return keys


@register("threefry2x32")
def threefry2x32_rule(ctx, k1, k2, x1, x2):
    """The threefry2x32 primitive: elementwise over broadcast operands, two outputs."""
    k1, k2, x1, x2 = U.bcast_local_rank(ctx.nm, [k1, k2, x1, x2])
    a, b = threefry2x32(k1, k2, x1, x2)
    return [a, b]


@register("iota_2x32_shape")
def iota_2x32_shape_rule(ctx, *, shape):
    hi, lo = _iota_2x32(tuple(shape))
    lead = (1,) * ctx.nm
    return [hi.reshape(lead + hi.shape), lo.reshape(lead + lo.shape)]


from refsim.interpreter.rules import rbg  # noqa: E402  (rbg builds on the threefry helpers above)
