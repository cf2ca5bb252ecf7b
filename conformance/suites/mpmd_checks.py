"""The `mpmd` conformance suite: SPMD -> MPMD -> SPMD round trips on refsim and on xla_backend.

`check_mpmd(examples=, seed=)` draws `MpmdCase`s with hypothesis (meshes with an MPMD axis
of size 2-4 placed anywhere, specs that do and do not name it, pytrees of mixed dtypes,
thresholds giving one batch, several, or one per array), runs each on refsim and through
a backend runner (xla_backend in this process, or `multiprocess_runner()`: 2 processes x 4
devices under `python -m xla_backend launch`), and returns one `MpmdCaseResult` per case.
A case passes when refsim satisfies the stated properties (the round trip is the
identity; group arrays sit on `mpmd_mesh.unstack[k]` with the MPMD axis dropped from the
spec; results sit on the target sharding) and XLA agrees device by device, bit-exact.
Rerun one case: ``python -m conformance.suites.mpmd_checks --case '<case json>'``.

`multiprocess_runner`'s processes hand their outcomes back as data: a JSON file of layouts and
an ``.npz`` of shard values each, read with ``np.load(allow_pickle=False)``; nothing read back is
unpickled (`outcome_files` / `read_outcome_files`).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
from typing import Callable

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.strategies.specs import partition_specs
from conformance.verdict.compare import compare
import refsim
from refsim import mpmd
from refsim.layouts.mesh import Mesh
from refsim.layouts.named_sharding import NamedSharding
from refsim.layouts.partition_spec import PartitionSpec
from refsim.layouts.single_device import SingleDeviceSharding
from refsim.mpmd import MpmdMesh, filter_axes, plan
from xla_backend import distributed
from xla_backend import mpmd as xm
from xla_backend import platform
from xla_backend.convert import put_global, to_jax_sharding, to_refsim
from xla_backend.distributed import gather as gather_all
from xla_backend.launch import run_local

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

DTYPES = ("float32", "int32", "float16", "bool", "uint8", "int8", "complex64")
OTHER_AXES = ("x", "y")
THRESHOLD_KINDS = ("one", "several", "per-array")


def _spec_json(spec: PartitionSpec) -> list:
    return [list(p) if isinstance(p, tuple) else p for p in spec]


def _spec(entries) -> PartitionSpec:
    return PartitionSpec(*[tuple(p) if isinstance(p, list) else p for p in entries])


@dataclasses.dataclass(frozen=True)
class MpmdLeaf:
    """One array of a case: its shape and dtype, SPMD source spec, groups and spec in MPMD, SPMD target spec."""

    shape: tuple
    dtype: str
    src: tuple
    mesh_ids: tuple
    mpmd: tuple
    dst: tuple


@dataclasses.dataclass(frozen=True)
class MpmdCase:
    """A round-trip case: mesh (shape, names, MPMD axis, device positions), leaves, pytree kind, threshold."""

    mesh_shape: tuple
    axis_names: tuple
    mpmd_axis: str
    device_positions: tuple  # row-major over the mesh; positions into the backend's sorted device ids
    leaves: tuple
    tree: str  # "list" | "dict" | "nested"
    threshold: int | None
    threshold_kind: str
    value_seed: int

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "MpmdCase":
        d = json.loads(text)
        leaves = tuple(MpmdLeaf(tuple(l["shape"]), l["dtype"], tuple(l["src"]), tuple(l["mesh_ids"]), tuple(l["mpmd"]),
                                tuple(l["dst"])) for l in d.pop("leaves"))
        return cls(tuple(d.pop("mesh_shape")), tuple(d.pop("axis_names")), leaves=leaves,
                   device_positions=tuple(d.pop("device_positions")), **d)

    @property
    def case_id(self) -> str:
        return "mpmd-" + hashlib.sha1(self.to_json().encode()).hexdigest()[:10]

    def mesh(self, device_ids) -> Mesh:
        ids = np.asarray(device_ids, dtype=np.int64)[list(self.device_positions)].reshape(self.mesh_shape)
        return Mesh(self.mesh_shape, self.axis_names, device_ids=ids)

    def values(self) -> list:
        """Exact-friendly values: small integers (any reduction order gives the same bits)."""
        rng = np.random.default_rng(self.value_seed)
        out = []
        for leaf in self.leaves:
            raw = rng.integers(-8, 9, size=leaf.shape)
            dt = np.dtype(leaf.dtype)
            out.append((raw > 0) if dt == np.bool_ else (np.abs(raw) if dt.kind == "u" else raw).astype(dt))
        return out

    def tree_of(self, flat: list):
        """The case's pytree over `flat` (jax.tree_util flattens it back in this order)."""
        if self.tree == "list":
            return list(flat)
        if self.tree == "dict":
            return {f"l{i}": v for i, v in enumerate(flat)}
        half = (len(flat) + 1) // 2
        return {"a": list(flat[:half]), "b": tuple(flat[half:])}

    def describe(self) -> str:
        lines = [f"mesh {dict(zip(self.axis_names, self.mesh_shape))}, MPMD axis {self.mpmd_axis!r}, device "
                 f"positions {list(self.device_positions)}, {self.tree} pytree, threshold {self.threshold} "
                 f"({self.threshold_kind})"]
        for i, l in enumerate(self.leaves):
            lines.append(f"leaf {i}: {l.dtype}{list(l.shape)} src {_spec(l.src)!r} -> groups {list(l.mesh_ids)} "
                         f"{_spec(l.mpmd)!r} -> dst {_spec(l.dst)!r}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class MpmdCaseResult:
    case_id: str
    passed: bool
    message: str
    case: MpmdCase | None = None


# -- strategies ----------------------------------------------------------------------------------------
def _factors(mesh: Mesh, spec: PartitionSpec, ndim: int, drop=()) -> list:
    return [math.prod(mesh.axis_size(a) for a in spec.axes_of(d) if a not in drop) for d in range(ndim)]


def _sizes_in_order(mesh, leaves, mpmd_dim):
    bytes_ = []
    for l in leaves:
        sh = NamedSharding(mesh, _spec(l.src)).shard_shape(l.shape)
        bytes_.append(math.prod(sh) * np.dtype(l.dtype).itemsize * mpmd_dim)
    order = plan.interleaved_order(bytes_, [min(l.mesh_ids) if l.mesh_ids else 0 for l in leaves])
    return [bytes_[i] for i in order]


@st.composite
def mpmd_cases(draw, *, max_devices: int = 8, mpmd_sizes=(2, 3, 4), multiprocess: bool = False,
               max_leaves: int = 4, dtypes=DTYPES):
    """An MpmdCase. multiprocess=True: MPMD axis of size 2 over 2 x 4 devices, group k = process k's devices.

    The MPMD axis size is drawn from the `mpmd_sizes` that fit in `max_devices` (an MPMD mesh has
    at least two groups, so at least 2 devices are needed)."""
    fitting = tuple(s for s in mpmd_sizes if s <= max_devices)
    if not multiprocess and not fitting:
        raise InvalidArgument(f"max_devices={max_devices}: no MPMD axis size in mpmd_sizes={tuple(mpmd_sizes)} fits; "
                              "an MPMD mesh splits its devices into at least 2 groups, so pass max_devices >= 2 "
                              "and mpmd_sizes with a size <= max_devices.")
    pp = 2 if multiprocess else draw(st.sampled_from(fitting))
    if multiprocess:
        rest = draw(st.sampled_from([(4,), (2, 2), (1, 4)]))
    else:
        room = max_devices // pp
        n_other = draw(st.integers(0, 2))
        rest = tuple(draw(st.sampled_from([s for s in (1, 2, 4) if s <= room])) for _ in range(n_other))
        while math.prod(rest) > room:
            rest = rest[:-1]
    names = ("pp",) + OTHER_AXES[:len(rest)]
    pos = draw(st.integers(0, len(rest)))
    group_size = math.prod(rest)
    if multiprocess:
        grid = np.stack([np.asarray(draw(st.permutations(range(k * 4, k * 4 + 4)))) for k in range(2)])
    else:
        chosen = draw(st.permutations(range(max_devices)))[: pp * group_size]
        grid = np.asarray(chosen).reshape(pp, group_size)
    grid = np.moveaxis(grid.reshape((pp,) + rest), 0, pos)
    axis_names = names[1:pos + 1] + ("pp",) + names[pos + 1:]
    mesh_shape = grid.shape
    mesh = Mesh(mesh_shape, axis_names, device_ids=np.arange(grid.size).reshape(mesh_shape))
    n = draw(st.integers(1, max_leaves))
    kind = draw(st.sampled_from(THRESHOLD_KINDS if n >= 3 else ("one", "per-array")))
    leaves = []
    for _ in range(n):
        ndim = draw(st.integers(0, 3))
        src = draw(partition_specs(mesh, ndim))
        mpmd = draw(partition_specs(mesh, ndim))
        dst = draw(partition_specs(mesh, ndim))
        f = [math.lcm(a, b, c) for a, b, c in zip(_factors(mesh, src, ndim), _factors(mesh, mpmd, ndim, ("pp",)),
                                                   _factors(mesh, dst, ndim))]
        shape = tuple(fd * draw(st.integers(1, 2)) for fd in f)
        ids = draw(st.sets(st.integers(0, pp - 1), max_size=pp))
        leaves.append(MpmdLeaf(shape, draw(st.sampled_from(tuple(dtypes))), tuple(_spec_json(src)),
                               tuple(sorted(ids)), tuple(_spec_json(mpmd)), tuple(_spec_json(dst))))
    sizes = _sizes_in_order(mesh, leaves, pp)
    if kind == "per-array":
        threshold = 0
    elif kind == "several":
        threshold = sizes[0] + sizes[1]
    else:
        threshold = draw(st.sampled_from([None, sum(sizes)]))
    positions = tuple(int(p) for p in grid.ravel())
    return MpmdCase(mesh_shape, axis_names, "pp", positions, tuple(leaves), draw(st.sampled_from(("list", "dict", "nested"))),
                    threshold, kind, draw(st.integers(0, 2**31 - 1)))


def draw_cases(examples: int, seed: int, **kw) -> list:
    """`examples` distinct cases drawn deterministically from `seed`."""
    found: dict = {}

    @hseed(seed)
    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(mpmd_cases(**kw))
    def collect(case):
        found.setdefault(case.case_id, case)

    collect()
    return list(found.values())[:examples]


# -- running ---------------------------------------------------------------------------------------------
def _flat(tree, leaf_type):
    import jax  # not at the top: suites load before the platform is configured

    return jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, leaf_type))


def run_refsim(case: MpmdCase, device_ids) -> dict:
    """refsim's outcome: per leaf its groups' arrays, mpmd_idxs, and the final SPMD arrays."""
    mesh = case.mesh(device_ids)
    mm = mpmd.MpmdMesh(mesh, case.mpmd_axis)
    vals = case.values()
    spmd = [refsim.device_put(v, NamedSharding(mesh, _spec(l.src))) for v, l in zip(vals, case.leaves)]
    shards = [mpmd.MpmdSharding(mm, l.mesh_ids, _spec(l.mpmd)) for l in case.leaves]
    out = _flat(mpmd.spmd_to_mpmd_reshard(mm, case.tree_of(spmd), case.tree_of(shards), case.threshold),
                mpmd.MpmdArray)
    groups = [{k: a.group_array(k) for k in a.addressable_mpmd_idxs} for a in out]
    idxs = [a.mpmd_idxs for a in out]
    dst = [NamedSharding(mesh, _spec(l.dst)) for l in case.leaves]
    final = _flat(mpmd.mpmd_to_spmd_reshard(mm, case.tree_of(out), case.tree_of(dst), case.threshold), refsim.Array)
    return {"groups": groups, "mpmd_idxs": idxs, "final": final, "consumed": all(a.is_deleted() for a in out)}


def run_xla(case: MpmdCase, device_ids, *, gather: bool = False) -> dict:
    """xla_backend's outcome of `case` (this process's groups; final arrays gathered when `gather`)."""
    mesh = case.mesh(device_ids)
    mm = xm.MpmdMesh(mesh, case.mpmd_axis)
    vals = case.values()
    spmd = [put_global(v, NamedSharding(mesh, _spec(l.src))) for v, l in zip(vals, case.leaves)]
    shards = [xm.MpmdSharding(mm, l.mesh_ids, _spec(l.mpmd)) for l in case.leaves]
    out = _flat(xm.spmd_to_mpmd_reshard(mm, case.tree_of(spmd), case.tree_of(shards), case.threshold), xm.MpmdArray)
    consumed_in = all(a.is_deleted() for a in spmd)
    groups = [{k: to_refsim(a.group_array(k)) for k in a.addressable_mpmd_idxs} for a in out]
    idxs = [a.mpmd_idxs for a in out]
    dst = [to_jax_sharding(NamedSharding(mesh, _spec(l.dst))) for l in case.leaves]
    import jax  # not at the top: suites load before the platform is configured

    back = jax.tree_util.tree_leaves(xm.mpmd_to_spmd_reshard(mm, case.tree_of(out), case.tree_of(dst), case.threshold))
    if gather:
        final = [gather_all(b) for b in back]
    else:
        final = [to_refsim(b) for b in back]
    consumed = consumed_in and all(a.is_deleted() for a in out if a.is_partially_addressable)
    return {"groups": groups, "mpmd_idxs": idxs, "final": final, "consumed": consumed}


def in_process_runner(cases) -> tuple[list, dict]:
    """Run cases on xla_backend in this process: (device ids, {case_id: outcome or error text})."""
    import jax  # not at the top: suites load before the platform is configured

    ids = sorted(d.id for d in jax.devices())
    outcomes = {}
    for case in cases:
        try:
            outcomes[case.case_id] = run_xla(case, ids)
        except Exception as e:  # reported per case, not raised
            outcomes[case.case_id] = f"{type(e).__name__}: {e}"
    return ids, outcomes


def multiprocess_runner(processes: int = 2, devices_per_process: int = 4, timeout_s: float = 300) -> Callable:
    """A runner that runs all cases in one `processes` x `devices_per_process` launch (jax.distributed)."""
    def run(cases):
        with tempfile.TemporaryDirectory() as tmp:
            spec = os.path.join(tmp, "cases.json")
            with open(spec, "w") as f:
                json.dump([c.to_json() for c in cases], f)
            run_local([sys.executable, "-m", "conformance.suites.mpmd_checks", "--worker", spec, tmp],
                      processes=processes, devices_per_process=devices_per_process, timeout_s=timeout_s)
            parts = [read_outcome_files(os.path.join(tmp, f"process_{p}")) for p in range(processes)]
        ids = parts[0]["device_ids"]
        merged = {}
        for case in cases:
            outs = [p["outcomes"][case.case_id] for p in parts]
            errs = [o for o in outs if isinstance(o, str)]
            if errs:
                merged[case.case_id] = errs[0]
                continue
            merged[case.case_id] = {
                "groups": [{k: a for o in outs for k, a in o["groups"][i].items()} for i in range(len(case.leaves))],
                "mpmd_idxs": outs[0]["mpmd_idxs"], "final": outs[0]["final"],
                "consumed": all(o["consumed"] for o in outs),
            }
        return ids, merged

    return run


def _worker(spec_path: str, out_dir: str) -> None:
    pid, _ = distributed.initialize()
    import jax  # not at the top: suites load before the platform is configured

    ids = [d.id for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id))]
    with open(spec_path) as f:
        cases = [MpmdCase.from_json(t) for t in json.load(f)]
    outcomes = {}
    for case in cases:
        try:
            outcomes[case.case_id] = run_xla(case, ids, gather=True)
        except Exception as e:
            outcomes[case.case_id] = f"{type(e).__name__}: {e}"
    outcome_files(os.path.join(out_dir, f"process_{pid}"), ids, outcomes)


# -- outcomes on disk: JSON and .npz, nothing unpickled ---------------------------------------------------
def outcome_files(stem: str, device_ids, outcomes: dict) -> None:
    """Write `outcomes` ({case_id: outcome dict of `run_xla` or error text}) and `device_ids` as
    ``STEM.json`` (layouts, ids, flags) and ``STEM.npz`` (every shard's values; no object arrays).
    An outcome that cannot be written as data is written as its error text."""
    arrays: dict = {}
    cases = {}
    for cid, out in outcomes.items():
        if isinstance(out, str):
            cases[cid] = out
            continue
        before = set(arrays)
        try:
            cases[cid] = {"groups": [{str(int(k)): _array_json(a, arrays) for k, a in g.items()} for g in out["groups"]],
                          "mpmd_idxs": [[int(i) for i in idx] for idx in out["mpmd_idxs"]],
                          "final": [_array_json(a, arrays) for a in out["final"]], "consumed": bool(out["consumed"])}
        except (TypeError, ValueError) as e:
            for key in set(arrays) - before:
                del arrays[key]
            cases[cid] = f"{type(e).__name__}: the outcome cannot be written as data: {e}"
    with open(stem + ".npz", "wb") as f:
        np.savez(f, allow_pickle=False, **arrays)
    with open(stem + ".json", "w") as f:
        json.dump({"device_ids": [int(i) for i in device_ids], "outcomes": cases}, f)


def read_outcome_files(stem: str) -> dict:
    """{"device_ids": [...], "outcomes": {case_id: outcome dict or error text}} from `outcome_files`'
    ``STEM.json`` and ``STEM.npz``, arrays as refsim.Array (read without unpickling anything)."""
    with open(stem + ".json") as f:
        data = json.load(f)
    with np.load(stem + ".npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    outcomes = {}
    for cid, out in data["outcomes"].items():
        if isinstance(out, str):
            outcomes[cid] = out
            continue
        outcomes[cid] = {"groups": [{int(k): _array_from(a, arrays) for k, a in g.items()} for g in out["groups"]],
                         "mpmd_idxs": [tuple(idx) for idx in out["mpmd_idxs"]],
                         "final": [_array_from(a, arrays) for a in out["final"]], "consumed": bool(out["consumed"])}
    return {"device_ids": [int(i) for i in data["device_ids"]], "outcomes": outcomes}


def _array_json(a: refsim.Array, arrays: dict) -> dict:
    shards = []
    for sh in a.shards:
        data = np.asarray(sh.data)
        if data.dtype.hasobject:
            raise TypeError(f"device {sh.device_id}'s shard has dtype {data.dtype}, which only pickle could store")
        key = f"k{len(arrays)}"
        arrays[key] = data
        shards.append({"device_id": int(sh.device_id), "index": [[i.start, i.stop, i.step] if isinstance(i, slice)
                                                                else int(i) for i in sh.index],
                       "data": key, "replica_id": int(sh.replica_id)})
    return {"shape": [int(n) for n in a.shape], "dtype": np.dtype(a.dtype).str, "sharding": _sharding_json(a.sharding),
            "shards": shards}


def _array_from(d: dict, arrays: dict) -> refsim.Array:
    shards = [refsim.Shard(int(sh["device_id"]), tuple(slice(*i) if isinstance(i, list) else int(i) for i in sh["index"]),
                           arrays[sh["data"]], int(sh["replica_id"])) for sh in d["shards"]]
    return refsim.Array(tuple(d["shape"]), np.dtype(d["dtype"]), _sharding_from(d["sharding"]), shards)


def _sharding_json(s) -> dict:
    if isinstance(s, SingleDeviceSharding):
        return {"single_device": s.device_id, "memory_kind": s.memory_kind}
    if not (isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh)) or s.logical_device_ids is not None:
        raise TypeError(f"a result's sharding {s!r} has no data form here (NamedSharding on a Mesh, "
                        "SingleDeviceSharding)")
    spec = _spec_json(s.spec)
    if not all(p is None or isinstance(p, str) or (isinstance(p, list) and all(isinstance(n, str) for n in p))
               for p in spec):
        raise TypeError(f"a result's spec {s.spec!r} names something other than mesh axes")
    m = s.mesh
    return {"mesh_shape": [int(n) for n in m.shape.values()], "axis_names": list(m.axis_names),
            "device_ids": np.asarray(m.device_ids).ravel().tolist(), "axis_types": [t.name for t in m.axis_types],
            "spec": spec, "unreduced": sorted(s.spec.unreduced), "reduced": sorted(s.spec.reduced),
            "memory_kind": s.memory_kind}


def _sharding_from(d: dict):
    mk = d.get("memory_kind")
    mk = None if mk in (None, "device") else mk
    if "single_device" in d:
        return SingleDeviceSharding(int(d["single_device"]), memory_kind=mk)
    shape = tuple(int(n) for n in d["mesh_shape"])
    mesh = Mesh(shape, tuple(d["axis_names"]), device_ids=np.asarray(d["device_ids"], dtype=np.int64).reshape(shape),
                axis_types=tuple(d["axis_types"]))
    spec = PartitionSpec(*_spec(d["spec"]), unreduced=frozenset(d["unreduced"]), reduced=frozenset(d["reduced"]))
    return NamedSharding(mesh, spec, memory_kind=mk)


# -- checking ---------------------------------------------------------------------------------------------
def refsim_properties(case: MpmdCase, device_ids, ref: dict) -> list:
    """Stated properties of refsim's outcome; a list of violations (empty when all hold)."""
    bad = []
    mesh = case.mesh(device_ids)
    mm = MpmdMesh(mesh, case.mpmd_axis)
    for i, (leaf, v) in enumerate(zip(case.leaves, case.values())):
        want = tuple(leaf.mesh_ids) or (0,)
        if tuple(ref["mpmd_idxs"][i]) != want:
            bad.append(f"leaf {i}: mpmd_idxs {ref['mpmd_idxs'][i]} != {want}")
        spec = filter_axes(_spec(leaf.mpmd), {case.mpmd_axis})
        for k, a in ref["groups"][i].items():
            if a.sharding != NamedSharding(mm.unstack[k], spec):
                bad.append(f"leaf {i} group {k}: sharding {a.sharding!r}, expected spec {spec!r} on unstack[{k}]")
            if not np.array_equal(np.asarray(a), v):
                bad.append(f"leaf {i} group {k}: value differs from the SPMD input")
        f = ref["final"][i]
        if f.sharding != NamedSharding(mesh, _spec(leaf.dst)):
            bad.append(f"leaf {i}: final sharding {f.sharding!r} != target")
        if not np.array_equal(np.asarray(f), v) or f.dtype != v.dtype:
            bad.append(f"leaf {i}: SPMD -> MPMD -> SPMD is not the identity")
    if not ref["consumed"]:
        bad.append("refsim: the MpmdArrays were not consumed by mpmd_to_spmd_reshard")
    return bad


def compare_case(case: MpmdCase, device_ids, ref: dict, xla) -> str:
    """'' when refsim's properties hold and XLA agrees; else a report naming each difference."""
    if isinstance(xla, str):
        return f"xla_backend raised {xla}"
    bad = refsim_properties(case, device_ids, ref)
    for i in range(len(case.leaves)):
        if tuple(xla["mpmd_idxs"][i]) != tuple(ref["mpmd_idxs"][i]):
            bad.append(f"leaf {i}: mpmd_idxs refsim {ref['mpmd_idxs'][i]}, xla {xla['mpmd_idxs'][i]}")
        if set(xla["groups"][i]) != set(ref["groups"][i]):
            bad.append(f"leaf {i}: groups refsim {sorted(ref['groups'][i])}, xla {sorted(xla['groups'][i])}")
        for k in sorted(set(xla["groups"][i]) & set(ref["groups"][i])):
            res = compare(ref["groups"][i][k], xla["groups"][i][k])
            if not res.ok:
                bad.append(f"leaf {i} group {k}:\n{res.report()}")
        res = compare(ref["final"][i], xla["final"][i])
        if not res.ok:
            bad.append(f"leaf {i} final SPMD array:\n{res.report()}")
    if not xla["consumed"]:
        bad.append("xla_backend: inputs were not deleted (consumed) by the reshards")
    return "\n".join(bad)


def check_mpmd(*, examples: int = 20, seed: int = 0, backend_runner: Callable | None = None,
               multiprocess: bool = False, cases=None) -> list:
    """Run `examples` drawn round-trip cases (or `cases`) on refsim and a backend; one MpmdCaseResult each.

    backend_runner(cases) -> (device ids, {case_id: outcome dict or error text});
    default `in_process_runner`. multiprocess=True draws cases fit for 2 processes x 4
    devices (use it with `multiprocess_runner()`).
    """
    if cases is None:
        cases = draw_cases(examples, seed, multiprocess=multiprocess)
    runner = backend_runner or in_process_runner
    ids, outcomes = runner(cases)
    results = []
    for case in cases:
        try:
            ref = run_refsim(case, ids)
            msg = compare_case(case, ids, ref, outcomes.get(case.case_id, "no outcome from the backend runner"))
        except Exception as e:
            msg = f"refsim raised {type(e).__name__}: {e}"
        if msg:
            msg = f"{case.describe()}\n{msg}\nrerun: python -m conformance.suites.mpmd_checks --case '{case.to_json()}'"
        results.append(MpmdCaseResult(case.case_id, not msg, msg, case))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.suites.mpmd_checks")
    ap.add_argument("--worker", nargs=2, metavar=("CASES_JSON", "OUT_DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--case", help="one case as JSON (from a failure report)")
    from conformance import validation

    ap.add_argument("--examples", type=validation.option("--examples", integer=True, low=1), default=20)
    ap.add_argument("--seed", type=validation.option("--seed", integer=True, low=0), default=0)
    ap.add_argument("--multiprocess", action="store_true", help="2 processes x 4 devices")
    args = ap.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0

    if not args.multiprocess:
        platform.configure("cpu", 8)
    cases = [MpmdCase.from_json(args.case)] if args.case else None
    runner = multiprocess_runner() if args.multiprocess else None
    results = check_mpmd(examples=args.examples, seed=args.seed, backend_runner=runner,
                         multiprocess=args.multiprocess, cases=cases)
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'} {r.case_id}" + ("" if r.passed else "\n" + r.message))
    print(f"{sum(r.passed for r in results)}/{len(results)} passed")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
