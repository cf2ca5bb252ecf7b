"""Oracle tests: a disagreement's reproducer folder defaults to a fresh temporary folder
(`conformance.check` / `Session` without repro_dir); here it lands under the test's tmp_path, so
the tests leave nothing in the system's temporary directory."""
import tempfile

import pytest


@pytest.fixture(autouse=True)
def _reproducers_under_tmp_path(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
