"""pytest plugin: the conformance suites as pytest items.

    pytest --conformance-platform cpu --conformance-devices 8 --conformance-examples 5 -m conformance

Registered as a ``pytest11`` entry point, so it is loaded by every pytest run in an
environment where the project is installed; without ``--conformance-platform`` it only
adds its options and the ``conformance`` marker, and collects nothing. With it, each
conformance case (the same case ids as ``python -m conformance run``) is one test item,
named ``conformance/<suite>::<case id>``: a disagreement fails it (with the comparator's
report and the reproducer's path), an expected failure of the platform's xfails file is
an xfail, a case the platform cannot run is skipped as unsupported, and a stale xfail
entry passes with a warning.
"""
from __future__ import annotations

import warnings

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "refsim-vs-XLA conformance suites")
    group.addoption("--conformance-platform", default=None, metavar="P",
                    help="run the conformance suites on JAX platform P (cpu, cuda, rocm, tpu, a PJRT plugin)")
    group.addoption("--conformance-devices", type=int, default=8, metavar="N",
                    help="devices to use (virtual devices on CPU; default 8)")
    group.addoption("--conformance-examples", type=int, default=3, metavar="N",
                    help="hypothesis draws per family (default 3)")
    group.addoption("--conformance-suite", default="all", metavar="S",
                    help="collectives, layouts, programs, errors, mpmd, all (default) or a comma list")
    group.addoption("--conformance-seed", type=int, default=0, metavar="S", help="seed of every draw (default 0)")
    group.addoption("--conformance-xfails", default=None, metavar="FILE",
                    help="expected failures (default xfails/<platform>.txt)")


def _enabled(config) -> bool:
    return config.getoption("conformance_platform", None) is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: a refsim-vs-XLA conformance case (--conformance-platform)")
    if not _enabled(config):
        return
    from xla_backend import platform

    examples = config.getoption("conformance_examples")
    if examples < 1:
        raise pytest.UsageError(f"--conformance-examples={examples}; pass a positive number of draws per family.")
    platform.configure(config.getoption("conformance_platform"), config.getoption("conformance_devices"))


def pytest_collection_modifyitems(session, config, items):
    if not _enabled(config):
        return
    from conformance import runner, xfails

    plat = config.getoption("conformance_platform")
    devices = config.getoption("conformance_devices")
    xf = xfails.load(config.getoption("conformance_xfails"), platform=plat)
    tasks = runner.plan_tasks(config.getoption("conformance_suite"), examples=config.getoption("conformance_examples"),
                              seed=config.getoption("conformance_seed"), devices=devices)
    suites: dict = {}
    for task in tasks:
        if task.suite not in suites:
            suites[task.suite] = ConformanceSuite.from_parent(session, name=f"conformance/{task.suite}",
                                                              nodeid=f"conformance/{task.suite}")
        items.append(ConformanceItem.from_parent(suites[task.suite], name=task.case_id, task=task,
                                                 entry=xf.lookup(task.case_id), devices=devices))


class ConformanceSuite(pytest.Collector):
    """The items of one suite (built in `pytest_collection_modifyitems`, so it collects nothing itself)."""

    def collect(self):
        return []


class ConformanceFailure(Exception):
    """A case disagreed or errored; carries its CaseResult."""


class ConformanceItem(pytest.Item):
    """One conformance case, run with `conformance.runner.run_task`."""

    def __init__(self, *, task, entry, devices, **kw):
        super().__init__(**kw)
        self.task, self.entry, self.devices = task, entry, devices
        self.add_marker("conformance")

    def runtest(self):
        from conformance import runner

        factory = getattr(self.config, "_tmp_path_factory", None)  # pytest's basetemp (tmp_path's root)
        repro_dir = str(factory.getbasetemp() / "conformance-repros") if factory else None
        res = runner.run_task(self.task, None, self.entry, repro_dir=repro_dir, devices=self.devices,
                              seed=self.config.getoption("conformance_seed"))
        self.user_properties += [("status", res.status), ("examples", res.examples)]
        if res.status in ("fail", "error"):
            raise ConformanceFailure(res)
        if res.status == "xfail":
            pytest.xfail(res.message.splitlines()[0])
        if res.status == "unsupported":
            pytest.skip(f"unsupported on this platform: {res.message.splitlines()[0]}")
        if res.status == "xpass":
            warnings.warn(f"stale xfail entry: {res.message}", stacklevel=1)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            res = excinfo.value.args[0]
            text = f"{res.status.upper()}: {res.case_id}\n{res.message}"
            if res.repro_path:
                text += f"\nreproducer: python {res.repro_path}"
            return text
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"conformance {self.task.suite}: {self.task.case_id}"
