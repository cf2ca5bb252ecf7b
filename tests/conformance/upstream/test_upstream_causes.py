"""conformance.upstream.causes: findings grouped by what they are, numbers dropped, with the reason."""
from conformance.upstream.causes import cause_key, group, numbers_dropped


def test_the_same_check_with_other_numbers_is_one_cause():
    a = cause_key("crash", "spmd_partitioner.cc", "x", text="F1126 06:34:17.634 18514 spmd_partitioner.cc:2104] "
                  "Check failed: offset(0) == swd->padding_low() (1 vs. -1)", op_patterns=[("pad", "sharded")])
    b = cause_key("crash", "spmd_partitioner.cc", "x", text="F0101 01:02:03.004 7 spmd_partitioner.cc:2222] "
                  "Check failed: offset(0) == swd->padding_low() (2 vs. -3)", op_patterns=[("reduce_window", "uneven")])
    assert a == b == "abort in spmd_partitioner.cc: Check failed: offset(N) == swd->padding_low() (N vs. -N)"
    c = cause_key("crash", "hlo_sharding_util.cc", "x", text="F... hlo_sharding_util.cc:1] Check failed: sliced")
    assert c != a


def test_wrong_values_are_one_cause_per_stage_op_and_sharding_pattern():
    k = cause_key("mismatch:compiler", "stablehlo.slice", "value", op_patterns=[("slice", "sharded"),
                                                                               ("with_sharding_constraint", "x")])
    assert k == "wrong values (value) at the compiler stage, stablehlo.slice, from slice(sharded)"
    assert k != cause_key("mismatch:compiler", "stablehlo.slice", "value", op_patterns=[("slice", "replicated")])


def test_an_exception_keeps_two_lines_of_its_message_without_numbers():
    k = cause_key("lowering", "top_k", "ValueError: Cannot lower", text="Cannot lower jaxpr with verifier errors:\n"
                  "\ttype of return operand 0 ('tensor<3x2xf32>') doesn't match")
    assert k == "lowering ValueError: Cannot lower jaxpr with verifier errors: / type of return operand N " \
                "('tensor<NxNxfN>') doesn't match"
    assert numbers_dropped("at 0x7f3a: 12 and 3") == "at ADDR: N and N"


def test_groups_join_by_cause_by_program_and_by_known_bug():
    rows = [dict(number=1, cause="abort A", digest="d1", known=None),
            dict(number=2, cause="abort A", digest="d2", known=None),
            dict(number=3, cause="wrong B", digest="d3", known=1, known_why="same op"),
            dict(number=4, cause="raise C", digest="d3", known=None),        # the same minimal program as 3
            dict(number=5, cause="raise D", digest="d5", known=1),           # the same known bug as 3
            dict(number=6, cause="raise E", digest="d6", known=None)]
    groups = group(rows)
    assert [g.findings for g in groups] == [[1, 2], [3, 4, 5], [6]]
    assert groups[0].why == ["the same cause: abort A"] and groups[2].why == ["one finding"]
    assert groups[1].known == 1 and set(groups[1].why) == {"the same minimal reproducer",
                                                           "the same known bug (found-bugs 1)"}
