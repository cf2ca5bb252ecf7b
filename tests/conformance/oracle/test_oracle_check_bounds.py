"""`conformance.check` is bounded and transparent (issue 28, points 5 and 7): XLA's results are
waited for at most `timeout` seconds (a device-side infinite while_loop blocked it forever), and
an exception of the user's own program reaches the caller as itself (it was reported as
`NotCheckable('trace failed: ...')`)."""
import inspect
import math
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import conformance
import xla_backend  # noqa: F401 - 8 CPU devices
from conformance.oracle import check as check_mod

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MESH = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
X = np.arange(8.0, dtype=np.float32)


class MyError(Exception):
    pass


def _bad(v):
    raise MyError(f"boom on {v.shape}")


@pytest.mark.parametrize("fn", [_bad, jax.jit(_bad)], ids=["function", "jit"])
def test_the_programs_own_exception_reaches_the_caller_as_itself(fn):
    kw = dict(mesh=MESH, in_specs=P("i"), out_specs=P("i")) if fn is _bad else {}
    with pytest.raises(MyError, match=r"boom on \(1,\)" if fn is _bad else r"boom on \(8,\)") as info:
        conformance.check(fn, X, **kw)
    assert not isinstance(info.value.__context__, conformance.NotCheckable)


def test_a_jax_error_of_the_program_is_jaxs_own():
    def wrong_shapes(v):
        return v.reshape(3)  # the local block has 1 element

    with pytest.raises(TypeError, match=r"cannot reshape array of shape \(1,\)"):
        jax.jit(jax.shard_map(wrong_shapes, mesh=MESH, in_specs=P("i"), out_specs=P("i")))(X)
    with pytest.raises(TypeError, match=r"cannot reshape array of shape \(1,\)"):
        conformance.check(wrong_shapes, X, mesh=MESH, in_specs=P("i"), out_specs=P("i"))


def test_a_program_that_runs_but_cannot_be_traced_is_not_checkable():
    sharding = jax.NamedSharding(MESH, P("i"))

    def host_roundtrip(v):  # runs eagerly; np.asarray of a tracer cannot be traced
        return jax.device_put(np.asarray(v) * 2, sharding)

    x = jax.device_put(X, sharding)
    with pytest.raises(conformance.NotCheckable, match="^trace failed: TracerArrayConversionError"):
        conformance.check(host_roundtrip, x)


def test_the_timeout_has_a_documented_default_and_is_validated():
    assert inspect.signature(conformance.check).parameters["timeout"].default == check_mod.DEFAULT_TIMEOUT == 300.0
    assert issubclass(conformance.CheckTimeout, TimeoutError)
    f = jax.jit(lambda v: v * 2)
    for bad in (math.nan, math.inf, -1.0, 0):
        with pytest.raises(ValueError, match=r"^timeout="):
            conformance.check(f, X, timeout=bad)
    assert conformance.check(f, X, timeout=None).ok and conformance.check(f, X, timeout=60).ok


HANG = textwrap.dedent("""
    import os, sys
    from xla_backend import platform
    platform.configure("cpu", 8)
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    import conformance

    def spin(v):  # a device-side infinite loop: XLA never finishes it
        return jax.lax.while_loop(lambda c: c[0] >= 0, lambda c: (c[0] * 1, c[1] + 1.0), (jnp.int32(0), v))[1]

    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    try:
        conformance.check(spin, np.arange(8.0, dtype=np.float32), mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                          timeout=1)
    except conformance.CheckTimeout as e:
        print(f"CheckTimeout({e.name!r}, {e.timeout}): {e}", flush=True)
    # the computation still runs: the process would not exit on its own (documented)
    os._exit(0)
""")


def test_a_device_side_infinite_loop_times_out_naming_the_program():
    r = subprocess.run([sys.executable, "-c", HANG], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("CheckTimeout('spin', 1): check: XLA did not finish spin within timeout=1 s"), line
    assert "keeps running in the background" in line and "os._exit" in line
