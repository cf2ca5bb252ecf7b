"""Faults planted between lowering and execution, to check that `explain` says "compiler".

Each is an `edit_module(text) -> text`, planted with ``with conformance.faults.inject(edit):`` (or
passed as `conformance.debug.explain(..., edit_module=...)`): it rewrites the StableHLO module
JAX lowered before XLA compiles it, so XLA builds and runs a different program from the one the
lowered stage interprets, as a wrong XLA pass would.

`XLA_CHECK_IN_COMPILE` and `XLA_CHECK_IN_EXECUTE` are faults of XLA's process itself: the
worker that compiles and runs programs for explain and bisect (`xla_backend.isolated`) aborts
in that step as a failed XLA CHECK does.

`PERMUTE_TO_MISSING_DEVICE` is a `conformance.faults.lowering.Fault` (``with faults.inject(...)``)
whose ppermute lowering emits a pair naming a device that does not exist: XLA's verifier
rejects the module, so every tool that compiles it sees a compile crash (`conformance.check`
raises `XlaError` with stage "compiler").
"""
from __future__ import annotations

import contextlib
import re

import numpy as np

from conformance.faults import firing
from conformance.faults.firing import NothingToEdit
from conformance.faults.lowering import Fault
from conformance.faults.stages import mark
from refsim import compat
from xla_backend import isolated

_PAIRS = re.compile(r"source_target_pairs = dense<(\[\[.*?\]\])>")


@mark("compiler")
def reversed_permute_pairs(text: str) -> str:
    """Every `collective_permute` sends along its (source, target) pairs backwards."""

    def flip(m):
        pairs = re.findall(r"\[(-?\d+), (-?\d+)\]", m.group(1))
        if not pairs:
            return m.group(0)
        body = ", ".join(f"[{t}, {s}]" for s, t in pairs)
        return f"source_target_pairs = dense<[{body}]>"

    out, n = _PAIRS.subn(flip, text)
    if not n:
        raise NothingToEdit("reversed_permute_pairs: the module has no collective_permute to edit; plant a fault "
                            "in a program that calls lax.ppermute.")
    return out


def _body_edit(collective: str, new_op: str):
    pattern = re.compile(rf"(\"stablehlo\.{collective}\".*?\^bb0[^\n]*\n\s*%\S+ = )stablehlo\.add", re.S)

    def edit(text: str) -> str:
        out, n = pattern.subn(rf"\1stablehlo.{new_op}", text, count=1)
        if not n:
            raise NothingToEdit(f"the module has no summing {collective} to edit; plant this fault in a program "
                                f"that calls {'lax.psum' if collective == 'all_reduce' else 'lax.psum_scatter'}.")
        return out

    return edit


_ALL_REDUCE_MAX = _body_edit("all_reduce", "maximum")
_ALL_REDUCE_MUL = _body_edit("all_reduce", "multiply")
_REDUCE_SCATTER_MAX = _body_edit("reduce_scatter", "maximum")


@mark("compiler")
def all_reduce_sum_as_max(text: str) -> str:
    """The first summing `all_reduce` reduces with maximum instead (a wrong reduction computation)."""
    return _ALL_REDUCE_MAX(text)


@mark("compiler")
def all_reduce_sum_as_product(text: str) -> str:
    """The first summing `all_reduce` multiplies instead."""
    return _ALL_REDUCE_MUL(text)


@mark("compiler")
def reduce_scatter_sum_as_max(text: str) -> str:
    """The first summing `reduce_scatter` reduces with maximum instead."""
    return _REDUCE_SCATTER_MAX(text)


_FIRST_PAIR = re.compile(r"source_target_pairs = dense<\[\[(-?\d+), (-?\d+)\]")


@mark("compiler")
def permute_to_missing_device(text: str) -> str:
    """The first `collective_permute` sends its first pair to a device that does not exist: the
    module XLA gets is invalid, and its verifier rejects it (a compile crash)."""
    out, n = _FIRST_PAIR.subn(lambda m: f"source_target_pairs = dense<[[{m.group(1)}, 4096]", text, count=1)
    if not n:
        raise NothingToEdit("permute_to_missing_device: the module has no collective_permute to edit; plant it in "
                            "a program that calls lax.ppermute.")
    return out


def _permute_to_missing_device(orig, env):
    def rule(ctx, *args, **params):
        res = orig(ctx, *args, **params)
        op = res[0].owner
        op.attributes["source_target_pairs"] = compat.mlir_ir().DenseIntElementsAttr.get(
            np.array([[0, 4096]], np.int64))
        env.fired()        # edited in place: the result alone does not show it
        return res

    return rule


PERMUTE_TO_MISSING_DEVICE = Fault("ppermute_to_missing_device",
                                  "ppermute's collective_permute sends to device 4096 (XLA's verifier rejects it)",
                                  ("ppermute",), _permute_to_missing_device)


def _planted_check(phase, name: str):
    """The patch of a planted CHECK: the worker of `xla_backend.isolated` aborts in `phase`; each run
    that died of it counts as a firing of fault `name`."""

    @contextlib.contextmanager
    def patch():
        before, run = isolated.PLANTED_CHECK, isolated.run

        def counted(*args, **kw):
            answer = run(*args, **kw)
            if answer.get("crashed") and "planted fatal CHECK" in f"{answer.get('error', '')}{answer.get('stderr', '')}":
                firing.note(name)
            return answer

        isolated.PLANTED_CHECK, isolated.run = phase, counted
        try:
            yield
        finally:
            isolated.PLANTED_CHECK, isolated.run = before, run

    return patch


XLA_CHECK_IN_COMPILE = Fault("xla_check_in_compile", "XLA's compile (in explain's and bisect's worker process) "
                             "ends its process with a failed CHECK", patch=_planted_check("compile", "xla_check_in_compile"))
XLA_CHECK_IN_EXECUTE = Fault("xla_check_in_execute", "running the executable (in explain's and bisect's worker "
                             "process) ends its process with a failed CHECK",
                             patch=_planted_check("execute", "xla_check_in_execute"))


def xla_check_on(op: str, phase: str = "compile") -> Fault:
    """XLA's `phase` ends its process with a failed CHECK, for modules that contain `op` (e.g.
    "stablehlo.collective_permute"): bisect must name the equation that brings the op in."""
    name = f"xla_check_on_{op}"
    return Fault(name, f"XLA's {phase} (in explain's and bisect's worker process) fails a CHECK on modules with {op}",
                 patch=_planted_check((phase, op), name))
