"""The `rbg` and `unsafe_rbg` PRNG impls (jax/_src/random/rbg.py), key_shape (4,) uint32.

* seed: the threefry seed words twice, (hi, lo, hi, lo).
* rbg split / fold_in: threefry split / fold_in of each half key (words 0:2 and 2:4).
* unsafe_rbg split: RngBitGenerator of shape (10 * n, 4) u32, rows 0, 10, 20, ... are the
  new keys; unsafe_rbg fold_in: key ^ row 9 of RngBitGenerator(seed(msg), (10, 4)).
* random_bits (both): RngBitGenerator(key, shape, uint{bit_width}).

JAX batches rng_bit_generator over a batch of keys by generating from the FIRST key a
result of shape (batch, *shape) (jax/_src/lax/control_flow/loops.py,
_rng_bit_generator_batching_rule), so an array of rbg keys draws from its first key only;
refsim does the same per device (the mesh dims are devices, not a vmap batch).
"""
from __future__ import annotations

import numpy as np

from refsim import compat
from refsim.interpreter.rules import _util as U
from refsim.interpreter.rules import random as R
from refsim.interpreter.rules.rng_bit_generator import rng_bit_generator


class _Impl:
    key_shape = (4,)

    def __init__(self, name):
        self.name = name


def wrap(name: str, data: np.ndarray) -> np.ndarray:
    """uint32 data (..., 4) as refsim keys of impl `name` with shape (...)."""
    data = np.ascontiguousarray(np.asarray(data, np.uint32))
    return data.view(compat.key_numpy_dtype(_Impl(name)))[..., 0]


def seed(name, seeds):
    hi, lo = R.seed_words(seeds)
    return wrap(name, np.stack([hi, lo, hi, lo], axis=-1))


def _first_key_bits(data, nm, shape, dtype):
    """Bits of shape data.shape[nm:-1] + shape per device, all from the device's first key."""
    lead, local = data.shape[:nm], data.shape[nm:-1]
    first = data.reshape(lead + (-1, 4))[..., 0, :]
    _, bits = rng_bit_generator(first, local + tuple(shape), dtype)
    return bits


def random_bits(keys, nm, bit_width, shape):
    data = keys[R.impl_name(keys)]
    return _first_key_bits(data, nm, shape, np.dtype(f"u{bit_width // 8}"))


def _halves(data):
    return R.make_keys(data[..., 0], data[..., 1]), R.make_keys(data[..., 2], data[..., 3])


def _join(name, h0, h1):
    return wrap(name, np.concatenate([h0[R._THREEFRY], h1[R._THREEFRY]], axis=-1))


def split(keys, nm, shape):
    name = R.impl_name(keys)
    data = keys[name]
    if name == "rbg":
        h0, h1 = _halves(data)
        return _join(name, R.split(h0, shape), R.split(h1, shape))
    num = int(np.prod(shape, dtype=np.int64))
    rows = _first_key_bits(data, nm, (10 * num, 4), np.uint32)[..., ::10, :]
    return wrap(name, rows.reshape(data.shape[:-1] + tuple(shape) + (4,)))


def fold_in(keys, nm, msgs):
    name = R.impl_name(keys)
    keys, msgs = U.bcast_local_rank(nm, [keys, msgs])
    data = keys[name]
    if name == "rbg":
        h0, h1 = _halves(data)
        return _join(name, R.fold_in(h0, msgs), R.fold_in(h1, msgs))
    # seed(msg) batched over msgs: the first message's seed draws for all (see module doc)
    seeds = seed(name, msgs.astype(np.uint32))[name]
    rows = _first_key_bits(seeds, nm, (10, 4), np.uint32)[..., 9, :]
    return wrap(name, data ^ rows)
