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

Oracle mode (docs/oracle.md): ``pytest --conformance-oracle [--conformance-oracle-report FILE]``
checks every distributed program a test suite executes (jit, pjit, pmap, eager shard_map,
transformations applied outside jit, eager operations on sharded arrays; seen where JAX
executes them, `conformance.oracle.intercept`) against refsim (a disagreement fails the test
that made the call) and prints ``conformance oracle: N calls checked, D disagreed, S not
checkable; E distributed executions seen, M not intercepted`` and the census. The fixture
`conformance_check` is `conformance.check` with reproducers under the test's tmp_path.
"""
from __future__ import annotations

import functools
import json
import warnings

import pytest

# The suite (hypothesis, the [test] extra) and the oracle are imported inside the hooks that use
# them: this module loads in every pytest run of an environment that has the project installed.


def pytest_addoption(parser):
    group = parser.getgroup("conformance", "refsim-vs-XLA conformance suites")
    group.addoption("--conformance-platform", default=None, metavar="P",
                    help="run the conformance suites on JAX platform P (cpu, cuda, rocm, tpu, a PJRT plugin)")
    group.addoption("--conformance-devices", type=int, default=None, metavar="N",
                    help="devices to use (virtual devices on CPU; default 8); with --conformance-oracle it sets "
                         "the virtual CPU device count before conftests run (default: left to the suite)")
    group.addoption("--conformance-examples", type=int, default=3, metavar="N",
                    help="hypothesis draws per family (default 3)")
    group.addoption("--conformance-suite", default="all", metavar="S",
                    help="collectives, layouts, programs, errors, mpmd, all (default) or a comma list")
    group.addoption("--conformance-seed", type=int, default=0, metavar="S", help="seed of every draw (default 0)")
    group.addoption("--conformance-xfails", default=None, metavar="FILE",
                    help="expected failures (default xfails/<platform>.txt)")
    group.addoption("--conformance-oracle", action="store_true", default=False,
                    help="oracle mode: also run every distributed program the tests execute (jit, pjit, pmap, "
                         "shard_map, eager ops on sharded arrays) on refsim and fail the test on a disagreement")
    group.addoption("--conformance-oracle-report", default=None, metavar="FILE",
                    help="oracle mode: write the JSON report (counts, reasons, one record per call) to FILE")


# -- oracle mode ------------------------------------------------------------------------------------
_ORACLE: dict = {"session": None, "workers": []}


def _start_oracle(config) -> None:
    if _ORACLE["session"] is not None:
        return
    from conformance.oracle import intercept
    from conformance.oracle.session import Session

    factory = getattr(config, "_tmp_path_factory", None)
    repro = str(factory.getbasetemp() / "conformance-oracle-repros") if factory else None
    _ORACLE["session"] = Session(repro_dir=repro)
    intercept.install(_ORACLE["session"])


def _oracle_devices(devices) -> None:
    """`--conformance-devices N` in oracle mode: N virtual CPU devices, set before conftests
    import JAX (only when given: a suite's own device setup is otherwise left alone)."""
    if devices is None:
        return
    from xla_backend import platform

    try:
        platform.configure_cpu_devices(devices)
    except (ValueError, RuntimeError) as e:
        raise pytest.UsageError(f"--conformance-devices={devices}: {e}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Before conftests and test modules are imported, so programs they run at import time are seen.
    ns = early_config.known_args_namespace
    if getattr(ns, "conformance_oracle", False):
        _oracle_devices(getattr(ns, "conformance_devices", None))
        _start_oracle(early_config)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    s = _ORACLE["session"]
    if s is None:
        return (yield)
    s.context = item.nodeid
    try:
        return (yield)
    finally:
        s.context = ""
        s.pop_failures(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    s = _ORACLE["session"]
    try:
        result = yield
    except BaseException:
        # the test failed on its own; the oracle's disagreements are shown next to its error
        for err in (s.pop_failures(item.nodeid) if s is not None else ()):
            item.add_report_section("call", "conformance oracle", str(err))
        raise
    if s is not None:
        failures = s.pop_failures(item.nodeid)
        if failures:
            if len(failures) > 1:
                failures[0].args = (failures[0].args[0] + f"\n({len(failures) - 1} more disagreeing calls "
                                    "in this test; see the oracle report)",)
            raise failures[0]
    return result


def pytest_sessionfinish(session, exitstatus):
    s = _ORACLE["session"]
    if s is None:
        return
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:                        # a pytest-xdist worker: hand the report over
        workeroutput["conformance_oracle"] = json.dumps(s.report())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", {}).get("conformance_oracle")
    if out:
        _ORACLE["workers"].append(json.loads(out))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    s = _ORACLE["session"]
    if s is None or hasattr(config, "workeroutput"):
        return
    from conformance.oracle import session as sess

    report = sess.merge([s.report()] + _ORACLE["workers"])
    for line in sess.summary_lines(report):
        terminalreporter.write_line(line)
    path = config.getoption("conformance_oracle_report")
    if path:
        sess.write_json(path, report)
        terminalreporter.write_line(f"conformance oracle report: {path}")


def pytest_unconfigure(config):
    if _ORACLE["session"] is not None:
        from conformance.oracle import intercept

        intercept.uninstall()
        _ORACLE["session"] = None
        _ORACLE["workers"] = []


@pytest.fixture
def conformance_check(tmp_path):
    """`conformance.check` with reproducers written under this test's tmp_path."""
    from conformance.debug.explain.on_check import check

    return functools.partial(check, repro_dir=str(tmp_path / "conformance-repros"))


def _devices(config) -> int:
    n = config.getoption("conformance_devices")
    return 8 if n is None else n


def _enabled(config) -> bool:
    return config.getoption("conformance_platform", None) is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "conformance: a refsim-vs-XLA conformance case (--conformance-platform)")
    if config.getoption("conformance_oracle", False) and _ORACLE["session"] is None:
        # the plugin was loaded after the initial conftests
        _oracle_devices(config.getoption("conformance_devices"))
        _start_oracle(config)
    if not _enabled(config):
        return
    from xla_backend import platform

    examples = config.getoption("conformance_examples")
    if examples < 1:
        raise pytest.UsageError(f"--conformance-examples={examples}; pass a positive number of draws per family.")
    platform.configure(config.getoption("conformance_platform"), _devices(config))


def pytest_collection_modifyitems(session, config, items):
    if not _enabled(config):
        return
    from conformance.engine import runner
    from conformance.verdict import xfails

    plat = config.getoption("conformance_platform")
    devices = _devices(config)
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
    """One conformance case, run with `conformance.engine.runner.run_task`."""

    def __init__(self, *, task, entry, devices, **kw):
        super().__init__(**kw)
        self.task, self.entry, self.devices = task, entry, devices
        self.add_marker("conformance")

    def runtest(self):
        from conformance.engine import runner

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
