"""Meta-tests of programs(): JAX runs every draw, every family is reached, reproducers run."""
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.cases import Program, device_order
from conformance.strategies import meshes
from conformance.strategies.programs import FAMILIES, programs
from refsim.layouts.mesh import Mesh
from test_strategies_collectives import _run_script, assert_matches_refsim, run_on_jax

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
@given(st.data())
def test_programs_run_on_jax(data):
    m = data.draw(meshes())
    p = data.draw(programs(m))
    assert isinstance(p, Program)
    assert_matches_refsim(p, run_on_jax(p))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_programs_reach_and_run_every_family(family):
    mesh = Mesh((4,), ("i",)) if family == "pmap_grouped" else Mesh((2, 2), ("x", "y"))
    p = find(programs(mesh, families=(family,)), lambda p: True,
             settings=settings(max_examples=2000, database=None, phases=(Phase.generate,)))
    assert p.family == family and p.case_id.startswith(family + "[")
    assert_matches_refsim(p, run_on_jax(p))


def test_reshard_targets_another_device_order():
    p = find(programs(Mesh((2, 4), ("x", "y")), families=("reshard_device_order",)),
             lambda p: dict(p.labels)["to"] == "transposed", settings=settings(max_examples=2000, database=None, phases=(Phase.generate,)))
    assert p.entry == "device_put" and device_order(p.out_shardings.mesh) == "transposed"


def test_programs_skip_families_the_mesh_cannot_run():
    p = find(programs(Mesh((4,), ("i",)), families=("nested_shard_map", "pmap_grouped")), lambda p: True, settings=settings(max_examples=2000, database=None, phases=(Phase.generate,)))
    assert p.family == "pmap_grouped"
    with pytest.raises(InvalidArgument, match="none of families=\\('nested_shard_map',\\) can run"):
        programs(Mesh((4,), ("i",)), families=("nested_shard_map",)).example()
    with pytest.raises(InvalidArgument, match="families contains 'fft'"):
        programs(Mesh((4,), ("i",)), families=("fft",)).example()


def test_jit_program_reproducer_runs(tmp_path):
    p = find(programs(Mesh((2, 2), ("x", "y")), families=("jit_constraint",)), lambda p: True, settings=settings(max_examples=2000, database=None, phases=(Phase.generate,)))
    r = _run_script(tmp_path, p.repro(run_on_jax(p)))
    assert r.returncode == 0, r.stdout + r.stderr
