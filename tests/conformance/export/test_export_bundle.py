"""The export bundle format (conformance.export.bundle): write/read round trip, sha256 checks, no pickle."""
import json
import os

import ml_dtypes
import numpy as np
import pytest

from conformance.export.bundle import (MANIFEST, BundleWriter, IntegrityError, load_program, read_bundle,
                                       spec_from_data, spec_to_data)
from refsim import PartitionSpec as P


def _meta(n_in=1, n_out=1):
    return {"case_id": "hand[test]", "mesh": {"shape": [2, 4], "names": ["x", "y"],
                                              "device_ids": [[0, 1, 2, 3], [4, 5, 6, 7]],
                                              "axis_types": ["Auto", "Auto"]},
            "in_specs": [["x", None]] * n_in, "out_specs": [[["x", "y"]]] * n_out,
            "policies": [["exact", 0.0]] * n_out, "calling_convention_version": 10, "stablehlo_version": "1.15.0"}


def _write(path, inputs, expected, exported=b"\x00serialized\xff"):
    w = BundleWriter(path)
    w.add(_meta(len(inputs), len(expected)), exported=exported, module_text="module @m {}", inputs=inputs,
          expected=expected)
    w.finish(exporter={"jax": "test"}, seed=7, skipped=[{"case_id": "c", "stage": "export", "error": "E: x"}])
    return read_bundle(path)


def test_a_bundle_reads_back_what_was_written(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(4, 3) - 5.5
    b = np.array([True, False, True])
    c = (np.arange(6).reshape(2, 3) / 4).astype(ml_dtypes.bfloat16)   # stored as raw 2-byte records
    want = np.array([[-0.0, np.nan], [np.inf, 3.0]], dtype=np.float32)
    bundle = _write(tmp_path / "b", [a, b, c], [want, np.int32([1, -2])])
    assert bundle.exporter == {"jax": "test"} and bundle.seed == 7 and bundle.skipped[0]["stage"] == "export"
    (entry,) = bundle.programs
    assert entry["id"] == "p000" and sorted(entry["files"]) == ["expected", "exported", "inputs", "module"]
    loaded = load_program(bundle, entry)
    assert loaded.exported == b"\x00serialized\xff"
    for got, ref in zip(loaded.inputs + loaded.expected, [a, b, c, want, np.int32([1, -2])]):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert got.tobytes() == ref.tobytes()   # bits: -0.0 and NaN included
    assert (tmp_path / "b" / "p000" / "module.mlir").read_text() == "module @m {}"


@pytest.mark.parametrize("victim", ["exported.bin", "inputs.npz", "expected.npz", "module.mlir"])
def test_a_changed_file_is_refused_by_its_sha256(tmp_path, victim):
    bundle = _write(tmp_path / "b", [np.float32([1, 2])], [np.float32([2, 4])])
    path = tmp_path / "b" / "p000" / victim
    if victim.endswith(".npz"):   # a well-formed file with other values: only the digest tells
        key = "arg0" if victim.startswith("inputs") else "out0"
        np.savez(path, **{key: np.float32([1, 3])})
    else:
        path.write_bytes(path.read_bytes() + b" ")
    with pytest.raises(IntegrityError, match=rf"p000/{victim}: sha256 .* differs from the manifest's"):
        load_program(bundle, bundle.programs[0])


def test_a_missing_file_is_an_integrity_error(tmp_path):
    bundle = _write(tmp_path / "b", [np.float32([1])], [np.float32([1])])
    os.remove(tmp_path / "b" / "p000" / "exported.bin")
    with pytest.raises(IntegrityError, match="exported.bin: cannot be read"):
        load_program(bundle, bundle.programs[0])


def test_object_arrays_are_never_written_nor_unpickled(tmp_path):
    with pytest.raises(ValueError, match="arg0 has dtype object"):
        _write(tmp_path / "a", [np.array([{"x": 1}], dtype=object)], [np.float32([1])])
    # an object array planted with a matching digest still loads without pickle: refused
    bundle = _write(tmp_path / "b", [np.float32([1])], [np.float32([1])])
    path = tmp_path / "b" / "p000" / "inputs.npz"
    np.savez(path, arg0=np.array([object()], dtype=object))
    doc = json.loads((tmp_path / "b" / MANIFEST).read_text())
    from conformance.export.bundle import sha256_file

    doc["programs"][0]["files"]["inputs"]["sha256"] = sha256_file(path)
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_program(read_bundle(tmp_path / "b"), doc["programs"][0])


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format="other"), "its format is not"),
    (lambda d: d["programs"][0]["files"]["inputs"].update(path="../../etc/passwd"), "files.inputs must be"),
    (lambda d: d["programs"][0]["files"]["inputs"].update(sha256="abc"), "files.inputs must be"),
    (lambda d: d["programs"][0].update(policies=[["pickle", 0]]), "'policies' must hold"),
    (lambda d: d["programs"][0].update(in_specs=[[3]]), "a spec is a list"),
])
def test_a_malformed_manifest_is_refused_naming_the_problem(tmp_path, edit, message):
    _write(tmp_path / "b", [np.float32([1])], [np.float32([1])])
    doc = json.loads((tmp_path / "b" / MANIFEST).read_text())
    edit(doc)
    (tmp_path / "b" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=message) as e:
        read_bundle(tmp_path / "b")
    assert "not an export bundle manifest" in str(e.value)


def test_a_folder_without_a_manifest_is_no_bundle_and_a_bundle_is_not_overwritten(tmp_path):
    with pytest.raises(ValueError, match="manifest.json: not an export bundle manifest"):
        read_bundle(tmp_path)
    _write(tmp_path / "b", [np.float32([1])], [np.float32([1])])
    with pytest.raises(ValueError, match="already holds a bundle"):
        BundleWriter(tmp_path / "b")


def test_specs_round_trip_as_json():
    for spec in (P(), P("x", None), P(("x", "y"), None, "z")):
        assert P(*spec_from_data(json.loads(json.dumps(spec_to_data(spec))))) == spec
