"""The failure record of one case: what went wrong, typed, and built where the case is compared.

A `Failure` is what `CaseResult.details` (and a suite check's `Outcome.details`) holds. Its
fields are named and typed; the engine fills them when it compares a case, when a side raises,
when a worker dies or a case times out, and the reporters only format them. A passing case
carries an empty `Failure`.

In results.jsonl a failure is the same JSON object as before the record was typed (version 1
of the format): one key per field that is set (``None`` is not written), the xfails signature
under ``"failure"``, and any key a newer or older writer added kept in `extra` and written back
as it came. `Failure.from_json` reads every results.jsonl written so far.

For readers written against the untyped dict, a `Failure` is also a mutable mapping over that
JSON object (``details["report"]``, ``details.get("stage")``, ``"traceback" in details``) and
equals a dict with the same keys and values.

`case_failure(case, comparison, expected=...)` builds the record of a `conformance.cases.Program`
(its description, mesh and layouts, the comparator's report and mismatches per device);
`mesh_entry`, `layout_entry` and `device_errors` are its drawable pieces.
"""
from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from typing import Any

import numpy as np

from conformance.verdict.compare import as_outputs
from refsim.layouts.named_sharding import NamedSharding

__all__ = ["FORMAT_VERSION", "Failure", "case_failure", "device_errors", "layout_entry", "mesh_entry", "stage_line"]

FORMAT_VERSION = 1   # the JSON object of a failure in results.jsonl; unchanged since the record was typed

# field name -> its key in the JSON object (only the xfails signature has another name, for old files)
_JSON_KEY = {"signature": "failure"}


@dataclasses.dataclass(eq=False)
class Failure(MutableMapping):
    """What a person (and an xfails entry) needs to know about a case that did not agree.

    Every field is optional (``None`` when it does not apply):

    - the case: `description` (``case.describe()``), `mesh` (`mesh_entry`), `layouts`
      (`layout_entry` of each input and output), `program` (a hunt's summary of the program);
    - the comparison: `report` (the comparator's mismatch report), `device_errors` (mismatching
      elements per device id, a string key per device), `signature` (the
      `conformance.verdict.xfails` signature an entry is matched against: ``kind``, ``side``,
      ``classes``, ...), `expected_failures` (examples that failed as the xfails entry expects);
    - a side that raised: `exception_type`, `traceback`;
    - after the comparison: `shrunk` (what shrinking found), `stage` (the compiler stage that
      introduced the difference: `conformance.debug.explain.summary`'s record, ``diverged_in``,
      ``op``, ...), `repro_error` (why no reproducer was written);
    - a worker process that died or hung: `worker_exit`, `exitcode`, `fatal_line` (XLA's
      ``F... file.cc:N] Check failed`` line), `stderr_tail`, `timeout_seconds`;
    - `extra`: any other key, kept so that a record round-trips.
    """

    description: str | None = None
    mesh: dict | None = None
    layouts: list | None = None
    program: dict | None = None
    report: str | None = None
    device_errors: dict | None = None
    signature: dict | None = None
    expected_failures: int | None = None
    exception_type: str | None = None
    traceback: str | None = None
    shrunk: str | None = None
    stage: dict | None = None
    repro_error: str | None = None
    worker_exit: str | None = None
    exitcode: int | None = None
    fatal_line: str | None = None
    stderr_tail: str | None = None
    timeout_seconds: float | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    # -- typed views ---------------------------------------------------------------------
    @property
    def mismatches(self) -> int:
        """Mismatching elements over all devices (0 when nothing was compared)."""
        return sum(int(v) for v in (self.device_errors or {}).values())

    @property
    def side(self) -> str | None:
        """Which side failed: "xla", "refsim", "unknown" (from the signature), None without one."""
        return (self.signature or {}).get("side")

    @property
    def diverged_in(self) -> str | None:
        """The compiler stage that introduced the difference, when `stage` located one."""
        return (self.stage or {}).get("diverged_in")

    def stage_line(self) -> str:
        """One line for a report: where the compiler stages diverged (`stage_line`), "" without a stage."""
        return stage_line(self.stage)

    # -- results.jsonl -------------------------------------------------------------------
    def to_json(self) -> dict:
        """The JSON object of results.jsonl: the fields that are set, then `extra`."""
        out = {_JSON_KEY.get(f.name, f.name): getattr(self, f.name) for f in _FIELDS
               if getattr(self, f.name) is not None}
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d) -> "Failure":
        """The record of a results.jsonl object (a `Failure` as is; ``None`` or ``{}``: an empty one).

        Keys it does not know go to `extra`; ValueError when `d` is not a JSON object.
        """
        if isinstance(d, Failure):
            return d
        if d is None:
            return cls()
        if not isinstance(d, (dict, MutableMapping)):
            raise ValueError(f"a case's details must be a JSON object, got {type(d).__name__} {str(d)[:80]!r}; "
                             "write a dict (or a conformance.report.Failure).")
        known = {k: d[k] for k in _BY_KEY if k in d}
        out = cls(**{_BY_KEY[k]: v for k, v in known.items()})
        out.extra = {k: v for k, v in d.items() if k not in _BY_KEY}
        return out

    # -- the mapping of the JSON object (readers written against the untyped dict) -------
    def __getitem__(self, key):
        name = _BY_KEY.get(key)
        if name is None:
            return self.extra[key]
        value = getattr(self, name)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        name = _BY_KEY.get(key)
        if name is None:
            self.extra[key] = value
        else:
            setattr(self, name, value)

    def __delitem__(self, key) -> None:
        name = _BY_KEY.get(key)
        if name is None:
            del self.extra[key]
        elif getattr(self, name) is None:
            raise KeyError(key)
        else:
            setattr(self, name, None)

    def __iter__(self):
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())

    def __repr__(self) -> str:
        return f"Failure({self.to_json()!r})"


_FIELDS = [f for f in dataclasses.fields(Failure) if f.name != "extra"]
_BY_KEY = {_JSON_KEY.get(f.name, f.name): f.name for f in _FIELDS}   # JSON key -> field name


def stage_line(stage: dict | None) -> str:
    """One line for a report of a stage record (`conformance.debug.explain.summary`): where the
    stages first diverged, and at which op."""
    if not stage:
        return ""
    if stage.get("error"):
        return f"stage: not localised ({stage['error']})"
    where = stage.get("diverged_in")
    if where is None and stage.get("not_evaluated"):
        return "stage: " + stage.get("headline", "no divergence found, but not every stage was compared")
    if where is None:
        return "stage: refsim's stages (jaxpr, lowered, compiled) and execution agree on the reproducer"
    if where == "undetermined":
        return "stage: " + stage.get("headline", "diverged in: undetermined").replace("diverged in: ", "diverged in ")
    text = f"stage: diverged in {where}"
    if stage.get("crash"):
        text += f" (crash: {stage['crash']})"
    if stage.get("op"):
        text += f" at {stage['op']}" + (f" ({stage['source']})" if stage.get("source") else "")
    return text


# -- building a case's record -------------------------------------------------------------
def mesh_entry(mesh) -> dict:
    """``{"axis_sizes", "axis_names", "device_ids"}`` of a refsim Mesh."""
    return {"axis_sizes": [int(s) for s in mesh.axis_sizes], "axis_names": [str(a) for a in mesh.axis_names],
            "device_ids": np.asarray(mesh.device_ids).tolist()}


def layout_entry(label: str, sharding, shape) -> dict:
    """A drawable record of a layout: its text and each device's block as [start, stop) per dimension.

    Works for any sharding with ``devices_indices_map`` (named, HLO, pmap, single device);
    an integer index (pmap's unstacked dimension) becomes the block [i, i+1).
    """
    shape = tuple(int(d) for d in shape)
    blocks = {}
    for dev, index in sharding.devices_indices_map(shape).items():
        ranges = []
        for i, n in zip(index, shape):
            if isinstance(i, slice):
                start, stop, _ = i.indices(n)
            else:
                start, stop = int(i), int(i) + 1
            ranges.append([start, stop])
        blocks[str(int(dev))] = ranges
    return {"label": str(label), "shape": list(shape), "sharding": repr(sharding), "blocks": blocks}


def device_errors(comparison) -> dict[str, int]:
    """Mismatching elements per device id of a `conformance.verdict.compare.ComparisonResult`.

    A structural mismatch of a shard (wrong index, shard shape or dtype) counts as one.
    """
    out: dict[str, int] = {}
    for m in comparison.mismatches:
        if m.device_id is None:
            continue
        key = str(int(m.device_id))
        out[key] = out.get(key, 0) + max(int(m.count), 1)
    return out


def case_failure(case, comparison=None, *, expected=None, **fields: Any) -> Failure:
    """The `Failure` of a `conformance.cases.Program`: its description, mesh and layouts (inputs
    from the case's specs or shardings, outputs from `expected`'s shardings) and, with a
    `comparison`, the comparator's report and `device_errors`; `fields` set the others."""
    layouts = []
    args = [np.asarray(a) for a in case.args]
    if case.entry == "shard_map":
        for i, (a, spec) in enumerate(zip(args, case.in_specs)):
            layouts.append(layout_entry(f"input {i}", NamedSharding(case.mesh, spec), a.shape))
    elif case.entry in ("jit", "device_put"):
        for i, (a, s) in enumerate(zip(args, case.in_shardings or ())):
            if s is not None:
                layouts.append(layout_entry(f"input {i}", s, a.shape))
    if expected is not None:
        for k, arr in enumerate(as_outputs(expected)):
            layouts.append(layout_entry(f"output {k}", arr.sharding, arr.shape))
    out = Failure(description=case.describe(), mesh=mesh_entry(case.mesh), layouts=layouts, **fields)
    if comparison is not None:
        out.report = comparison.report()
        out.device_errors = device_errors(comparison)
    return out
