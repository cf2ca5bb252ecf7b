"""Reporters of a conformance run: JSON lines, JUnit XML, an HTML page, and the console.

Each implements `conformance.report.results.Reporter` (start / case_finished / finish).
`open_report_dir(path)` gives the three file reporters of a ``--report DIR`` folder.
"""
from __future__ import annotations

import os
import tempfile

from conformance.report import files
from conformance.report.console import ProgressReporter, print_table, summary_line
from conformance.report.failure import Failure, case_failure
from conformance.report.html import HtmlReporter, case_details, device_errors, layout_entry, mesh_entry
from conformance.report.jsonl import JsonlReporter, load_finished, read_records
from conformance.report.junit import JUnitReporter
from conformance.report.lock import LOCK_NAME

__all__ = ["HTML_NAME", "JSONL_NAME", "JUNIT_NAME", "Failure", "HtmlReporter", "JUnitReporter", "JsonlReporter",
           "ProgressReporter", "case_details", "case_failure", "device_errors", "layout_entry", "load_finished", "mesh_entry",
           "open_report_dir", "prepare_report_dir", "print_table", "read_records", "summary_line"]

JSONL_NAME = "results.jsonl"
JUNIT_NAME = "junit.xml"
HTML_NAME = "report.html"


def prepare_report_dir(path) -> str:
    """Create the report folder `path` if needed and check that a run can write its reports there.

    ValueError (one line at the CLI, exit 2) naming the folder when it is a file, cannot be
    created or written, or when results.jsonl / junit.xml / report.html / conformance.lock /
    repros there are of the wrong kind (a folder, FIFO, device or socket where a regular file
    goes; a file where the repros folder goes): found before anything is run or written.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"report folder {path!r} is a file; pass a folder for --report (it is created if missing).")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # the one reliable writability test (root, read-only mounts)
            pass
    except OSError as e:
        raise ValueError(f"report folder --report {path!r} cannot be created or written ({e.strerror or e}); "
                         "pass a writable folder.") from None
    for name in (JSONL_NAME, JUNIT_NAME, HTML_NAME, LOCK_NAME, "repros"):
        p = os.path.join(path, name)
        if name == "repros":
            found = "not a folder" if os.path.exists(p) and not os.path.isdir(p) else None
        else:  # a FIFO or a device would block a read or swallow the writes: refused before anything runs
            found = files.kind(p)
        if found is not None:
            raise ValueError(f"report folder --report {path!r}: {name} there is {found}; remove it or pass "
                             "another folder.")
    return path


def open_report_dir(path, *, resume: bool = False) -> list:
    """[JsonlReporter, JUnitReporter, HtmlReporter] writing results.jsonl, junit.xml and report.html in `path`
    (checked and created by `prepare_report_dir`)."""
    path = prepare_report_dir(path)
    return [JsonlReporter(os.path.join(path, JSONL_NAME), resume=resume),
            JUnitReporter(os.path.join(path, JUNIT_NAME)),
            HtmlReporter(os.path.join(path, HTML_NAME))]
