"""model(xla-cpu-arith) predicts XLA:CPU's zero signs: its all-reduce sum starts from +0 and adds
the group's members in order with every operand and partial sum flushed to zero (keeping its
sign), and a folded ``a + axis_index`` (a size-1 axis) returns ``a``. Expected values are hand
computed; a planted fault that flips one zero's sign is a failure under the model."""
import dataclasses

import ml_dtypes
import numpy as np
import pytest

import refsim
import xla_backend
from conformance.cases import CollectiveCall
from conformance.engine import runner
from conformance.suites import base
from conformance.verdict import platform_models, xfails
from conformance.verdict.compare import compare
from fake_arrays import Arr, Sh
from refsim import Mesh, PartitionSpec as P

T = 2.0 ** -126  # float32's smallest normal: below it XLA:CPU flushes to a zero of the same sign


def _reduce(name, x, n):
    """psum / pmean over a 1-D mesh of n devices, device d holding x[d]."""
    return CollectiveCall(family=name, source=f"def f(a):\n    return jax.lax.{name}(a, 'x')\n", entry="shard_map",
                          mesh=Mesh((n,), ("x",)), args=(x,), in_specs=(P("x"),), out_specs=P(),
                          labels=(("axes", "'x'"),), outputs=("mean" if name == "pmean" else "sum",), name=name,
                          params={"axis_name": "x"})


def _axis_index(x, mesh, axes):
    return CollectiveCall(family="axis_index", entry="shard_map",
                          source=f"def f(a):\n    return a + jax.lax.axis_index({axes!r}).astype(a.dtype)\n",
                          mesh=mesh, args=(x,), in_specs=(P(mesh.axis_names),), out_specs=P(mesh.axis_names),
                          labels=(("axes", repr(axes)),), outputs=("exact",), name="axis_index",
                          params={"axis_name": axes})


def _bits(result):
    """Every device's shard as (device id, float32 bit patterns)."""
    return [(int(s.device_id), np.asarray(s.data, np.float32).view(np.uint32).ravel().tolist())
            for s in sorted(result.shards, key=lambda s: s.device_id)]


def _planted(result, device, element, value):
    """XLA's `result` with one element of one device's shard replaced (a planted miscompile)."""
    shards = []
    for s in result.shards:
        data = np.array(s.data, copy=True)
        if int(s.device_id) == device:
            data.reshape(-1)[element] = value
        shards.append(Sh(int(s.device_id), s.index, data))
    return Arr(tuple(result.shape), result.dtype, shards)


NZ = -0.0
# per device one row; the columns: all -0 | +0 and -0 | x + -x | a sum of -T/4, flushed |
# -1e-40 and -0 (a subnormal input: flushed to -0 first)
PSUM_IN = np.array([[NZ, 0.0, 1.0, -1.5 * T, -1e-40],
                    [NZ, NZ, -1.0, 1.25 * T, NZ]], np.float32)
# XLA:CPU: +0 + t0 + t1 with flushing: +0, +0, +0, -0 (-T/4 flushed), +0 (+0 + -0 + -0 = +0)
PSUM_XLA = [0.0, 0.0, 0.0, NZ, 0.0]
# StableHLO / refsim: -0 (every term -0), +0, +0, -T/4, -1e-40 (nothing flushed)
PSUM_SPEC_SIGNS = [True, False, False, True, True]


def test_cpu_sum_hand_computed():
    got = platform_models._cpu_sum(PSUM_IN, mean=False)
    assert got.view(np.uint32).tolist() == np.array(PSUM_XLA, np.float32).view(np.uint32).tolist()
    # group order matters once a partial sum flushes: a, b, c, d (multiples of 2**-128; every
    # partial sum exact) sum to 0 exactly, but +0 + a + b = T/4 flushes to +0, + c + d = -T/4 -> -0
    a, b, c, d = 1.5 * T, -1.25 * T, 1.25 * T, -1.5 * T
    assert np.signbit(platform_models._cpu_sum(np.array([a, b, c, d], np.float32), mean=False))
    assert not np.signbit(platform_models._cpu_sum(np.array([a, d, b, c], np.float32), mean=False))  # a+d = -T/4 -> -0; +b+c = +0
    # a mean: the sum -1.5*T is normal, divided by 2 it is -0.75*T -> -0
    m = platform_models._cpu_sum(np.array([-1.5 * T, 0.0], np.float32), mean=True)
    assert m == 0 and np.signbit(m)
    # bfloat16 is added in float32 and rounded back; complex adds its parts separately
    bf = platform_models._cpu_sum(np.array([NZ, NZ], ml_dtypes.bfloat16), mean=False)
    assert bf.dtype == ml_dtypes.bfloat16 and float(bf) == 0 and not np.signbit(np.float32(bf))
    cx = platform_models._cpu_sum(np.array([complex(NZ, NZ), complex(NZ, 1.0)], np.complex64), mean=False)
    assert not np.signbit(cx.real) and cx.imag == 1.0
    # float16 subnormals are normal in float32: kept, and -0 + -0 still starts from +0
    h = platform_models._cpu_sum(np.array([[2.0 ** -24, NZ], [NZ, NZ]], np.float16), mean=False)
    assert h.tolist() == [2.0 ** -24, 0.0] and not np.signbit(h).any()


def test_xla_cpu_psum_zero_signs_are_the_models_and_a_flipped_sign_is_caught():
    call = _reduce("psum", PSUM_IN, 2)
    xla = call.run(xla_backend)
    want = np.array(PSUM_XLA, np.float32).view(np.uint32).tolist()
    assert _bits(xla) == [(0, want), (1, want)]                         # hand computed, both devices
    assert np.signbit(np.asarray(call.run(refsim))).ravel().tolist() == PSUM_SPEC_SIGNS
    assert not compare(call.run(refsim), xla, case=call).ok             # the spec's signs differ
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    # a planted fault that flips any one zero's sign: XLA:CPU's own sign is predicted, so each is caught
    for element, v in enumerate(PSUM_XLA):
        flipped = _planted(xla, 1, element, -v if v == 0 else v)
        assert platform_models.check("xla-cpu-arith", call, flipped) is False, element


def test_xla_cpu_pmean_of_a_sum_flushed_after_the_division_is_negative_zero():
    # (-1.5*T + 0) / 2 = -0.75*T, a float32 subnormal: XLA:CPU gives -0.0, refsim (spec) -0.75*T
    call = _reduce("pmean", np.array([[-1.5 * T], [0.0]], np.float32), 2)
    xla = call.run(xla_backend)
    assert _bits(xla) == [(0, [0x80000000]), (1, [0x80000000])]
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    assert platform_models.check("xla-cpu-arith", call, _planted(xla, 0, 0, 0.0)) is False


def test_xla_cpu_psum_adds_in_group_order_where_a_partial_sum_flushes():
    a, b, c, d = 1.5 * T, -1.25 * T, 1.25 * T, -1.5 * T
    call = _reduce("psum", np.array([[a], [b], [c], [d]], np.float32), 4)
    xla = call.run(xla_backend)
    assert _bits(xla) == [(i, [0x80000000]) for i in range(4)]          # -0: (+0 + a + b -> +0) + c + d -> -0
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    assert platform_models.check("xla-cpu-arith", call, _planted(xla, 2, 0, 0.0)) is False
    # the same terms as a, d, b, c: a + d = -T/4 flushes to -0, + b + c cancels to +0 (also the spec's)
    other = _reduce("psum", np.array([[a], [d], [b], [c]], np.float32), 4)
    assert _bits(other.run(xla_backend)) == [(i, [0]) for i in range(4)]


@pytest.mark.parametrize("axes, xla_zero", [(("x", "y"), 0x80000000), (("y", "x"), 0)])
def test_the_group_order_is_the_order_of_the_axes_given(axes, xla_zero):
    # devices 0..3 of a 2x2 mesh hold a, b, c, d; over ('y', 'x') the group is devices 0, 2, 1, 3:
    # +0 + a + c - b = 1.5*T, + d = +0 (no partial sum flushes); over ('x', 'y') as above, -0
    a, b, c, d = 1.5 * T, -1.25 * T, 1.25 * T, -1.5 * T
    call = CollectiveCall(family="psum", source=f"def f(a):\n    return jax.lax.psum(a, {axes!r})\n",
                          entry="shard_map", mesh=Mesh((2, 2), ("x", "y")),
                          args=(np.array([[a], [b], [c], [d]], np.float32),), in_specs=(P(("x", "y")),),
                          out_specs=P(), labels=(("axes", repr(axes)),), outputs=("sum",), name="psum",
                          params={"axis_name": axes})
    xla = call.run(xla_backend)
    assert _bits(xla) == [(i, [xla_zero]) for i in range(4)]
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    assert platform_models.check("xla-cpu-arith", call, _planted(xla, 3, 0, 0.0 if xla_zero else NZ)) is False


def test_unfolded_axis_index_zero_signs_are_ieee_and_a_planted_negative_zero_is_caught():
    # a + axis_index over a size-3 axis is computed: device 0 adds +0, -0 + 0 = +0 (IEEE and XLA:CPU)
    x = np.array([NZ, 1.0, 2.0], np.float32)
    call = _axis_index(x, Mesh((3,), ("x",)), "x")
    xla = call.run(xla_backend)
    assert _bits(xla) == [(0, [0]), (1, [np.float32(2).view(np.uint32)]), (2, [np.float32(4).view(np.uint32)])]
    bad = _planted(xla, 0, 0, NZ)
    assert not compare(call.run(refsim), bad, case=call).ok
    assert platform_models.check("xla-cpu-arith", call, bad) is False


def test_folded_axis_index_predicts_the_input_sign_included():
    # over a size-1 axis a + axis_index is a + 0, folded to a: -0.0 and a subnormal come back as given
    x = np.array([NZ, -1e-40, 1.0], np.float32)
    call = _axis_index(x, Mesh((3, 1), ("x", "y")), ("y",))
    xla = call.run(xla_backend)
    assert [b for _, b in _bits(xla)] == [[v] for v in x.view(np.uint32).tolist()]
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    # a +0 on device 0 is the spec's (refsim: -0 + 0 = +0), so it is a spec pass, not the model's;
    # a -0 where the input was 1.0 is neither
    assert platform_models.check("xla-cpu-arith", call, _planted(xla, 0, 0, 0.0)) is False
    assert platform_models.check("xla-cpu-arith", call, _planted(xla, 1, 0, 1e-40)) is False


def test_folding_applies_only_to_a_size_one_axis_index():
    mesh = Mesh((3, 1), ("x", "y"))
    x = np.zeros(3, np.float32)
    assert platform_models._folded_axis_index(_axis_index(x, mesh, ("x",))) is None
    folded = platform_models._folded_axis_index(_axis_index(x, mesh, ("y",)))
    assert folded.source == "def f(a):\n    return a\n"
    assert platform_models._folded_axis_index(_reduce("psum", x.reshape(3, 1), 3)) is None


class _FlipZeros:
    """An XLA engine whose psum returns -0.0 for every +0.0 (a planted wrong zero sign)."""

    def run_case(self, case):
        out = case.run(xla_backend)
        shards = [Sh(int(s.device_id), s.index,
                     np.where(np.asarray(s.data) == 0, np.float32(NZ), np.asarray(s.data)).astype(np.float32))
                  for s in out.shards]
        return Arr(tuple(out.shape), out.dtype, shards)


def test_a_planted_wrong_zero_sign_fails_a_run_under_the_model_entry():
    # psum over 2 devices of (+0, +0), (1, -1) and (-0, -0): XLA:CPU +0 each; the spec -0 for the last
    call = _reduce("psum", np.array([[0.0, 1.0, NZ], [0.0, -1.0, NZ]], np.float32), 2)
    task = base.group_tasks("collectives", [call], seed=0, variants=1)[0]
    entry = xfails.load(None, platform="cpu").lookup(task.case_id)
    assert entry.signature == "model(xla-cpu-arith)"
    assert runner.run_task(task, None, entry, shrink_seconds=0).status == "xfail"       # XLA:CPU's own
    planted = runner.run_task(task, _FlipZeros(), entry, shrink_seconds=0)
    assert planted.status == "error" and "model 'xla-cpu-arith'" in planted.message, planted.message


@pytest.mark.parametrize("name", ["psum", "pmean"])
def test_a_one_member_group_is_folded_to_its_operand_as_the_spec_says(name):
    # no model needed: psum / pmean over one device returns the operand, -0.0 and subnormals kept
    x = np.array([[NZ, -1e-40]], np.float32)
    call = _reduce(name, x, 1)
    xla = call.run(xla_backend)
    assert _bits(xla) == [(0, x.view(np.uint32).ravel().tolist())]
    assert compare(call.run(refsim), xla, case=call).ok


def test_the_cross_process_model_leaves_a_zero_sums_sign_open_and_still_checks_values():
    # Over gloo (a jax.distributed run) a sum does not start from +0: pmean of three flushed -1e-39
    # gave -0.0 in tests/conformance/engine/test_distributed_run.py where one process gives +0.0
    call = _reduce("pmean", np.full((3, 1), -1e-39, np.float32), 3)
    one_process = call.run(xla_backend)
    assert _bits(one_process) == [(d, [0x00000000]) for d in range(3)]        # in one process: +0
    gloo = _planted(_planted(_planted(one_process, 0, 0, NZ), 1, 0, NZ), 2, 0, NZ)
    assert platform_models.check("xla-cpu-arith", call, gloo) is False       # the in-process model: +0
    assert platform_models.check("xla-cpu-gloo-arith", call, gloo) is True
    assert platform_models.check("xla-cpu-gloo-arith", call, _planted(gloo, 1, 0, 0.0)) is True
    # values are still checked: a nonzero where the flushed sum is 0, and a wrong sum, are caught
    assert platform_models.check("xla-cpu-gloo-arith", call, _planted(gloo, 1, 0, -1e-30)) is False
    plain = _reduce("psum", np.array([[1.0], [2.0]], np.float32), 2)
    ok = plain.run(xla_backend)
    assert platform_models.check("xla-cpu-gloo-arith", plain, ok) is True
    assert platform_models.check("xla-cpu-gloo-arith", plain, _planted(ok, 0, 0, 4.0)) is False


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_a_narrow_float_psum_of_negative_zeros_is_xla_cpus_positive_zero(dtype):
    """float16 / bfloat16 psum over 3 devices of (-0, -0, -0) and of (-1.25, -0, 2): XLA:CPU adds
    in float32 from +0, so +0.0 and 0.75; refsim and StableHLO: -0.0 and 0.75 (seed 5 of the
    default run, a float16 psum: the model kept refsim's -0 and called XLA's +0 a failure)."""
    x = np.array([[NZ, -1.25], [NZ, NZ], [NZ, 2.0]], dtype)
    call = _reduce("psum", x, 3)
    xla = call.run(xla_backend)
    for s in xla.shards:
        got = np.asarray(s.data, np.float32).ravel()
        assert got.tolist() == [0.0, 0.75] and not np.signbit(got).any()    # hand computed
    assert not compare(call.run(refsim), xla, case=call).ok                  # the spec's -0 differs
    assert platform_models.check("xla-cpu-arith", call, xla) is True
    assert platform_models.check("xla-cpu-arith", call, _planted(xla, 1, 0, dtype(NZ))) is False
    z = platform_models._signed_like(np.array([NZ, 3.0], dtype), np.array([0.0, 3.0], dtype))
    assert not np.signbit(np.asarray(z, np.float32)).any()
