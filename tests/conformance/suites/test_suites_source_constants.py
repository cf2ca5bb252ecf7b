"""A seeded plan does not depend on number literals in the project's source (hypothesis's
local constants): `conformance.suites.base.draw` draws with them switched off."""
import contextlib
import importlib.util
import sys

import pytest
from hypothesis import strategies as st

from conformance.suites import base

# Literals no strategy could draw by chance in 300 draws from [0, 2**32).
LITERALS = (3141592653, 2718281828, 1414213562, 1732050807, 2236067977)


def _import_local_module(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text("VALUES = (" + ", ".join(str(v) for v in LITERALS) + ")\n")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def literal_module(tmp_path):
    name = "conformance_literal_probe"
    yield _import_local_module(tmp_path, name)
    sys.modules.pop(name, None)


def _draws():
    return base.draw(st.lists(st.integers(0, 2**32 - 1), min_size=30, max_size=30), 10, seed=7)


def test_a_literal_in_a_loaded_module_does_not_change_the_plan(tmp_path):
    before = _draws()
    name = "conformance_literal_probe_2"
    try:
        _import_local_module(tmp_path, name)
        after = _draws()
    finally:
        sys.modules.pop(name, None)
    assert after == before
    assert not set(LITERALS) & {v for xs in after for v in xs}


def test_without_the_switch_hypothesis_draws_the_literals(literal_module, monkeypatch):
    """The test above can fail: hypothesis itself does draw a loaded module's literals."""
    providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
    if not hasattr(providers, "_get_local_constants"):
        pytest.skip("this hypothesis version collects no source constants")
    switched_off = _draws()
    monkeypatch.setattr(base, "source_constants_off", contextlib.nullcontext)
    drawn = _draws()
    # Which literals come up depends on every local module loaded (in a long test process, thousands
    # of them besides the probe's), but some do: the draws are not the ones made without them.
    assert drawn != switched_off
    assert {v for xs in drawn for v in xs} - {v for xs in switched_off for v in xs}
