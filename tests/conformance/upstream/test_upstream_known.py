"""conformance.upstream.known: docs/found-bugs.md read as data, and conservative matches with a reason."""
import pytest

from conformance.upstream import known

BUGS = known.load()
BY_NUMBER = {b.number: b for b in BUGS}


def test_every_entry_of_the_page_is_read_with_its_failures():
    assert [b.number for b in BUGS] == list(range(1, len(BUGS) + 1)) and len(BUGS) >= 25
    assert all(b.failures and b.title and b.reproduces for b in BUGS), [b.number for b in BUGS if not b.failures]
    assert {f[1] for b in BUGS for f in b.failures} == {"wrong-values", "raises", "aborts"}
    assert BY_NUMBER[1].ops == {"slice"} and BY_NUMBER[4].all_ops and BY_NUMBER[4].correct == ("0.12.0.1",)
    assert BY_NUMBER[22].ops == {"cumlogsumexp", "scatter_min"} and BY_NUMBER[22].partitioner == "gspmd"
    assert BY_NUMBER[19].transforms == ("grad", "vjp") and BY_NUMBER[19].partitioner == "shardy"


def test_an_abort_matches_by_its_fatal_line_and_names_every_entry_with_that_check():
    line = ("F1126 06:34:17.634 18514 spmd_partitioner.cc:2104] Check failed: "
            "get_first_valid_element_offset_on_dilated_shard(0) == swd->padding_low() (1 vs. -1)")
    m = known.match(BUGS, version="0.10.2", kind="aborts", text=line)
    assert (m.number, m.also) == (10, (23,)) and "`aborts with`" in m.why and "numbers dropped" not in m.why
    other = line.replace("(1 vs. -1)", "(2 vs. -3)")
    m = known.match(BUGS, version="0.10.2", kind="aborts", text=other)
    assert m.number == 10 and "with the numbers dropped" in m.why
    assert known.match(BUGS, version="0.10.2", kind="aborts", text="F1126 x.cc:1] Check failed: something else") is None


def test_an_exception_matches_only_with_its_class_and_message():
    msg = ("INTERNAL: during context [hlo verifier]: Expected instruction to have shape equal to f32[5], actual "
           "shape is f32[2]")
    m = known.match(BUGS, version="0.12.0.1", kind="raises", cls="JaxRuntimeError", text=msg)
    assert m.number == 25 and "numbers dropped" in m.why
    assert known.match(BUGS, version="0.12.0.1", kind="raises", cls="ValueError", text=msg) is None


@pytest.mark.parametrize("kw, number", [
    (dict(ops=["slice", "with_sharding_constraint"]), 1),
    (dict(ops=["relu"], transform="grad", partitioner="gspmd"), None),
    (dict(ops=["conv"], transform="grad", partitioner="shardy"), 19),
    (dict(ops=["conv"], transform="grad", partitioner="gspmd"), None),        # 19 is Shardy's
    (dict(ops=["conv"], transform="none", partitioner="shardy"), 37),         # 19 needs a derivative, 37 is forward
    (dict(ops=["conv"], transform="none", partitioner="gspmd"), None),        # 37 is Shardy's
    (dict(ops=["scatter_min"], transform="grad", partitioner="gspmd"), None),  # 22 needs cumlogsumexp too
    (dict(ops=["cumlogsumexp", "scatter_min"], transform="vjp", partitioner="gspmd"), 22),
    (dict(ops=["with_sharding_constraint"]), None),                          # no op of its own
])
def test_wrong_values_match_by_the_ops_the_entry_names(kw, number):
    m = known.match(BUGS, version="0.10.2", kind="wrong-values", **kw)
    assert (m.number if m else None) == number, m
    if m:
        assert "ops the entry names" in m.why


def test_an_entry_is_not_matched_on_a_version_it_says_is_correct():
    kw = dict(kind="wrong-values", ops=["reshape", "scatter_set"])
    assert known.match(BUGS, version="0.10.2", **kw).number == 4
    assert known.match(BUGS, version="0.12.0.1", **kw) is None


def test_numbers_are_generalised_but_not_the_rest_of_the_regex():
    g = known.generalised(r"f32\[3\], actual shape is f32\[1\] \(1 vs\. -1\)")
    assert g == r"f-?\d+\[-?\d+\], actual shape is f-?\d+\[-?\d+\] \(-?\d+ vs\. -?\d+\)"


def test_a_missing_page_means_every_finding_is_new(tmp_path):
    assert known.load(str(tmp_path / "absent.md")) == []
    assert known.match([], version="0.10.2", kind="wrong-values", ops=["slice"]) is None


def test_a_new_finding_may_resemble_an_entry_by_op_families_without_being_known():
    kw = dict(ops=["expand_dims", "scatter_mul", "with_sharding_constraint"], transform="vmap")
    assert known.match(BUGS, version="0.10.2", kind="wrong-values", **kw) is None
    like = known.resembles(BUGS, version="0.10.2", **kw)
    assert like.number == 4 and "same families" in like.why
    assert known.resembles(BUGS, version="0.12.0.1", **kw) is None          # 4 is fixed there
    assert known.resembles(BUGS, version="0.10.2", ops=["expand_dims"]) is None   # 4 needs a scatter too
