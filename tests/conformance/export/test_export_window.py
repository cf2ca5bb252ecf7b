"""The compatibility window (conformance.export.window): which artifacts a JAX promises to run."""
import jax
import pytest

from conformance.export import window

RUNNER = {"calling_convention": [9, 10], "stablehlo": {"minimum": "0.9.0", "current": "1.17.0"}}


def test_the_artifacts_stablehlo_version_is_read_from_its_producer_string():
    assert window.stablehlo_version(b"ML\xefR\x01StableHLO_v1.15.0\x00\x01") == "1.15.0"
    assert window.stablehlo_version(b"no producer here") is None


@pytest.mark.parametrize("program, why", [
    ({"calling_convention_version": 10, "stablehlo_version": "1.15.0"}, []),
    ({"calling_convention_version": 9, "stablehlo_version": "1.17.0"}, []),
    ({"calling_convention_version": 10, "stablehlo_version": "1.18.0"},
     ["StableHLO artifact v1.18.0 is newer than this JAX's StableHLO v1.17.0 (forward compatibility covers about "
      "1 month)"]),
    ({"calling_convention_version": 10, "stablehlo_version": "0.8.9"},
     ["StableHLO artifact v0.8.9 is older than this JAX's minimum v0.9.0 (backward compatibility covers 6 months)"]),
    ({"calling_convention_version": 11, "stablehlo_version": "1.10.0"},
     ["calling convention version 11 is outside this JAX's supported [9, 10]"]),
    ({"calling_convention_version": 8, "stablehlo_version": None},
     ["calling convention version 8 is outside this JAX's supported [9, 10]",
      "the artifact names no StableHLO version (None)"]),
])
def test_outside_names_every_reason(program, why):
    assert window.outside(program, RUNNER) == why


def test_versions_compare_as_numbers_not_text():
    assert window.outside({"calling_convention_version": 10, "stablehlo_version": "1.9.0"},
                          {"calling_convention": [9, 10], "stablehlo": {"minimum": "0.9.0", "current": "1.10.0"}}) == []


def test_the_installed_window_is_jaxs_own():
    mine = window.installed()
    assert mine["jax"] == jax.__version__
    assert mine["calling_convention"] == [jax.export.minimum_supported_calling_convention_version,
                                          jax.export.maximum_supported_calling_convention_version]
    lo, hi = mine["calling_convention"]
    assert lo <= mine["calling_convention_exported"] <= hi
    # what this JAX exports is inside its own window
    from conformance.export.write import export_function
    import numpy as np
    import refsim

    mesh = refsim.Mesh((2,), ("x",))
    s = refsim.NamedSharding(mesh, refsim.PartitionSpec("x"))
    _, _, meta = export_function(lambda a: (a + 1,), mesh=mesh, args=(np.float32([1, 2]),), in_shardings=(s,),
                                 out_shardings=(s,))
    assert window.outside(meta, mine) == []


def test_jaxs_refusal_of_an_expired_artifact_is_recognised():
    msg = ("Exported being deserialized seems to be older than the 6-month backward-compatibility window and cannot "
           "be deserialized anymore.The Exported uses serialization version 3.")
    assert window.refused_as_expired(ValueError(msg))
    assert not window.refused_as_expired(ValueError("Cannot lower jaxpr with verifier errors"))
    assert not window.refused_as_expired(RuntimeError(msg))
