"""conformance.cases.source: the PartitionSpec source a case or a reproducer writes rebuilds the spec."""
import pytest
from jax.sharding import PartitionSpec as P

from conformance.cases.source import spec_source
from refsim import compat
from refsim.layouts.partition_spec import PartitionSpec


@pytest.mark.parametrize("spec, text", [
    (PartitionSpec("x", None), "P('x', None)"),
    (PartitionSpec(("x", "y")), "P(('x', 'y'))"),
    (PartitionSpec("x", None, unreduced={"z", "y"}), "P('x', None, unreduced={'y', 'z'})"),
    (PartitionSpec(None, reduced={"y"}), "P(None, reduced={'y'})"),
])
def test_spec_source_keeps_every_part_of_the_spec(spec, text):
    assert spec_source(spec) == text
    if (spec.unreduced or spec.reduced) and not compat.supports_unreduced_specs():
        pytest.skip("this JAX's PartitionSpec has no unreduced / reduced axes")
    assert eval(text, {"P": P}) == spec.to_jax()
