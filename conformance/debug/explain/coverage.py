"""Which ops of the modules JAX lowers and XLA compiles refsim.stablehlo can run.

`collect()` lowers and compiles the corpus (`conformance.corpus`), the examples/ models and a
drawn batch of the programs suite's generator, and `coverage(collect())` counts every op (custom
calls by target) of each lowered and compiled module against refsim.stablehlo's rule table.
`python -m conformance explain --coverage` prints it; a missing op is a failing test
(tests/test_stablehlo_coverage.py), not a skipped stage. For module files of your own use
`python -m refsim.stablehlo coverage FILE...`.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Iterator

import refsim.stablehlo as sh
from conformance.debug.explain.program import build_called, from_case, from_corpus
from conformance.strategies.programs import FAMILIES
from conformance.suites import base, programs as suite
from refsim.stablehlo import plan
from refsim.stablehlo.registry import load, op_key

# JAX is imported inside functions: importing conformance never loads it, so the platform
# (xla_backend.platform.configure, a user's jax.config) is chosen first; JAX reads it once, when it loads.

EXAMPLES = ("transformer_jit", "transformer_fsdp", "pipeline", "moe")


@dataclasses.dataclass
class Module:
    """One module: where it came from (`source`, e.g. "corpus:psum_x"), its `stage` ("lowered" or
    "compiled") and the module (StableHLO text / bytecode) or, when it could not be produced, `error`."""

    source: str
    stage: str
    module: object = None
    error: str | None = None


def _modules_of(source: str, staged) -> Iterator[Module]:
    yield Module(source, "lowered", staged.lowered.compiler_ir("stablehlo"))
    try:
        compiled = staged.compiled()
    except Exception as e:  # noqa: BLE001 - e.g. an op XLA:CPU cannot compile: only its lowered module counts
        yield Module(source, "compiled", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return
    yield Module(source, "compiled", sh.hlo_module_to_stablehlo(compiled))


def corpus_modules(names=None) -> Iterator[Module]:
    from conformance.cases import corpus

    for prog in (corpus.PROGRAMS if not names else [corpus.by_name(n) for n in names]):
        try:
            staged = from_corpus(prog)
        except NotImplementedError:  # no lowering on this platform (pbroadcast on CPU): the GPU one
            staged = from_corpus(prog, lowering_platforms=("cuda",))
        yield from _modules_of(f"corpus:{prog.name}", staged)


def example_modules(names=EXAMPLES) -> Iterator[Module]:
    """The examples/ models' training steps, lowered with their own `init()` arguments."""
    for name in names:
        mod = importlib.import_module(f"examples.{name}")
        yield from _modules_of(f"examples:{name}", build_called(mod.train_step, mod.init()))


def catalogue_modules(names=None) -> Iterator[Module]:
    """The op catalogue's programs (`conformance.debug.explain.op_catalogue`), each under `jax.jit`."""
    from conformance.debug.explain import op_catalogue

    for name, fn, args in op_catalogue.programs():
        if names and name not in names:
            continue
        try:
            staged = build_called(fn, args)
        except Exception as e:  # noqa: BLE001 - e.g. a dtype this JAX does not lower: reported, not hidden
            yield Module(f"catalogue:{name}", "lowered", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        yield from _modules_of(f"catalogue:{name}", staged)


def drawn_modules(count: int = 1, seed: int = 7) -> Iterator[Module]:
    """`count` programs of every family of the programs suite's generator (as the suite draws them)."""
    for fam in FAMILIES:
        for case in base.draw(suite.strategy(fam, None, 8), count, seed):
            if case.entry == "device_put":
                continue
            try:
                staged = from_case(case)
            except NotImplementedError:
                staged = from_case(case, lowering_platforms=("cuda",))
            except (ValueError, TypeError, RuntimeError) as e:  # JAX refuses to lower it (jax 0.12's ppermute order)
                yield Module(f"drawn:{case.case_id}", "lowered", error=f"{type(e).__name__}: {str(e)[:160]}")
                continue
            yield from _modules_of(f"drawn:{case.case_id}", staged)


def collect(*, corpus: bool = True, examples: bool = True, catalogue: bool = True, drawn: int = 1) -> list[Module]:
    """Every module of the sources asked for (see the module docstring)."""
    out: list[Module] = []
    if corpus:
        out += corpus_modules()
    if examples:
        out += example_modules()
    if catalogue:
        out += catalogue_modules()
    if drawn:
        out += drawn_modules(drawn)
    return out


@dataclasses.dataclass
class Coverage:
    """`ops`: {op name: number of modules using it}; `missing`: {op name: [source/stage, ...]};
    `modules`: modules counted; `errors`: [(source, stage, error)] of modules not produced."""

    ops: dict
    missing: dict
    modules: int
    errors: list

    @property
    def percent(self) -> float:
        return 100.0 * (len(self.ops) - len(self.missing)) / max(len(self.ops), 1)

    def as_dict(self) -> dict:
        return {"ops": len(self.ops), "covered": len(self.ops) - len(self.missing), "percent": self.percent,
                "missing": self.missing, "modules": self.modules, "errors": [list(e) for e in self.errors],
                "by_op": self.ops}

    def render(self) -> str:
        import jax

        lines = [f"refsim.stablehlo op coverage (jax {jax.__version__}): {len(self.ops) - len(self.missing)} of "
                 f"{len(self.ops)} ops ({self.percent:.1f}%) over {self.modules} modules"]
        for op in sorted(self.missing):
            where = self.missing[op]
            lines.append(f"  missing {op}: {len(where)} module(s), e.g. {', '.join(where[:3])}")
        for src, stage, err in self.errors:
            lines.append(f"  not produced: {src} {stage}: {err}")
        return "\n".join(lines)


def coverage(modules: list[Module]) -> Coverage:
    table = load()
    ops: dict = {}
    missing: dict = {}
    errors = []
    n = 0
    for m in modules:
        if m.module is None:
            errors.append((m.source, m.stage, m.error))
            continue
        program = sh.load(m.module)
        n += 1
        seen = {op_key(op) for fn in program.funcs.values() for op in plan.walk(fn.body)}
        for key in seen:
            ops[key] = ops.get(key, 0) + 1
            if key not in table:
                missing.setdefault(key, []).append(f"{m.source}/{m.stage}")
    return Coverage(dict(sorted(ops.items())), missing, n, errors)

