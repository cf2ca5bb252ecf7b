"""HloSharding text as XLA dumps print it, with `metadata={...}` after the sharding (issue 28,
point 7): parsed, the metadata ignored (it says where a sharding came from, not what it is)."""
import re

import pytest

from refsim import HloSharding


@pytest.mark.parametrize("text, plain", [
    ('{devices=[2,1,4]<=[8] last_tile_dim_replicate metadata={op_name="jit(f)/sharding_constraint" '
     'source_file="/tmp/a{b}.py" source_line=3}}', "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    ('{replicated metadata={op_name="r"}}', "{replicated}"),
    ('{maximal device=3 metadata={{op_name="a"}, {op_name="b"}}}', "{maximal device=3}"),
    ('{devices=[2,2]0,2,1,3 metadata={op_name="say \\"}\\""}}', "{devices=[2,2]0,2,1,3}"),
    ('{devices=[2,4]<=[4,2]T(1,0) last_tile_dims={manual} metadata={}}',
     "{devices=[2,4]<=[4,2]T(1,0) last_tile_dims={manual}}"),
])
def test_metadata_is_accepted_and_ignored(text, plain):
    assert HloSharding.parse(text) == HloSharding.parse(plain)
    assert str(HloSharding.parse(text)) == plain


@pytest.mark.parametrize("text, where", [
    ('{devices=[2,4]<=[8] metadata={op_name="x"}', "expected '}', got end of text"),
    ('{devices=[2,4]<=[8] metadata={op_name="x"', "expected a metadata={...} block closed by '}'"),
    ('{devices=[2,4]<=[8] metadat={op_name="x"}}', "expected '}', got 'metadat="),
])
def test_bad_metadata_is_still_refused(text, where):
    with pytest.raises(ValueError, match="Bad HloSharding text .*" + re.escape(where)):
        HloSharding.parse(text)
