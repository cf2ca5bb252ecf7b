"""Rewrites of XLA's HLO text that jaxlib's HLO -> StableHLO conversion needs.

XLA prints replica groups it derived from a Shardy mesh in a mesh-axes form,
``replica_groups=mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'a'}``, which jaxlib's
converter turns into an attribute its own `mhlo.all_to_all` verifier rejects. `explicit_groups`
spells such groups out as lists of device ids, ``{{0,4},{1,5},...}``: the devices that differ
only along the named axes, members in row-major order over them (refsim's `replica_groups`).

`hlo_module_to_stablehlo(compiled)` gives XLA's compiled per-device module as StableHLO with
these rewrites applied where jaxlib's converter needs them.
"""
from __future__ import annotations

import re

import numpy as np

from refsim import compat
from refsim.collectives.groups import replica_groups
from refsim.layouts.mesh import Mesh

_MESH_GROUPS = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\]"
    r"(?:,\s*device_ids=\(\[(?P<dims>[\d,]*)\](?:T\((?P<perm>[\d,]*)\))?\))?"
    r"(?:\s*\{(?P<over>[^}]*)\})?")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _expand(m: re.Match) -> str:
    axes = re.findall(r"'((?:[^'\\]|\\.)*)'\s*=\s*(\d+)", m.group("axes"))
    names = tuple(a for a, _ in axes)
    sizes = tuple(int(s) for _, s in axes)
    n = int(np.prod(sizes, dtype=np.int64))
    ids = np.arange(n)
    if m.group("dims"):
        dims = _ints(m.group("dims"))
        ids = ids.reshape(dims)
        if m.group("perm"):
            ids = ids.transpose(_ints(m.group("perm")))
    mesh = Mesh(sizes, names, device_ids=ids.reshape(sizes))
    over = tuple(re.findall(r"'((?:[^'\\]|\\.)*)'", m.group("over") or ""))
    groups = replica_groups(mesh, over) if over else [[int(i)] for i in ids.reshape(-1)]
    return "replica_groups={" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def explicit_groups(hlo_text: str) -> str:
    """`hlo_text` with every mesh-axes replica group list written as explicit device-id groups."""
    return _MESH_GROUPS.sub(_expand, hlo_text)


_REDUCTION = re.compile(r"= \(?(?P<ty>[a-z][a-z0-9]*)\[[^\n]*?\b(?:all-reduce|reduce-scatter|all-reduce-start)\("
                        r"[^\n]*?to_apply=%(?P<comp>[\w.\-]+)")


def reduction_types_match_operands(hlo_text: str) -> str:
    """`hlo_text` with each all-reduce / reduce-scatter's reduction computation retyped to the
    collective's element type.

    XLA:CPU widens 8-bit float collectives to f16 but keeps their `to_apply` computation in the
    8-bit type; HLO accepts that, StableHLO's verifier does not (the reduction body's type must
    be the operand's). The collective computes in the operand's type, so that is the body's type.
    """
    wanted: dict = {}
    for m in _REDUCTION.finditer(hlo_text):
        wanted.setdefault(m.group("comp"), m.group("ty"))
    for comp, ty in wanted.items():
        head = re.search(rf"^%{re.escape(comp)} \((?P<params>[^)]*)\) -> (?P<ret>[a-z][a-z0-9]*)\[\] \{{$",
                         hlo_text, re.M)
        if head is None or head.group("ret") == ty:
            continue
        old = head.group("ret")
        end = hlo_text.index("\n}", head.end())
        body = hlo_text[head.start():end]
        hlo_text = hlo_text[:head.start()] + re.sub(rf"\b{old}\[", f"{ty}[", body) + hlo_text[end:]
    return hlo_text


def hlo_module_to_stablehlo(compiled) -> bytes:
    """The compiled per-device (SPMD-partitioned) module of a `jax.stages.Compiled` (or an XLA
    `HloModule` itself, e.g. one compiled in another process) as StableHLO bytecode, for
    `refsim.stablehlo.load` / `interpret(..., per_device=True)`.

    jaxlib converts XLA's HLO module directly where it can. Two shapes of XLA's HLO it
    mistranslates are respelled in the HLO text and converted again: replica groups in the
    mesh-axes form (their device order is dropped, and `mhlo.all_to_all` rejects the
    attribute: `explicit_groups`), and 8-bit float collectives widened to f16 around a
    reduction body still typed f8, which fails the verifier (`reduction_types_match_operands`).
    """
    hlo = compiled if hasattr(compiled, "as_serialized_hlo_module_proto") else compat.compiled_hlo_module(compiled)
    text = hlo.to_string()
    if "replica_groups=mesh[" not in text:
        data = compat.hlo_module_to_stablehlo_bytes(hlo)
        if compat.stablehlo_verifies(data):
            return data
    return compat.hlo_text_to_stablehlo_bytes(reduction_types_match_operands(explicit_groups(text)))
