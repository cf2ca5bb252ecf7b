"""`python -m conformance export-bundle`: export drawn sharded programs with the installed JAX.

    python -m conformance export-bundle --out DIR --programs N [--seed S] [--devices D]

Programs are drawn from the sharded suite's strategy (`conformance.suites.sharded.strategy`, as
`python -m conformance hunt` draws them) in batches whose seeds follow from ``--seed``, so the
same seed, device count and JAX give the same programs. Each is exported with `jax.export`
(``jax.jit`` with its drawn in/out shardings, under its drawn partitioner, inside
``jax.set_mesh`` of its mesh of virtual CPU devices) and serialized; refsim runs the program from
the exporter's jaxpr for the expected outputs, and the exporting JAX runs its own artifact once
(``exporter_run`` in the manifest: agree, disagree or error), so that a runner can tell a
cross-version difference from a disagreement the exporter's own version has. A drawn program that JAX cannot export or refsim
cannot run is listed in the manifest's ``skipped`` with the reason, and another is drawn in its
place (at most ``4 * N + 8`` draws). The bundle's layout is `conformance.export.bundle`'s.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform as _platform
import random
import subprocess
import sys

import numpy as np

from conformance.arguments import Parser
from conformance.export import window
from conformance.export.bundle import BundleWriter, spec_to_data, update_programs
from xla_backend import platform as xplat

# None of these loads JAX: `main` configures the platform first.

__all__ = ["ExportResult", "export_bundle", "export_case", "export_function", "exporter_record", "main",
           "own_round_trips"]

BATCH = 8
_MAX_SEED = 2 ** 32


@dataclasses.dataclass
class ExportResult:
    """What `export_bundle` wrote: the folder, the programs exported, those skipped and why."""

    path: str
    programs: int
    skipped: list
    exporter: dict


def _commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def exporter_record() -> dict:
    """The exporting side: JAX's window record (`window.installed`), NumPy, Python, the platform and
    the project's commit."""
    import jax

    return dict(window.installed(), numpy=np.__version__, python=_platform.python_version(),
                platform=jax.devices()[0].platform, devices=jax.device_count(), commit=_commit())


def export_function(fn, *, mesh, args, in_shardings, out_shardings, partitioner: str = "shardy") -> tuple:
    """(serialized Exported bytes, StableHLO text, manifest fields) of
    ``jax.export.export(jax.jit(fn, in_shardings, out_shardings))`` for `args`, with refsim's `mesh`
    and NamedShardings (one per argument and per output; `fn` returns a tuple), exported under
    `partitioner` inside ``jax.set_mesh`` of the mesh."""
    import jax

    import xla_backend
    from refsim import compat

    ins = tuple(xla_backend.to_jax_sharding(s) for s in in_shardings)
    outs = tuple(xla_backend.to_jax_sharding(s) for s in out_shardings)
    jitted = jax.jit(fn, in_shardings=ins, out_shardings=outs)
    avals = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype, sharding=s) for a, s in zip(args, ins)]
    with compat.use_partitioner(partitioner), jax.set_mesh(xla_backend.jax_mesh(mesh)):
        exp = jax.export.export(jitted)(*avals)
    if len(exp.out_avals) != len(out_shardings):
        raise ValueError(f"the export has {len(exp.out_avals)} outputs and {len(out_shardings)} out_shardings")
    meta = {"partitioner": partitioner,
            "mesh": {"shape": [int(n) for n in mesh.axis_sizes], "names": list(mesh.axis_names),
                     "device_ids": np.asarray(mesh.device_ids).tolist(),
                     "axis_types": [t.value for t in mesh.axis_types]},
            "in_specs": [spec_to_data(s.spec) for s in in_shardings],
            "out_specs": [spec_to_data(s.spec) for s in out_shardings],
            "calling_convention_version": int(exp.calling_convention_version), "nr_devices": int(exp.nr_devices),
            "platforms": list(exp.platforms), "stablehlo_version": window.stablehlo_version(exp.mlir_module_serialized)}
    return bytes(exp.serialize()), exp.mlir_module(), meta


def export_case(case) -> tuple:
    """`export_function` of a drawn `ShardedProgram`, its manifest fields with the case's id, source
    text, ops, transform, axis types and comparison policies."""
    blob, text, meta = export_function(case.fn, mesh=case.mesh, args=case.args, in_shardings=case.in_shardings,
                                       out_shardings=case.out_shardings, partitioner=case.partitioner)
    meta.update(case_id=case.case_id, source=case.source, ops=list(case.ops), transform=case.transform,
                axis_types=case.axis_types, policies=[[str(k), float(v)] for k, v in case.policies])
    return blob, text, meta


def own_round_trips(path, devices: int = 8) -> list:
    """Run the bundle at `path` with this JAX itself (`conformance.export.run.run_outcomes`: in a
    child process, so a fatal CHECK in XLA ends only that program) and record each program's result
    in the manifest as ``exporter_run``: ``{"outcome": agree | disagree | error, "message": ...}``.
    A runner's disagreement on a program whose own round trip did not agree is no cross-version
    difference (`conformance.export.run`)."""
    from conformance.export.run import run_outcomes

    _, outcomes = run_outcomes(path, devices=devices)
    update_programs(path, {p.id: {"exporter_run": {"outcome": p.ran, "message": p.message}} for p in outcomes})
    return outcomes


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + next((ln for ln in str(e).splitlines() if ln.strip()), "")[:300]


def export_bundle(out, *, programs: int, seed: int = 0, devices: int = 8, say=print) -> ExportResult:
    """Draw and export `programs` sharded programs into a new bundle folder `out` (see the module)."""
    import refsim
    from conformance.suites import base
    from conformance.suites import sharded as suite_mod
    from conformance.verdict.compare import as_outputs

    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs={programs!r}; pass a positive whole number of programs.")
    writer = BundleWriter(out)
    xplat.configure("cpu", devices)
    exporter = exporter_record()
    master = random.Random(seed)
    skipped, drawn = [], 0
    strategy = suite_mod.strategy("sharded", None, devices)
    while len(writer.programs) < programs and drawn < 4 * programs + 8:
        batch_seed = master.randrange(_MAX_SEED)
        for case in base.draw(strategy, BATCH, batch_seed):
            if len(writer.programs) >= programs:
                break
            drawn += 1
            stage = "export"
            try:
                blob, text, meta = export_case(case)
                stage = "refsim"
                expected = [np.asarray(a) for a in as_outputs(case.run(refsim))]
            except Exception as e:  # noqa: BLE001 - not exportable here: recorded, another is drawn
                skipped.append({"case_id": case.case_id, "stage": stage, "error": _first_line(e),
                                "batch_seed": batch_seed})
                continue
            meta["batch_seed"] = batch_seed
            entry = writer.add(meta, exported=blob, module_text=text, inputs=case.args, expected=expected)
            say(f"{entry['id']} {case.case_id}")
    writer.finish(exporter=exporter, seed=seed, skipped=skipped)
    own_round_trips(writer.path, devices)
    return ExportResult(writer.path, len(writer.programs), skipped, exporter)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m conformance export-bundle",
                description="Export drawn sharded programs with this JAX (jax.export, with shardings) into a bundle "
                            "folder, with their inputs and refsim's expected outputs, for `run-bundle` under another "
                            "JAX.")
    ap.add_argument("--out", required=True, metavar="DIR", help="the bundle folder to write (new or empty)")
    ap.add_argument("--programs", type=int, default=20, help="programs to export (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    ap.add_argument("--devices", type=int, default=8, help="virtual CPU devices, the largest mesh drawn (default 8)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    for name in ("programs", "devices"):
        if getattr(args, name) < 1:
            print(f"error: --{name} {getattr(args, name)}: pass a whole number >= 1", file=sys.stderr)
            return 2
    if args.seed < 0:
        print(f"error: --seed {args.seed}: seeds are >= 0", file=sys.stderr)
        return 2
    try:
        res = export_bundle(args.out, programs=args.programs, seed=args.seed, devices=args.devices)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ex = res.exporter
    print(f"exported {res.programs} program(s) with jax {ex['jax']} (jaxlib {ex['jaxlib']}, calling convention "
          f"{ex['calling_convention_exported']}, StableHLO v{ex['stablehlo']['current']}) to {res.path}"
          + (f"; {len(res.skipped)} drawn program(s) skipped (see manifest.json 'skipped')" if res.skipped else ""))
    return 0 if res.programs else 1


if __name__ == "__main__":
    sys.exit(main())
