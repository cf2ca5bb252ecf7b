"""The layouts suite: refsim's layouts against JAX's on the live platform.

For drawn meshes (any shape, device order), specs (tuples in and out of mesh order) and
shapes: `NamedSharding` (devices_indices_map, shard_shape, is_fully_replicated, HLO text,
HloSharding parse round trip, Shardy text, and the data each device holds after
`device_put`), `PmapSharding` (the ShardingSpec family) against `jax.pmap`'s outputs, and
`SingleDeviceSharding`. Every check compares by device id.
"""
from __future__ import annotations

import functools
import zlib

import numpy as np
from hypothesis import strategies as st

from conformance.cases import mesh_id
from conformance.strategies import meshes, partition_specs, sharded_shapes
from conformance.suites.base import CheckTask, Outcome, draw, flatten
from conformance.verdict.compare import compare
import refsim
from refsim import compat as _compat
from refsim import device_put
from refsim.layouts.hlo_sharding import HloSharding, hlo_to_named
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.pmap_spec import PmapSharding
from xla_backend import convert

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

NAME = "layouts"


# Module level: st.composite reads the function's source each time it decorates one (~3 ms).
@st.composite
def _named_case(d, devices: int):
    m = d(meshes(max_devices=devices))
    ndim = d(st.integers(0, 3))
    spec = d(partition_specs(m, ndim))
    shape = d(sharded_shapes(m, spec, ndim=ndim))
    return m, spec, shape


def _named_cases(devices: int):
    return _named_case(devices)


@st.composite
def _pmap_case(d, devices: int):
    n = d(st.integers(1, devices))
    order = d(st.permutations(range(devices)))[:n]
    rank = d(st.integers(0, 2))
    out_axis = d(st.integers(0, rank))
    local = tuple(d(st.integers(1, 3)) for _ in range(rank))
    return n, list(order), local, out_axis


def _pmap_cases(devices: int):
    return _pmap_case(devices)


def _norm(index_map, shape) -> dict:
    def one(ix):
        return tuple(i.indices(n)[:2] if isinstance(i, slice) else (int(i), int(i) + 1) for i, n in zip(ix, shape))
    return {int(getattr(k, "id", k)): one(v) for k, v in index_map.items()}


def _data(shape):
    return np.arange(int(np.prod(shape, dtype=int)), dtype=np.int32).reshape(shape)


def check_named(draws: list, xla) -> Outcome:
    """Every NamedSharding view of each (mesh, spec, shape) against JAX's for the same devices."""
    for mesh, spec, shape in draws:
        where = f"mesh {dict(mesh.shape)} ids {np.asarray(mesh.device_ids).ravel().tolist()} spec {spec!r} shape {shape}"
        s = NamedSharding(mesh, spec)
        js = convert.to_jax_sharding(s)
        ndim = len(shape)
        got, want = _norm(s.devices_indices_map(shape), shape), _norm(js.devices_indices_map(shape), shape)
        if got != want:
            return Outcome("fail", f"devices_indices_map differs for {where}:\nrefsim {got}\njax    {want}", len(draws))
        if tuple(s.shard_shape(shape)) != tuple(js.shard_shape(shape)):
            return Outcome("fail", f"shard_shape: refsim {s.shard_shape(shape)}, jax {js.shard_shape(shape)} for {where}")
        if s.is_fully_replicated != js.is_fully_replicated:
            return Outcome("fail", f"is_fully_replicated: refsim {s.is_fully_replicated}, jax {js.is_fully_replicated} "
                                   f"for {where}")
        jtext = _compat.jax_hlo_sharding_text(js, ndim)
        if str(s.to_hlo(ndim)) != jtext:
            return Outcome("fail", f"HLO text for {where}:\nrefsim {s.to_hlo(ndim)}\njax    {jtext}")
        parsed = HloSharding.parse(jtext)
        if hlo_to_named(parsed, mesh).to_hlo(ndim) != parsed:
            return Outcome("fail", f"HloSharding.parse({jtext!r}) does not round-trip through NamedSharding ({where})")
        sdy_j = _compat.jax_sdy_sharding_text(js, ndim)
        sdy_r = s.to_shardy(ndim, mesh_name=None)
        if sdy_r != sdy_j:
            return Outcome("fail", f"Shardy text for {where}:\nrefsim {sdy_r}\njax    {sdy_j}")
        x = _data(shape)
        res = compare(refsim.device_put(x, s), xla.device_put(x, s))
        if not res.ok:
            return Outcome("fail", f"device_put data for {where}:\n{res.report()}", len(draws))
    return Outcome("pass", examples=len(draws))


def check_pmap(draws: list, xla) -> Outcome:
    """PmapSharding.default for pmap's outputs against the shards `jax.pmap` puts on each device."""
    import jax  # here, not at the top: the runner imports the suites before it configures the platform

    for n, order, local, out_axis in draws:
        devs = [jax.devices()[i] for i in order]
        x = _data((n,) + local)
        out = jax.pmap(lambda v: v + 0, out_axes=out_axis, devices=devs)(x)
        ps = PmapSharding.default(out.shape, out_axis, order)
        where = f"n {n} devices {order} local {local} out_axes {out_axis}"
        got = _norm(ps.devices_indices_map(out.shape), out.shape)
        want = _norm(out.sharding.devices_indices_map(out.shape), out.shape)
        if got != want:
            return Outcome("fail", f"PmapSharding.devices_indices_map for {where}:\nrefsim {got}\njax    {want}")
        ours = device_put(np.moveaxis(x, 0, out_axis), ps)
        for shard in out.addressable_shards:
            mine = np.asarray(ours.shard(shard.device.id).data)
            theirs = np.squeeze(np.asarray(shard.data), out_axis)
            if mine.shape != theirs.shape or not np.array_equal(mine, theirs):
                return Outcome("fail", f"device {shard.device.id} holds {theirs.tolist()} under jax.pmap, "
                                       f"refsim {mine.tolist()} ({where})")
    return Outcome("pass", examples=len(draws))


def check_single(ids: list, xla) -> Outcome:
    """SingleDeviceSharding: the whole array on one device, placed by id."""
    x = _data((3, 2))
    for d in ids:
        s = refsim.SingleDeviceSharding(d)
        got, want = _norm(s.devices_indices_map(x.shape), x.shape), _norm(
            convert.to_jax_sharding(s).devices_indices_map(x.shape), x.shape)
        if got != want:
            return Outcome("fail", f"SingleDeviceSharding({d}).devices_indices_map: refsim {got}, jax {want}")
        res = compare(refsim.device_put(x, s), xla.device_put(x, s))
        if not res.ok:
            return Outcome("fail", f"SingleDeviceSharding({d}) placement:\n{res.report()}")
    return Outcome("pass", examples=len(ids))


def task_chunks(*, examples: int, seed: int, devices: int):
    """The suite's tasks, one list per layout type as it is drawn."""
    groups: dict = {}
    for mesh, spec, shape in draw(_named_cases(devices), examples * 3, seed ^ zlib.crc32(b"named")):
        groups.setdefault(f"named_sharding[ndim={len(shape)},mesh={mesh_id(mesh)}]", []).append((mesh, spec, shape))
    yield [CheckTask(cid, NAME, "NamedSharding", "int32", functools.partial(check_named, d)) for cid, d in groups.items()]
    groups = {}
    for case in draw(_pmap_cases(devices), examples, seed ^ zlib.crc32(b"pmap")):
        groups.setdefault(f"pmap_sharding[n={case[0]},out_axes={case[3]}]", []).append(case)
    yield [CheckTask(cid, NAME, "PmapSharding", "int32", functools.partial(check_pmap, d)) for cid, d in groups.items()]
    yield [CheckTask(f"single_device[devices={devices}]", NAME, "SingleDeviceSharding", "int32",
                     functools.partial(check_single, list(range(devices))))]


def tasks(*, examples: int, seed: int, devices: int) -> list:
    return flatten(task_chunks(examples=examples, seed=seed, devices=devices))
