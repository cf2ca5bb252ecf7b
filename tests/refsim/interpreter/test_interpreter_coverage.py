"""`python -m refsim coverage`: the rule table against the installed JAX's primitives."""
from __future__ import annotations

import json
import subprocess
import sys


def test_coverage_cli_counts_and_names():
    # A subprocess: enumerating JAX's primitives imports many optional JAX modules.
    res = subprocess.run([sys.executable, "-m", "refsim", "coverage", "--json"], capture_output=True, text=True,
                         timeout=240, check=True)
    cov = json.loads(res.stdout)
    assert cov["total"] == len(cov["covered"]) + len(cov["missing"])
    assert not set(cov["covered"]) & set(cov["missing"])
    for name in ("shard_map", "jit", "scan", "while", "cond", "remat2", "custom_jvp_call", "custom_vjp_call",
                 "sharding_constraint", "reshard", "device_put", "add_any"):
        assert name in cov["covered"], name
    assert len(cov["missing"]) > 0  # e.g. pallas_call: the report must show what is not covered
    text = subprocess.run([sys.executable, "-m", "refsim", "coverage"], capture_output=True, text=True,
                          timeout=240, check=True).stdout
    assert f"{len(cov['missing'])} without one" in text.splitlines()[0]
