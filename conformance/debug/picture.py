"""Per-device pictures of a mismatch: the mesh as a grid coloured by max ULP or absolute error.

Terminal, text, SVG and HTML come from `refsim.visualize.render_device_grid` (rich only);
PNG needs matplotlib (`pip install 'jax-conformance[report]'`). Devices that match are 0
(green); the worst device is red.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

# matplotlib is imported inside functions: it is slow to load and only a picture needs it.

METRICS = ("ulp", "abs")


def device_errors(report, metric: str = "ulp") -> dict[int, float]:
    """{device id: max error of the value on that device} for a `bisect.ValueReport`
    (or any object with `.devices` mapping ids to `diff.DeviceDiff`)."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}; use 'ulp' (max ULP distance) or 'abs' (max absolute error).")
    attr = "max_ulp" if metric == "ulp" else "max_abs"
    return {int(dev): float(getattr(d, attr)) for dev, d in report.devices.items()}


def _errors(values, metric: str) -> Mapping[int, float]:
    if hasattr(values, "devices"):
        return device_errors(values, metric)
    return values


def _title(values, metric: str, title: str | None) -> str:
    if title is not None:
        return title
    what = "max ULP" if metric == "ulp" else "max |xla - refsim|"
    name = getattr(values, "name", None)
    return f"{what} of {name}" if name else what


def render(mesh, values, *, metric: str = "ulp", format: str = "terminal", title: str | None = None,
           console=None):
    """Draw each device of `mesh` coloured by its error (`values`: a ValueReport or {device: error}).

    format: "terminal" prints with rich; "text" returns plain text; "svg"/"html" return markup.
    """
    from refsim.visualize import render_device_grid

    errs = _errors(values, metric)
    return render_device_grid(mesh, dict(errs), _title(values, metric, title), format=format, console=console,
                              fmt="{:.3g}")


def to_png(mesh, values, path, *, metric: str = "ulp", title: str | None = None) -> str:
    """Write the grid as a PNG with matplotlib (one cell per device, leading axes as rows); returns path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("to_png needs matplotlib: pip install 'jax-conformance[report]' "
                          "(or use render(..., format='html'), which needs no matplotlib).") from None
    errs = _errors(values, metric)
    sizes = tuple(mesh.axis_sizes)
    ids = np.asarray(mesh.device_ids).reshape(-1, sizes[-1])
    grid = np.vectorize(lambda d: errs.get(int(d), np.nan), otypes=[float])(ids)
    fig, ax = plt.subplots(figsize=(1.2 * ids.shape[1] + 1.5, 0.9 * ids.shape[0] + 1.2))
    finite = grid[np.isfinite(grid)]
    positive = finite[finite > 0]
    # Symmetric-log colours: 0 stays green while 4 ULP and 1e9 ULP are told apart (a linear
    # scale paints every error far below the largest one as green too).
    norm = matplotlib.colors.SymLogNorm(linthresh=float(positive.min()) if positive.size else 1.0,
                                        vmin=0, vmax=float(finite.max()) if positive.size else 1.0)
    im = ax.imshow(grid, cmap="RdYlGn_r", norm=norm)
    for (r, c), dev in np.ndenumerate(ids):
        v = grid[r, c]
        ax.text(c, r, f"dev {dev}\n{v:.3g}" if np.isfinite(v) else f"dev {dev}\n-", ha="center", va="center",
                fontsize=8)
    ax.set_xticks(range(ids.shape[1]), [f"{mesh.axis_names[-1]}={k}" for k in range(ids.shape[1])])
    lead = [",".join(f"{a}={p}" for a, p in zip(mesh.axis_names, pos)) for pos in np.ndindex(*sizes[:-1])]
    ax.set_yticks(range(ids.shape[0]), lead if lead and lead[0] else [""])
    ax.set_title(_title(values, metric, title))
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
