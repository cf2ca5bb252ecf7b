"""Python source text for what a case holds: meshes, PartitionSpecs, arrays (bit for bit) and
shard indices, as case functions and reproducers (`conformance.cases.repro`) write them."""
from __future__ import annotations

import numpy as np

from refsim.layouts.mesh import Mesh


def mesh_source(mesh: Mesh, var: str = "mesh") -> str:
    """Python source building the JAX mesh of `mesh` from `jax.devices()` by device id."""
    ids = np.asarray(mesh.device_ids)
    return (
        f"{var} = Mesh(np.array([_dev[i] for i in {ids.ravel().tolist()!r}], dtype=object)"
        f".reshape({tuple(ids.shape)!r}), {tuple(mesh.axis_names)!r})"
    )


def spec_source(spec) -> str:
    """`P(...)` source for a refsim PartitionSpec (UNCONSTRAINED as `P.UNCONSTRAINED`; JAX's
    ``unreduced={...}`` / ``reduced={...}`` axis sets kept, sorted)."""
    if spec is None:
        return "None"
    parts = ["P.UNCONSTRAINED" if type(p).__name__ == "_Unconstrained" else repr(p) for p in spec]
    for name in ("unreduced", "reduced"):
        axes = sorted(getattr(spec, name, None) or ())
        if axes:
            parts.append(f"{name}={{{', '.join(repr(a) for a in axes)}}}")
    return "P(" + ", ".join(parts) + ")"


def _array_literal(a: np.ndarray) -> str:
    """Source rebuilding `a` bit for bit (floats as exact Python floats; nan/inf by name)."""
    a = np.asarray(a)
    name = a.dtype.name
    if a.dtype.kind == "c":
        # as (real, imaginary) pairs viewed as complex: a Python complex literal cannot hold a
        # non-finite imaginary part (`1+inf_j`) or the sign of an imaginary zero (`1-0j` is 1+0j)
        parts = np.ascontiguousarray(a).view(f"f{a.dtype.itemsize // 2}")
        body = repr(parts.ravel().tolist()).replace("nan", "nan_").replace("inf", "inf_")
        return f"np.array({body}, dtype=np.{parts.dtype.name}).view(np.{name}).reshape({tuple(a.shape)!r})"
    if name == "bfloat16" or name.startswith("float8_"):
        vals, dt = a.astype(np.float32), f"jnp.{name}"
    else:
        vals, dt = a, ("np.bool_" if name == "bool" else f"np.{name}")   # np.bool is NumPy >= 2 only
    body = repr(vals.ravel().tolist()).replace("nan", "nan_").replace("inf", "inf_")
    return f"np.array({body}, dtype={dt}).reshape({tuple(a.shape)!r})"


def _index_source(index) -> str:
    parts = []
    for i in index:
        if isinstance(i, slice):
            parts.append(f"slice({i.start!r}, {i.stop!r}, {i.step!r})")
        else:
            parts.append(repr(int(i)))
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
