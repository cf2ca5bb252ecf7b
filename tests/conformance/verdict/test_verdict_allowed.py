"""The allowed set as the verdict (conformance.verdict.allowed, issue 39): per element agree,
disagree or undecidable; the tighter of the allowed set and the heuristic; relaxations named."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import conformance
from refsim import compat
import refsim
from conformance.verdict import allowed, compare

MESH5 = jax.make_mesh((5,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))


def _pmean(v):
    return lax.pmean(v, "i")


def _policy(center, bound, refsim_value, heuristic):
    return allowed.AllowedSet(n=1, exact={0: np.asarray(center, np.float64)}, abs_sum={0: np.asarray(bound, np.float64)},
                              fallback_ref={0: np.asarray(refsim_value)}, fallback_allowed=heuristic)


def _one(values, dtype=np.float32):
    sh = refsim.NamedSharding(refsim.Mesh((1,), ("x",)), refsim.P())
    return refsim.device_put(np.asarray(values, dtype), sh)


def test_each_element_is_held_to_the_tighter_rule_and_undecidable_ones_to_the_heuristic():
    center = [1.0, 100.0, 5.0]
    bound = [1e-6, 1.0, np.nan]                       # the second wider than the heuristic, the third undecidable
    pol = _policy(center, bound, np.float32([1.0, 100.0, 7.0]), heuristic=1e-3)
    assert pol.governed(0).tolist() == [True, False, False]
    ref = _one([1.0, 100.0, 7.0])
    assert compare.compare(ref, _one([1.0, 100.0005, 7.0005]), tolerances=pol).ok
    assert not compare.compare(ref, _one([1.00001, 100.0, 7.0]), tolerances=pol).ok      # beyond 1e-6
    assert not compare.compare(ref, _one([1.0, 100.01, 7.0]), tolerances=pol).ok         # beyond the heuristic
    # the undecidable element is not judged: anything, NaN included
    assert compare.compare(ref, _one([1.0, 100.0, np.nan]), tolerances=pol).ok
    (v,) = allowed.verdicts([pol], [_one([1.0, 100.0, 7.0])])
    assert (v.elements, v.heuristic, v.undecidable, v.outside) == (3, 1, 1, 0)


def test_the_pmean_over_5_rewrite_disagrees_with_the_spec_and_is_named_under_the_relaxation():
    x = np.array([9, 0, 0, 0, 0], np.int32)
    kw = dict(mesh=MESH5, in_specs=P("i"), out_specs=P(), explain=False)
    with pytest.raises(conformance.ConformanceError) as info:
        conformance.check(_pmean, x, policy="spec", **kw)
    text = str(info.value)
    assert "exactly one allowed value" in text and "made last by div at" in text, text
    assert "exact 1.7999999523162842, xla 1.8000000715255737" in text, text
    res = conformance.check(_pmean, x, **kw)                        # default: XLA:CPU's declared relaxations
    assert res.ok and any("agree only under a relaxation (xla-reciprocal-division" in b for b in res.bounds), res.bounds
    assert any(b.startswith("relaxation xla-reciprocal-division (not documented") for b in res.bounds)
    assert conformance.check(_pmean, x, policy="heuristic", **kw).ok and not \
        conformance.check(_pmean, x, policy="heuristic", **kw).bounds


def test_an_output_without_a_bound_rule_keeps_the_heuristic_and_names_the_primitive():
    f = jax.jit(lambda v: (lax.bessel_i1e(v) * 2.0, v * 3.0))
    res = conformance.check(f, np.linspace(1, 5, 8, dtype=np.float32), explain=False)
    assert res.ok
    assert any("output 0: no bound rule for bessel_i1e: held to the heuristic" in b for b in res.bounds), res.bounds
    assert res.outputs[0].policy.startswith("scaled bound") and res.outputs[1].policy.startswith("allowed set")


def test_an_output_decided_by_values_closer_than_their_bounds_is_undecidable_and_counted(tmp_path):
    # ten float32 0.1s add to 1.0000001 in some orders and to 1 or less in others (refsim's):
    # the branch is the spec's either way, so the output is undecidable, not a failure (the
    # heuristic alone calls XLA's order a disagreement)
    f = jax.jit(lambda v: jnp.where(jnp.sum(v) > 1.0, 1.0, -1.0) * v)
    x = np.full(10, 0.1, np.float32)
    res = conformance.check(f, x, explain=False)
    assert res.ok
    (line,) = [b for b in res.bounds if b.startswith("output 0")]
    assert "10 undecidable (decided by values closer than their bounds: not judged)" in line, line
    assert res.undecidable == 10 and res.report().startswith("AGREE (10 element(s) undecidable, not judged)")
    with pytest.raises(conformance.ConformanceError):
        conformance.check(f, x, policy="heuristic", explain=False, repro_dir=str(tmp_path))


def test_a_shallow_program_reports_its_worst_ratio():
    x = np.random.default_rng(0).uniform(-10, 10, (8, 8)).astype(np.float32)
    res = conformance.check(jax.jit(lambda a: jnp.tanh(a @ a.T) + jnp.exp(a / 10)), x, explain=False)
    assert res.ok and res.outputs[0].policy.startswith("allowed set")
    (line,) = res.bounds[:1]
    ratio = float(line.split("worst |xla - exact| / bound ")[1].split()[0])
    assert 0 <= ratio <= 1, line


def test_work_estimate_counts_results_and_dot_products_by_hand():
    from refsim.bounds.coverage import work_estimate

    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    # tanh: 12 results; dot: 15 results x 4 products; add: 15 results
    j = jax.make_jaxpr(lambda x, y: jnp.tanh(x) @ y + 1.0)(a, b)
    assert work_estimate(j) == 12 + 15 * 4 + 15

    def body(c, _):
        return c * 2.0, None
    # a scan of length 7 over a body of one multiply of 3 elements, plus the scan's own 3 results
    j = jax.make_jaxpr(lambda c: lax.scan(body, c, None, length=7)[0])(np.ones(3, np.float32))
    assert work_estimate(j) == 7 * 3 + 3


def test_a_walk_above_the_work_limit_is_not_run_and_the_report_says_so(monkeypatch):
    x = np.array([9, 0, 0, 0, 0], np.int32)
    kw = dict(mesh=MESH5, in_specs=P("i"), out_specs=P(), explain=False)
    monkeypatch.setenv("CONFORMANCE_ALLOWED_SET_MAX_WORK", "1")
    res = conformance.check(_pmean, x, **kw)                        # the heuristic judges: 1 ulp passes
    assert res.ok and any(b.startswith("allowed set not computed: its bound walk would take") and
                          "CONFORMANCE_ALLOWED_SET_MAX_WORK" in b for b in res.bounds), res.bounds
    with pytest.raises(conformance.ConformanceError):               # policy='spec' walks whatever the size
        conformance.check(_pmean, x, policy="spec", **kw)
    monkeypatch.setenv("CONFORMANCE_ALLOWED_SET_MAX_WORK", "lots")
    with pytest.raises(ValueError, match="CONFORMANCE_ALLOWED_SET_MAX_WORK='lots' is not a number"):
        conformance.check(_pmean, x, **kw)


def test_a_device_varying_scalar_beside_a_vector_is_walked_not_refused():
    # pmap's body adds axis_index (a rank-0 value per device) to a rank-1 value: the walk lines the
    # scalar up with the mesh dims as refsim does (it raised a broadcasting ValueError before)
    f = jax.pmap(lambda x, b: x * b + lax.axis_index("i"), axis_name="i", in_axes=(0, None),
                 devices=jax.devices()[:4])
    x, b = np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(3, dtype=np.float32)
    res = conformance.check(f, x, b, explain=False)
    assert res.ok and res.bounds == ["output 0: allowed set for 12 of 12 element(s), worst |xla - exact| / bound 0"], \
        res.bounds
    want = x * b + np.arange(4, dtype=np.float32)[:, None]        # by hand: row i gets i added
    np.testing.assert_array_equal(np.asarray(f(x, b)), want)


def _sums_and_argmax(m):
    y = jnp.sum(m, axis=1)
    return jnp.argmax(y), y


def test_an_integer_output_decided_by_values_closer_than_their_bounds_is_undecidable():
    # row 0 sums to 1 exactly, but in another order of additions to 0 or 2 (1e8 absorbs the 1):
    # its allowed set holds row 1's sum 0.75 and more, so which row is the largest is undecided
    m = np.array([[1e8, 1.0, -1e8], [0.25, 0.5, 0.0]], np.float32)
    res = conformance.check(jax.jit(_sums_and_argmax), m, explain=False)
    assert res.ok and "1 element(s) undecidable" in str(res), str(res)
    assert any("output 0 [0]: allowed set for 0 of 1 element(s)" in b and "1 undecidable" in b for b in res.bounds)
    # well apart, the same argmax is decided and held exact
    m2 = np.array([[1.0, 2.0, 3.0], [0.25, 0.5, 0.0]], np.float32)
    res = conformance.check(jax.jit(_sums_and_argmax), m2, explain=False)
    assert res.ok and "undecidable" not in str(res) and "int32[] on 1 devices, layout from xla, policy exact" in str(res)


def test_an_integer_output_decided_by_values_without_a_bound_rule_is_not_compared():
    # complex values have no bound rule: the comparison of their real parts decides the bools,
    # so nothing says which bools the spec allows (a `while` loop's trip count turning on a
    # complex residual was a false alarm of jax's pjit_test.py::test_sparse_linalg_cg_indexing)
    z = (np.arange(4) * (0.3 + 0.4j)).astype(np.complex64)
    res = conformance.check(jax.jit(lambda z: jnp.real(z * z) > 0.5), z, explain=False)
    assert res.ok and "4 element(s) undecidable" in str(res), str(res)
    assert any("bool decided by values without a bound rule (complex values" in b for b in res.bounds), res.bounds


def test_exact_outputs_hold_decided_integer_elements_exact_and_free_the_undecided():
    from conformance.oracle.policy import allowed_set

    m = np.array([[1e8, 1.0, -1e8], [1.0, 2.0, 3.0], [0.25, 0.5, 0.0], [0.5, 0.5, 0.5]], np.float32)

    def rowwise(m):                    # per row: is its sum above 1? rows 0 (1, or 0 or 2) undecided
        return jnp.sum(m, axis=1) > 1.0, jnp.arange(4) * 2

    closed = jax.make_jaxpr(rowwise)(m)
    ref = [_one([False, True, False, True], bool), _one(np.arange(4) * 2, np.int32)]
    pols, notes, _ = allowed_set(closed, [m], ref, [compare.EXACT, compare.EXACT])
    assert isinstance(pols[0], allowed.AllowedSet) and pols[1] is compare.EXACT   # arange * 2: integers only
    assert np.isnan(pols[0].abs_sum[0]).tolist() == [True, False, False, False]
    # a decided element that XLA got wrong is still a disagreement; the undecided one is free
    assert not compare.compare(ref[0], _one([False, False, False, True], bool), tolerances=pols[0]).ok
    assert compare.compare(ref[0], _one([True, True, False, True], bool), tolerances=pols[0]).ok


def test_arguments_in_a_wider_dtype_are_walked_as_the_program_sees_them():
    # jax.test_util.check_grads calls a float32 program with float64 NumPy arrays x +- eps * v; JAX
    # rounds them to float32, and so must the bound walk: it had centred sin(cos(x)) on the
    # unrounded float64 argument, 1.65e-7 away from the value every implementation computes
    # (shard_map_test.py::test_jvp_basic under oracle mode, jax 0.12: a false alarm)
    x = np.arange(16.0).reshape(4, 4) + 1e-4 * np.sin(np.arange(16.0)).reshape(4, 4)     # float64
    f = jax.jit(lambda x: jnp.sin(jnp.cos(x)))
    res = conformance.check(f, x, explain=False)
    assert res.ok and "allowed set for 16 of 16" in str(res), str(res)
    closed = jax.make_jaxpr(f)(x)
    from refsim import bounds
    center = bounds.evaluate(closed, [x]).outputs[0].center
    np.testing.assert_array_equal(center, np.sin(np.cos(x.astype(np.float32).astype(np.float64))))


def test_replicas_a_check_vma_false_body_breaks_get_no_single_center():
    # shard_map_test.py::test_shmap_close_over_unused_params (jax 0.12): with check_vma=False a body
    # may return a different value on each device along an axis out_specs leaves unnamed; every
    # device keeps its own (sum of its rows: 120 on device 0, 376 on device 1, by hand), and the
    # walk had centred both on device 0's value (a false alarm)
    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.jit(jax.shard_map(lambda b: jnp.sum(b), mesh=mesh, in_specs=P("data"), out_specs=P(),
                              check_vma=False))
    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    assert [float(np.asarray(s.data)) for s in f(x).addressable_shards] == [120.0, 376.0]
    res = conformance.check(f, x, explain=False)
    assert res.ok, str(res)
    assert any("no bound rule for replicas that differ" in b for b in res.bounds), res.bounds


def test_a_divisor_broadcast_by_div_itself_is_a_broadcast_for_the_reciprocal_relaxation():
    """jnp's a / b of shapes (..., 5) and (..., 1) binds one `div` whose divisor has size-1 dimensions;
    XLA lowers it with a broadcast_in_dim and its algebraic simplifier computes A * Broadcast(1 / B).
    A softmax's normalisation (flax's nnx MultiHeadAttention, oracle mode on flax's spmd_test.py,
    jax 0.10.2) gave 75 of 400 quotients 1 ulp from the correctly rounded one, and the walk held
    them to it (bound 0) because the divisor was no broadcast equation: a false alarm. With the
    relaxation they agree, and policy="spec" still names them."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    e = np.exp(rng.normal(size=(2, 4, 2, 5, 5))).astype(np.float32)
    s = e.sum(-1, keepdims=True)
    q = np.asarray(jax.jit(jnp.true_divide)(e, s))
    if not compat.xla_divides_by_broadcast_reciprocal():
        # jaxlib 0.9.2 keeps the divide: every quotient correctly rounded, none needs the relaxation
        assert (q == e / s).all()
        res = conformance.check(jnp.true_divide, e, s)
        assert not any("agree only under a relaxation" in b for b in res.bounds), res.bounds
        conformance.check(jnp.true_divide, e, s, policy="spec")     # passes: no ConformanceError
        return
    assert (q != e / s).any()                      # XLA's quotients are not all correctly rounded
    res = conformance.check(jnp.true_divide, e, s)
    assert any("agree only under a relaxation (xla-reciprocal-division" in b for b in res.bounds), res.bounds
    with pytest.raises(conformance.ConformanceError):
        conformance.check(jnp.true_divide, e, s, policy="spec")
    # the same shapes without a broadcast: no relaxation is asked for
    full = np.broadcast_to(s, e.shape).copy()
    assert not any("xla-reciprocal-division" in b for b in conformance.check(jnp.true_divide, e, full).bounds)
