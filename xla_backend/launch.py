"""Start a local multi-process JAX run: N processes on 127.0.0.1, one coordinator port.

For tests and for users without a cluster scheduler; on a real cluster, start one
process per host with the scheduler and call `xla_backend.distributed.initialize()`
with no arguments (JAX's cluster auto-detection). Each child gets
XLA_BACKEND_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID / XLA_BACKEND_DEVICES /
XLA_BACKEND_PLATFORM and runs in its own process group. When any child fails or the
time limit passes, all children are terminated, so nothing keeps the port.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from xla_backend.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID


class LaunchError(RuntimeError):
    """A launched process failed, crashed or timed out; the message has each one's reason."""

    def __init__(self, message, result):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class ProcessResult:
    process_id: int
    pid: int
    returncode: int | None  # None: killed by the launcher after another failed / timeout
    output: str             # the process's stdout+stderr

    @property
    def reason(self) -> str:
        if self.returncode == 0:
            return "ok"
        if self.returncode is None:
            return "terminated by the launcher"
        if self.returncode < 0:
            return f"killed by signal {signal.Signals(-self.returncode).name}"
        return f"exit status {self.returncode}"


@dataclasses.dataclass
class LaunchResult:
    processes: list
    port: int
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(p.returncode == 0 for p in self.processes)

    def summary(self) -> str:
        lines = [f"process {p.process_id} (pid {p.pid}): {p.reason}" for p in self.processes]
        if self.timed_out:
            lines.append("the run exceeded its time limit")
        return "; ".join(lines)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """True when no socket listens on 127.0.0.1:`port` (closed connections left in the
    kernel's TIME_WAIT state do not count: SO_REUSEADDR binds over them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def run_local(command, *, processes=2, devices_per_process=4, platform="cpu", timeout_s=120.0,
              env=None, check=True, grace_s=3.0) -> LaunchResult:
    """Run `command` (argv list) as `processes` JAX processes on this machine.

    Returns when all exit. The first failure terminates the others (SIGTERM to each
    child's process group, SIGKILL after `grace_s`); with `check`, any failure or
    timeout raises LaunchError naming each process's exit reason and output tail.
    """
    if not command:
        raise ValueError("command is empty: give the program to run, e.g. ['python', 'script.py'].")
    if processes < 1 or devices_per_process < 1:
        raise ValueError(
            f"processes={processes}, devices_per_process={devices_per_process}: both must be >= 1."
        )
    port = free_port()
    base = dict(os.environ if env is None else env)
    base.update({
        ENV_COORDINATOR: f"127.0.0.1:{port}",
        ENV_NUM_PROCESSES: str(processes),
        "XLA_BACKEND_DEVICES": str(devices_per_process),
        "XLA_BACKEND_PLATFORM": platform,
    })
    logs, procs = [], []
    t0 = time.monotonic()
    timed_out = False
    try:
        for i in range(processes):
            log = tempfile.TemporaryFile()
            logs.append(log)
            procs.append(subprocess.Popen(
                list(command), env={**base, ENV_PROCESS_ID: str(i)}, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            ))
        failed = False
        while True:
            codes = [p.poll() for p in procs]  # poll every child: any() would stop early
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0) for c in codes):
                failed = True
                break
            if time.monotonic() - t0 > timeout_s:
                timed_out = True
                break
            time.sleep(0.05)
        killed = _terminate(procs, grace_s) if (failed or timed_out) else set()
    except BaseException:
        _terminate(procs, grace_s)
        raise
    finally:
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read().decode(errors="replace"))
            log.close()
    result = LaunchResult(
        [ProcessResult(i, p.pid, None if i in killed else p.returncode, outputs[i])
         for i, p in enumerate(procs)],
        port, time.monotonic() - t0, timed_out,
    )
    if check and not result.ok:
        tails = "\n".join(
            f"--- process {p.process_id} ({p.reason}) ---\n{p.output[-2000:]}"
            for p in result.processes if p.returncode != 0
        )
        raise LaunchError(f"multi-process run failed: {result.summary()}\n{tails}", result)
    return result


def _terminate(procs, grace_s) -> set:
    """Stop every still-running child (its whole process group); return their indices."""
    running = {i for i, p in enumerate(procs) if p.poll() is None}
    for i in running:
        _signal_group(procs[i], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for i in running:
        try:
            procs[i].wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(procs[i], signal.SIGKILL)
            procs[i].wait()
    # Children of a finished child may linger in its group; end them too.
    for p in procs:
        _signal_group(p, signal.SIGKILL)
    return running


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session made pid the group id
    except (ProcessLookupError, PermissionError):
        pass


def main_launch(argv) -> int:
    """`python -m xla_backend launch [options] -- command ...`; returns the exit status."""
    import argparse

    if "--" in argv:
        split = argv.index("--")
        opts, command = argv[:split], argv[split + 1:]
    else:
        opts, command = argv, []
    ap = argparse.ArgumentParser(prog="python -m xla_backend launch",
                                 description="Run a command as N local JAX processes.")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--devices-per-process", type=int, default=4)
    ap.add_argument("--platform", default=os.environ.get("XLA_BACKEND_PLATFORM", "cpu"))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before all are killed")
    args = ap.parse_args(opts)
    if not command:
        ap.error("no command given: write it after `--`, e.g. -- python my_script.py")
    try:
        result = run_local(command, processes=args.processes,
                           devices_per_process=args.devices_per_process,
                           platform=args.platform, timeout_s=args.timeout, check=False)
    except (ValueError, OSError) as e:
        print(f"launch: {e}", file=sys.stderr)
        return 2
    for p in result.processes:
        sys.stdout.write(f"===== process {p.process_id} ({p.reason}) =====\n{p.output}")
    if not result.ok:
        print(f"launch: FAILED: {result.summary()}", file=sys.stderr)
        return 1
    return 0
