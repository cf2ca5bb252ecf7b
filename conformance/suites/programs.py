"""The programs suite: whole programs, from the strategies' 18 families and the 69-program corpus.

Strategy families (`conformance.strategies.programs.FAMILIES`) compose collectives with
elementwise / structural ops, scan / while / cond / switch, grad, vmap, nested shard_map,
jit with shardings, sharding constraints and resharding between device orders; each is
drawn `examples` times, and each draw runs with exact-friendly data and with NaN, ±inf and -0
mixed in (`conformance.suites.base.PROGRAM_DATA`). Every corpus program (`conformance.cases.corpus.PROGRAMS`) runs with
two input seeds; one XLA:CPU cannot run is checked against its NumPy `reference` and
reported unsupported on this platform.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib

import numpy as np

from conformance.report.failure import Failure
from conformance.strategies import meshes
from conformance.strategies.programs import FAMILIES, PROGRAM_DTYPES, programs
from conformance.suites.base import PROGRAM_DATA, CheckTask, Outcome, draw, flatten, group_tasks
from conformance.verdict.compare import compare
from conformance.verdict.elements import close
from conformance.verdict.xfails import comparison_failure, exception_failure
import refsim

NAME = "programs"
CORPUS_SEEDS = (0, 1)


def strategy(family: str, dtype: str | None, devices: int):
    """Programs of one family (and dtype) over meshes that family can run on."""
    if family == "pmap_grouped":
        mesh_s = meshes(max_axes=1, max_devices=devices)
    else:
        mesh_s = meshes(min_axes=FAMILIES[family][1], max_devices=devices)
    dts = (dtype,) if dtype else PROGRAM_DTYPES
    if family in ("grad_psum", "grad_scan_ppermute") and not dtype:
        dts = ("float32", "bfloat16")
    return programs(mesh_s, families=(family,), dtypes=dts)


def task_chunks(*, examples: int, seed: int, devices: int):
    """The suite's tasks, one list per program family as it is drawn, then the corpus's."""
    from conformance.cases.corpus import PROGRAMS  # the corpus loads JAX: the platform is configured by now

    for fam in FAMILIES:
        s = seed ^ zlib.crc32(fam.encode())
        cases = draw(strategy(fam, None, devices), examples, s)
        yield group_tasks(NAME, cases, seed=s, shrink_of=lambda c: (NAME, c.family, c.dtype), data=PROGRAM_DATA)
    out = []
    for prog in PROGRAMS:
        if int(np.prod(prog.mesh_shape)) > devices:
            continue
        dtype = str(np.asarray(prog.inputs(0)[0]).dtype) if prog.inputs(0) else "none"
        out.append(CheckTask(f"corpus:{prog.name}[mesh={'x'.join(map(str, prog.mesh_shape))}]", NAME,
                             f"corpus.{prog.family}", dtype, functools.partial(check_corpus, prog.name)))
    yield out


def tasks(*, examples: int, seed: int, devices: int) -> list:
    return flatten(task_chunks(examples=examples, seed=seed, devices=devices))


def stated_policies(prog, mesh, inputs, want) -> list:
    """One policy per refsim output `want` of corpus program `prog` that states a tolerance (`tol`
    or `ulp`): each element held to the tighter of the stated tolerance and the allowed set
    (`conformance.verdict.allowed`, issue 39: one comparison everywhere). Where the bound walk has
    no rule for an output, or an element is undecidable, the stated tolerance judges it alone."""
    import jax

    from conformance.verdict import allowed
    from conformance.verdict.stated import StatedBound
    from xla_backend import staging

    stated = [StatedBound.of(w, tol=prog.tol) if prog.tol else StatedBound.of(w, ulps=prog.ulp) for w in want]
    floating = [np.dtype(w.dtype).kind == "f" for w in want]
    staged = staging.wrap(prog.fn, prog.layout(mesh)).place(inputs)
    with staged.context():
        closed = staged.call.trace(*staged.dynamic_args).jaxpr
    flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(inputs)]
    pols, _notes, _result = allowed.build(closed, flat, want, floating, stated,
                                          platform=jax.devices()[0].platform)
    return [dataclasses.replace(p, judge_undecidable=True) if isinstance(p, allowed.AllowedSet) else p
            for p in pols]


def _close(e, a, tol, ulp=0, failure=None, policy=None) -> str:
    """'' when refsim's array `e` and XLA's `a` agree device by device by `policy` (the stated
    tolerance and the allowed set, `stated_policies`), else within the program's `tol` (or its
    ulp bound, for programs using transcendentals); a complex number part by part. A
    disagreement under the comparator puts its signature (`verdict.xfails.comparison_failure`) in
    the dict `failure`, so an xfails entry can match it."""
    if policy is not None or not tol:
        res = compare(e, a, tolerances=[policy]) if policy is not None else compare(e, a, ulp=ulp or None)
        if not res.ok and failure is not None:
            failure.update(comparison_failure(res))
        return "" if res.ok else res.report()
    ea = {s.device_id: s for s in e.shards}
    aa = {s.device_id: s for s in a.shards}
    if set(ea) != set(aa):
        return f"devices differ: refsim {sorted(ea)}, xla {sorted(aa)}"
    for d in sorted(ea):
        x, y = np.asarray(ea[d].data), np.asarray(aa[d].data)
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"device {d}: refsim {x.dtype}{list(x.shape)}, xla {y.dtype}{list(y.shape)}"
        ok = close(x, y, rtol=tol, atol=tol)
        if not ok.all():
            i = tuple(int(v) for v in np.argwhere(~ok)[0])
            return f"device {d} element {i}: refsim {x[i]!r}, xla {y[i]!r} (stated tolerance {tol})"
    return ""


def check_corpus(name: str, xla) -> Outcome:
    """Corpus program `name` on refsim and on `xla` (or its NumPy reference where XLA cannot run it)."""
    # here, not at the top: the runner imports the suites before it configures the platform
    import jax

    from conformance.cases.corpus import _entry, by_name

    prog = by_name(name)
    mesh = prog.refsim_mesh()
    leaves = lambda out: jax.tree_util.tree_leaves(out, is_leaf=lambda x: hasattr(x, "shards"))  # noqa: E731
    ref_fn = _entry(prog, refsim, mesh)
    # xla_note records what XLA:CPU cannot run; other platforms are asked to run it.
    cpu = jax.devices()[0].platform == "cpu"
    xla_fn = None if cpu and not prog.xla_runs else _entry(prog, xla, mesh)
    for seed in CORPUS_SEEDS:
        inputs = prog.inputs(seed)
        want = leaves(ref_fn(*inputs))
        if xla_fn is None:
            expect = prog.reference(*inputs)
            expect = expect if isinstance(expect, (tuple, list)) else (expect,)
            for k, (w, r) in enumerate(zip(want, expect)):
                if not close(np.asarray(w), np.asarray(r), rtol=prog.tol, atol=prog.tol, equal_nan=False).all():
                    return Outcome("fail", f"{name}: refsim output {k} differs from the NumPy reference "
                                           f"(seed {seed})", examples=len(CORPUS_SEEDS))
            continue
        try:
            got = leaves(xla_fn(*inputs))
        except Exception as e:  # noqa: BLE001 - refsim ran it: XLA's side raised, which an xfails entry may expect
            return Outcome("error", f"xla raised {type(e).__name__} on {name} (seed {seed}): {e}",
                           examples=len(CORPUS_SEEDS), details=Failure(signature=exception_failure("xla", e)))
        if len(want) != len(got):
            return Outcome("fail", f"{name}: refsim gave {len(want)} outputs, xla {len(got)}")
        pols = [None] * len(want)
        if prog.tol or prog.ulp:
            try:
                pols = stated_policies(prog, mesh, inputs, want)
            except Exception:  # noqa: BLE001 - the stated tolerance alone judges, as before
                pols = [None] * len(want)
        for k, (e, a) in enumerate(zip(want, got)):
            failure: dict = {}
            msg = _close(e, a, prog.tol, prog.ulp, failure, policy=pols[k])
            if msg:
                return Outcome("fail", f"{name} output {k} (seed {seed}):\n{msg}", examples=len(CORPUS_SEEDS),
                               details=Failure(signature=failure or None))
    if xla_fn is None:
        return Outcome("unsupported", f"{prog.xla_note}; refsim agrees with the NumPy reference",
                       examples=len(CORPUS_SEEDS))
    return Outcome("pass", examples=len(CORPUS_SEEDS))
