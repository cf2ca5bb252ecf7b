"""Per-process views on real JAX processes, checked against refsim's simulated ones.

Run on every process of a multi-process run (`python -m xla_backend launch --processes 2
-- python -m xla_backend.process_views --json out_{process_id}.json`). Each process
compares, for several meshes, device orders and specs: which process owns each device,
`is_fully_addressable`, addressable devices, `Mesh.local_mesh`, the global shape that
host-local data implies, `jax.make_array_from_process_local_data` and
`multihost_utils.host_local_array_to_global_array` / `global_array_to_host_local_array`
— JAX's answers on this process against `refsim.layouts.process` looking from the same
process. Host-local data is a deterministic function of the process index, so every
process knows what the others hold and refsim can build the whole array.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback

import numpy as np

CASES = [  # (mesh shape, axis names, device order, spec entries, global shape for make_array)
    ((2, 4), ("x", "y"), "default", ("x", None), (8, 4)),
    ((2, 4), ("x", "y"), "default", (("x", "y"),), (16, 2)),
    ((2, 4), ("x", "y"), "default", (None, "y"), (2, 8)),
    ((2, 4), ("x", "y"), "default", (), (4, 4)),
    ((4, 2), ("x", "y"), "transposed", ("x", "y"), (8, 4)),
    ((8,), ("x",), "reversed", ("x",), (16,)),
    ((2, 4), ("x", "y"), "reversed", ("y", "x"), (8, 4)),
    # processes interleaved: no local sub-cube, and a non-uniform dim 1
    ((2, 4), ("x", "y"), "interleaved", ("x", "y"), (8, 8)),
    ((2, 4), ("x", "y"), "interleaved", ("x", None), (8, 8)),
    ((4, 2), ("x", "y"), "transposed", (None, ("y", "x")), (4, 8)),
]


def local_data(process_index: int, shape) -> np.ndarray:
    """The host-local array process `process_index` holds: distinct values per process."""
    n = int(np.prod(shape, dtype=np.int64))
    return (np.arange(n, dtype=np.float32) + 1000.0 * process_index).reshape(shape)


def _one_case(case, pmap_r, me: int) -> dict:
    import jax
    from jax.experimental import multihost_utils as mu

    from refsim.layouts import process as RP
    from refsim.layouts.named_sharding import NamedSharding
    from refsim.layouts.partition_spec import PartitionSpec
    from xla_backend import convert, distributed, meshes

    shape, names, order, spec_entries, gshape = case
    if order == "interleaved":  # alternate the processes' devices along the last mesh axis
        by_proc = [sorted(d.id for d in jax.devices() if d.process_index == p) for p in range(jax.process_count())]
        order = np.array([i for group in zip(*by_proc) for i in group]).reshape(shape)
    rmesh = meshes.mesh(shape, names, order)
    jmesh = meshes.jax_mesh(rmesh)
    rs = NamedSharding(rmesh, PartitionSpec(*spec_entries))
    js = convert.to_jax_sharding(rs)
    out = {"case": repr(case[:4])}
    out["fully_addressable"] = [js.is_fully_addressable, pmap_r.is_fully_addressable(rs, me)]
    out["addressable"] = [sorted(d.id for d in js.addressable_devices), sorted(pmap_r.addressable_devices(rs, me))]
    try:
        jl = jmesh.local_mesh.device_ids.tolist()
    except ValueError as e:
        jl = f"ValueError: {e}"[:60]
    try:
        rl = pmap_r.local_mesh(rmesh, me).device_ids.tolist()
    except ValueError as e:
        rl = f"ValueError: {e}"[:60]
    out["local_mesh"] = [jl, rl]
    owners = sorted({pmap_r.process_of(d) for d in rmesh.device_ids.ravel().tolist()})
    # make_array_from_process_local_data with the global shape inferred from local data
    lshape = tuple(pmap_r.num_addressable_indices(rs, i, gshape, me) for i in range(len(gshape)))
    mine = local_data(me, lshape)
    try:
        jarr = jax.make_array_from_process_local_data(js, mine)
    except ValueError as e:
        jarr = e
    try:
        rarr = RP.make_array_from_process_local_data(rs, {p: local_data(p, lshape) for p in owners},
                                                     processes=pmap_r)
    except ValueError as e:
        rarr = e
    if isinstance(jarr, Exception) or isinstance(rarr, Exception):  # both must refuse, alike
        out["make_array_error"] = [type(jarr).__name__, type(rarr).__name__]
    else:
        out["make_array_shape"] = [list(jarr.shape), list(rarr.shape)]
        out["make_array_shards"] = _same_shards(distributed.gather(jarr), rarr)
    # host-local <-> global through the local mesh
    if isinstance(rl, list):
        lshape2 = tuple(int(n) for n in RP.local_to_global_dims(
            rmesh, pmap_r.local_mesh(rmesh, me), rs.spec, gshape, False))
        jglob = mu.host_local_array_to_global_array(local_data(me, lshape2), jmesh, rs.spec.to_jax())
        rglob = RP.host_local_array_to_global_array({p: local_data(p, lshape2) for p in owners}, rmesh,
                                                    rs.spec, processes=pmap_r)
        out["host_to_global_shards"] = _same_shards(distributed.gather(jglob), rglob)
        jback = mu.global_array_to_host_local_array(jglob, jmesh, rs.spec.to_jax())
        rback = RP.global_array_to_host_local_array(rglob, rmesh, rs.spec, processes=pmap_r)[me]
        out["global_to_host"] = bool(np.array_equal(np.asarray(jback), rback)) and list(jback.shape) == list(rback.shape)
    return out


def _same_shards(a, b) -> bool:
    ours = {s.device_id: s for s in b.shards}
    return all(s.device_id in ours and np.array_equal(s.data, ours[s.device_id].data)
               and tuple(s.index) == tuple(ours[s.device_id].index) for s in a.shards) and len(a.shards) == len(ours)


def run() -> dict:
    """Every case on this process; returns the report (agreement per check)."""
    import jax

    from refsim.layouts.process import ProcessMap
    from xla_backend import distributed

    me, count = distributed.initialize()
    pmap_r = ProcessMap.from_jax()
    report = {"process_id": me, "process_count": count,
              "contiguous": pmap_r == ProcessMap.contiguous([d.id for d in jax.devices()], count),
              "local_devices": sorted(d.id for d in jax.local_devices()), "cases": []}
    for case in CASES:
        try:
            report["cases"].append(_one_case(case, pmap_r, me))
        except Exception as e:  # record and go on: the report names the failing case
            report["cases"].append({"case": repr(case[:4]), "error": f"{type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()})
    return report


def agree(report: dict) -> list[str]:
    """The checks of a report where JAX and refsim disagree (empty when all agree)."""
    bad = [] if report.get("contiguous") else ["process numbering is not contiguous"]
    for c in report["cases"]:
        if "error" in c:
            bad.append(f"{c['case']}: {c['error']}")
            continue
        for k, v in c.items():
            if k == "case":
                continue
            ok = v if isinstance(v, bool) else (v[0] == v[1] or all(
                isinstance(x, str) and x.startswith("ValueError") for x in v))
            if not ok:
                bad.append(f"{c['case']} {k}: jax {v[0]!r} refsim {v[1]!r}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xla_backend.process_views")
    ap.add_argument("--json", help="write the report here ({process_id} is filled in)")
    args = ap.parse_args(argv)
    report = run()
    bad = agree(report)
    report["disagreements"] = bad
    if args.json:
        with open(args.json.format(process_id=report["process_id"]), "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    print(f"process {report['process_id']}: {len(report['cases'])} cases, {len(bad)} disagreements")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
