"""An upstream script calls the jitted program with its arguments placed by IN_SPECS, as the hunt ran it.

On an Explicit mesh a NumPy argument's type carries no sharding, so JAX traces another program: here
`reduce_sum(..., out_sharding=P(unreduced={'x'}))` of an argument split over 'x' is refused ("out_sharding's
unreduced axes should be in operand's specs that were summed over") where the placed argument runs, and
the 0.10.2 scan_layers hunt's scripts (2026-12-06) raised that instead of showing the values they had
found wrong."""
import os
import subprocess
import sys

import numpy as np

from conformance.hunt import _array_data, case_from_data
from conformance.upstream.script import script_text


def test_an_explicit_mesh_script_places_its_arguments():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) % 5
    case = case_from_data({
        "graph": {"helpers": [], "lines": ["v1 = jax.lax.reduce_sum(a0, (0, 2), out_sharding=P(unreduced={'x'}))",
                                           "v2 = jax.sharding.reshard(v1, P())"],
                  "line_ops": [["unreduced_sum", "sharded"], ["reshard", "replicated"]],
                  "outs": [["v2", [3], "float32", 0.0]], "args": [["float32", [2, 3, 4], None]], "batch": None,
                  "transform": "none", "program_class": ["plain", []]},
        "mesh": {"shape": [2], "names": ["x"], "device_ids": [0, 1], "axis_types": ["Explicit"]},
        "args": [_array_data(x)], "in_specs": [[None, None, "x"]], "out_specs": [[]],
        "partitioner": "shardy", "axis_types": "explicit"})
    text = script_text(case, title="t", about="a", expected="embedded", values=[x.sum((0, 2))])
    assert "jax.device_put(x, NamedSharding(mesh, s))" in text
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "every shard of every output agrees" in proc.stdout, proc.stdout + proc.stderr
