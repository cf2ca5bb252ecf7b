"""Reporters of a conformance run: JSON lines, JUnit XML, an HTML page, and the console.

Each implements `conformance.results.Reporter` (start / case_finished / finish).
`open_report_dir(path)` gives the three file reporters of a ``--report DIR`` folder.
"""
from __future__ import annotations

import os

from conformance.report.console import ProgressReporter, print_table, summary_line
from conformance.report.html import HtmlReporter, case_details, device_errors, layout_entry, mesh_entry
from conformance.report.jsonl import JsonlReporter, load_finished, read_records
from conformance.report.junit import JUnitReporter

__all__ = ["HTML_NAME", "JSONL_NAME", "JUNIT_NAME", "HtmlReporter", "JUnitReporter", "JsonlReporter",
           "ProgressReporter", "case_details", "device_errors", "layout_entry", "load_finished", "mesh_entry",
           "open_report_dir", "print_table", "read_records", "summary_line"]

JSONL_NAME = "results.jsonl"
JUNIT_NAME = "junit.xml"
HTML_NAME = "report.html"


def open_report_dir(path, *, resume: bool = False) -> list:
    """[JsonlReporter, JUnitReporter, HtmlReporter] writing results.jsonl, junit.xml and report.html in `path`."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"report directory {path!r} is a file; pass a folder for --report.")
    return [JsonlReporter(os.path.join(path, JSONL_NAME), resume=resume),
            JUnitReporter(os.path.join(path, JUNIT_NAME)),
            HtmlReporter(os.path.join(path, HTML_NAME))]
