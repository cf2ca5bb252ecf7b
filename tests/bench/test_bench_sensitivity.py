"""bench/sensitivity.py: the planted k-ulp product error that each policy catches (no timing)."""
import jax

from bench import sensitivity


def test_eight_units_of_roundoff_in_every_product_are_caught_by_the_allowed_set_not_the_heuristic():
    fn, args = jax.jit(sensitivity.program), sensitivity.inputs(0)
    assert not sensitivity.caught(fn, args, "auto")[0]                    # healthy: agrees
    assert sensitivity.caught(fn, args, "auto", sensitivity.product_fault(8))[0]
    assert not sensitivity.caught(fn, args, "heuristic", sensitivity.product_fault(8))[0]
    assert sensitivity.caught(fn, args, "heuristic", sensitivity.product_fault(1024))[0]


def test_the_pmean_row_names_the_division():
    row = sensitivity.pmean_rewrite()
    assert row["xla"] != row["correctly_rounded"]
    assert row["spec"]["verdict"] == "disagree" and "div at" in row["spec"]["note"]
    assert row["auto"]["verdict"] == "agree" and "xla-reciprocal-division" in row["auto"]["note"]
