"""Every planted fault by name, for the command line: `check`, `explain` and `bisect --plant NAME`.

A name is `MODULE:NAME`, MODULE the module of `conformance.faults` the fault lives in:

* `lowering:NAME`  a fault of `FAULTS` (JAX's lowering rule of a collective replaced);
* `numerics:NAME`  `numerics.DOT_GENERAL_BF16` (`dot_general_bf16_operands`);
* `compiler:NAME`  an edit of the lowered module (`reversed_permute_pairs`, ...), the verifier-rejected
                   `ppermute_to_missing_device` and the planted fatal CHECKs `xla_check_in_compile` /
                   `xla_check_in_execute` of explain's and bisect's worker process;
* `jaxpr:NAME`     a bisect runner: `reversed_ppermute` (the first ppermute) or `regrouped_psum`
                   (the first psum with axis_index_groups).

The bare NAME is accepted too: every name is unique across the modules. Each tool takes the faults
it can apply (`TOOLS`): `check` runs the program through JAX in its own process (lowering and
numerics faults, `reshard_permutation_ignored`); `explain` also compiles the edited module and runs
XLA in its worker (compiler edits, planted CHECKs; not device_put's reshard); `bisect` compiles
prefixes with its runner (jaxpr runners, lowering and numerics faults, planted CHECKs, reshard for a
device_put case).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
from typing import Callable

from conformance.faults import compiler, jaxpr, numerics
from conformance.faults.lowering import FAULTS, Fault
from conformance.faults.stages import inject

__all__ = ["TOOLS", "Entry", "add_plant_option", "by_name", "entries", "help_text", "planted", "resolve"]

TOOLS = ("check", "explain", "bisect")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One plantable fault: its `MODULE:NAME`, what it does, the tools that apply it and `make()`,
    which returns the fault object `conformance.faults.inject` takes."""

    name: str
    summary: str
    tools: tuple
    make: Callable

    @property
    def bare(self) -> str:
        return self.name.partition(":")[2]


def _first_line(fn) -> str:
    return ((fn.__doc__ or "").strip().splitlines() or [""])[0]


def entries() -> tuple[Entry, ...]:
    """Every plantable fault, lowering faults first (in `FAULTS` order)."""
    out = []
    for name, fault in FAULTS.items():
        tools = ("check", "bisect") if fault.patch is not None else TOOLS   # reshard: a device_put, no module
        out.append(Entry(f"lowering:{name}", fault.summary, tools, lambda fault=fault: fault))
    out.append(Entry(f"numerics:{numerics.DOT_GENERAL_BF16.name}", numerics.DOT_GENERAL_BF16.summary, TOOLS,
                     lambda: numerics.DOT_GENERAL_BF16))
    for edit in (compiler.reversed_permute_pairs, compiler.all_reduce_sum_as_max, compiler.all_reduce_sum_as_product,
                 compiler.reduce_scatter_sum_as_max, compiler.permute_to_missing_device):
        out.append(Entry(f"compiler:{edit.fault_name}", _first_line(edit), ("explain",), lambda edit=edit: edit))
    out.append(Entry(f"compiler:{compiler.PERMUTE_TO_MISSING_DEVICE.name}", compiler.PERMUTE_TO_MISSING_DEVICE.summary,
                     TOOLS, lambda: compiler.PERMUTE_TO_MISSING_DEVICE))
    for check in (compiler.XLA_CHECK_IN_COMPILE, compiler.XLA_CHECK_IN_EXECUTE):
        out.append(Entry(f"compiler:{check.name}", check.summary, ("explain", "bisect"), lambda check=check: check))
    out.append(Entry("jaxpr:reversed_ppermute", _first_line(jaxpr.reversed_ppermute).replace("`where`", "(the first)"),
                     ("bisect",), jaxpr.reversed_ppermute))
    out.append(Entry("jaxpr:regrouped_psum", _first_line(jaxpr.regrouped_psum).replace("`where`", "(the first)"),
                     ("bisect",), jaxpr.regrouped_psum))
    return tuple(out)


def by_name(name: str, tool: str | None = None) -> Entry:
    """The entry named `name` (`MODULE:NAME`, or a bare NAME); ValueError naming the choices when
    there is none, or when `tool` cannot apply it."""
    all_entries = entries()
    found = [e for e in all_entries if name in (e.name, e.bare)]
    usable = [e for e in all_entries if tool is None or tool in e.tools]
    if not found:
        raise ValueError(f"--plant {name!r}: no such fault; choose from {', '.join(e.name for e in usable)} "
                         "(the prefix is the module of conformance.faults; the bare name works too)")
    entry = found[0]
    if tool is not None and tool not in entry.tools:
        raise ValueError(f"--plant {name!r}: {entry.name} is applied by {' and '.join(entry.tools)}, not by {tool} "
                         f"({_why(tool)}); for {tool} choose from {', '.join(e.name for e in usable)}")
    return entry


def _why(tool: str) -> str:
    return {"check": "check runs the program through JAX in this process: it lowers with the faulty rules, but "
                     "compiles no edited module, runs no bisect runner and no XLA worker",
            "explain": "explain compiles whole programs, not bisect's prefixes, and takes no device_put case",
            "bisect": "bisect compiles with its runner: a module edit of explain never reaches it"}[tool]


def help_text(tool: str) -> str:
    """The `--plant` help of `tool`: the names it takes."""
    names = ", ".join(e.name for e in entries() if tool in e.tools)
    return (f"plant a fault of conformance.faults on XLA's side for the run (repeatable; the bare name works "
            f"too): {names}. A fault that never fires on the program is reported.")


def add_plant_option(parser: argparse.ArgumentParser, tool: str) -> None:
    """Add `--plant NAME` (repeatable) to `tool`'s parser."""
    parser.add_argument("--plant", metavar="NAME", action="append", default=[], help=help_text(tool))


def resolve(names, tool: str) -> list:
    """The fault objects of `names` for `tool` (ValueError naming the choices for a bad one)."""
    return [by_name(n, tool).make() for n in names]


@contextlib.contextmanager
def planted(faults: list, echo: Callable[[str], None]):
    """Plant `faults` (from `resolve`) for the block, and `echo` one line per fault on exit: how
    many times it fired, or that it never fired and what it targets. Yields the `firing.Planted`
    (None when nothing is planted)."""
    if not faults:
        yield None
        return
    with inject(faults, warn=False) as plant:
        yield plant
    for name in plant:
        n = plant.fired[name]
        if n:
            echo(f"planted {name}: fired {'once' if n == 1 else f'{n} times'}")
        else:
            echo(f"planted {name}: never fired; it targets {plant.targets[name]}, and nothing XLA compiled or ran "
                 "had it, so the run says nothing about this fault")
