"""Start a local multi-process JAX run: N processes on 127.0.0.1, one coordinator port.

For tests and for users without a cluster scheduler; on a real cluster, start one
process per host with the scheduler and call `xla_backend.distributed.initialize()`
with no arguments (JAX's cluster auto-detection). Each child gets
XLA_BACKEND_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID / XLA_BACKEND_DEVICES /
XLA_BACKEND_PLATFORM, JAX_COORDINATOR_ADDRESS, and the platform's device selection
(on CPU ``XLA_FLAGS=--xla_force_host_platform_device_count``, so
``--devices-per-process`` holds for plain JAX scripts too; on GPUs ``JAX_LOCAL_DEVICE_IDS``).

Nothing outlives the launcher: every child runs in its own process group, and the
launcher ends every group (SIGTERM, then SIGKILL after `grace_s`) when a child fails,
when the time limit passes, when one child exited 0 and the others are still running
`exit_grace_s` later, and when the launcher itself gets SIGTERM, SIGINT or SIGHUP. On
Linux each child also gets SIGKILL if the launcher dies without cleaning up.

Handshake: the launcher names a folder in XLA_BACKEND_HANDSHAKE; a child that joined the
distributed runtime leaves a note there (`xla_backend.distributed.initialize` writes it on
joining; for plain JAX scripts a `sitecustomize` the launcher puts first on PYTHONPATH writes
it at exit). A child that exits 0 without a note is reported as never having joined.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from xla_backend import limits
from xla_backend.distributed import ENV_COORDINATOR, ENV_HANDSHAKE, ENV_NUM_PROCESSES, ENV_PROCESS_ID

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_EXIT_GRACE_S = 60.0
_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launch_boot")


class LaunchError(RuntimeError):
    """A launched process failed, crashed or timed out; the message has each one's reason."""

    def __init__(self, message, result):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class ProcessResult:
    process_id: int
    pid: int
    returncode: int | None  # None: ended by the launcher (`ended_because` says why)
    output: str             # the process's stdout+stderr
    joined: dict | None = None   # the handshake note, None if the child never joined
    ended_because: str = ""      # why the launcher ended it (returncode None)
    require_join: bool = True

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and (self.joined is not None or not self.require_join)

    @property
    def reason(self) -> str:
        if self.returncode == 0:
            if self.ok:
                return "ok"
            return ("exited 0 but never joined the distributed runtime: call xla_backend.distributed.initialize() "
                    "(or jax.distributed.initialize with the XLA_BACKEND_* variables) before using JAX")
        if self.returncode is None:
            return f"terminated by the launcher ({self.ended_because or 'another process failed'})"
        if self.returncode < 0:
            try:
                return f"killed by signal {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"


@dataclasses.dataclass
class LaunchResult:
    processes: list
    port: int
    seconds: float
    timed_out: bool
    interrupted: str | None = None  # the signal name that stopped the launcher
    hung: list = dataclasses.field(default_factory=list)  # process ids still running after others exited 0

    @property
    def ok(self) -> bool:
        return (not self.timed_out and self.interrupted is None and not self.hung
                and all(p.ok for p in self.processes))

    def exit_status(self) -> int:
        """The launcher's exit status for this result: 0 when ok; the status of the lowest-numbered
        process that failed on its own (a positive exit status as itself, a signal as 128 + signal,
        like a shell), so that a child's meaningful status (e.g. 3, a conformance run that did not
        finish) reaches the caller; 1 for a time limit, a hang or a process that never joined."""
        if self.ok:
            return 0
        if not self.timed_out and self.interrupted is None:
            for p in self.processes:
                if p.returncode is not None and p.returncode > 0:
                    return p.returncode
                if p.returncode is not None and p.returncode < 0:
                    return 128 - p.returncode
        return 1

    def summary(self) -> str:
        lines = [f"process {p.process_id} (pid {p.pid}): {p.reason}" for p in self.processes]
        if self.timed_out:
            lines.append("the run exceeded its time limit")
        if self.interrupted:
            lines.append(f"the launcher got {self.interrupted} and ended every process")
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


def check_seconds(name: str, value) -> float:
    """`value` as a finite number of seconds > 0, else ValueError naming `name` (nan, inf, 0, -1 are refused)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a number of seconds; pass a finite number > 0, e.g. 600.") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}={value!r}: the time limit must be a finite number of seconds > 0, e.g. 600.")
    return v


def child_env(base: dict, process_id: int, *, processes: int, devices_per_process: int, platform: str,
              port: int, handshake: str) -> dict:
    """The environment of child `process_id`: the launcher's variables and the platform's device selection."""
    env = dict(base)
    env.update({
        ENV_COORDINATOR: f"127.0.0.1:{port}",
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        ENV_NUM_PROCESSES: str(processes),
        ENV_PROCESS_ID: str(process_id),
        "XLA_BACKEND_DEVICES": str(devices_per_process),
        "XLA_BACKEND_PLATFORM": platform,
        "JAX_PLATFORMS": platform,
        ENV_HANDSHAKE: handshake,
        # first on the path: the sitecustomize that writes the handshake of plain JAX scripts
        "PYTHONPATH": os.pathsep.join([_BOOT] + [p for p in [base.get("PYTHONPATH", "")] if p]),
    })
    if platform == "cpu":
        # What xla_backend.platform.configure sets; here for scripts that never import xla_backend.
        flag = "--xla_force_host_platform_device_count"
        kept = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(flag + "="))
        env["XLA_FLAGS"] = f"{kept} {flag}={devices_per_process}".strip()
    elif platform in ("cuda", "rocm", "gpu"):
        # JAX's own per-process device selection (read by jax.distributed.initialize).
        first = process_id * devices_per_process
        env.setdefault("JAX_LOCAL_DEVICE_IDS", ",".join(str(first + k) for k in range(devices_per_process)))
    return env


def read_handshakes(folder: str, processes: int) -> dict:
    """{process id: note} for the children that left a note saying they joined."""
    out: dict = {}
    for path in glob.glob(os.path.join(folder, "joined-*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                note = json.load(fh)
        except (OSError, ValueError):
            continue  # written while we read it: the child's later note (or none) decides
        pid = note.get("process_id")
        if note.get("joined") and isinstance(pid, int) and 0 <= pid < processes:
            out.setdefault(pid, note)
    return out


class _SignalTrap:
    """While active (main thread only), SIGTERM / SIGINT / SIGHUP are recorded instead of killing
    the launcher, so it can end its children and report; the old handlers come back afterwards."""

    def __init__(self):
        self.caught: int | None = None
        self._old: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.caught is None:
            self.caught = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# Run before the command on Linux: ask the kernel to SIGKILL this process when the launcher dies
# (the setting survives exec), then become the command. A separate interpreter rather than a
# preexec_fn: running Python between fork and exec in a multithreaded (JAX) launcher can deadlock.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"  # the launcher died before prctl
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def _wrapped(command: list) -> list:
    if not sys.platform.startswith("linux"):
        return list(command)  # process groups still end every child
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid())] + list(command)


def _pump(stream, sink: list, echo, process_id: int) -> None:
    for raw in iter(stream.readline, b""):
        sink.append(raw)
        if echo is not None:
            echo(process_id, raw.decode(errors="replace"))
    stream.close()


def run_local(command, *, processes=2, devices_per_process=4, platform="cpu", timeout_s=120.0,
              env=None, check=True, grace_s=3.0, exit_grace_s=DEFAULT_EXIT_GRACE_S, require_join=True,
              echo=None) -> LaunchResult:
    """Run `command` (argv list) as `processes` JAX processes on this machine.

    Returns when all exit. The first failure terminates the others (SIGTERM to each
    child's process group, SIGKILL after `grace_s`); so do the time limit `timeout_s`, a
    child still running `exit_grace_s` after another exited 0, and SIGTERM / SIGINT /
    SIGHUP to the launcher. With `require_join`, a child that exits 0 without joining the
    distributed runtime is a failure. `echo(process_id, line)` sees output lines as they
    come. With `check`, any failure raises LaunchError naming each process's exit reason
    and output tail.
    """
    if not command:
        raise ValueError("command is empty: give the program to run, e.g. ['python', 'script.py'].")
    for name, value in (("processes", processes), ("devices_per_process", devices_per_process)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r}: pass an int >= 1.")
    if devices_per_process > limits.MAX_DEVICE_COUNT:
        raise ValueError(f"devices_per_process={devices_per_process}: pass an int <= {limits.MAX_DEVICE_COUNT} (XLA "
                         "reads the device count as a 32-bit int).")
    if shutil.which(command[0]) is None:
        raise ValueError(f"command {command[0]!r} is not an executable file or a program on PATH; "
                         "write the program after `--`, e.g. -- python my_script.py")
    timeout_s = check_seconds("timeout_s", timeout_s)
    grace_s = check_seconds("grace_s", grace_s)
    exit_grace_s = check_seconds("exit_grace_s", exit_grace_s)
    port = free_port()
    handshake = tempfile.mkdtemp(prefix="xla-backend-launch-")
    base = dict(os.environ if env is None else env)
    outputs: list = [[] for _ in range(processes)]
    procs, pumps, ended = [], [], {}
    t0 = time.monotonic()
    timed_out, hung, interrupted = False, [], None
    with _SignalTrap() as trap:
        try:
            for i in range(processes):
                if trap.caught is not None:
                    break
                p = subprocess.Popen(
                    _wrapped(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=child_env(base, i, processes=processes, devices_per_process=devices_per_process,
                                  platform=platform, port=port, handshake=handshake),
                    start_new_session=True)
                procs.append(p)
                t = threading.Thread(target=_pump, args=(p.stdout, outputs[i], echo, i), daemon=True)
                t.start()
                pumps.append(t)
            first_ok_exit = None
            while True:
                codes = [p.poll() for p in procs]  # poll every child: any() would stop early
                if trap.caught is not None:
                    interrupted = signal.Signals(trap.caught).name
                    why = f"the launcher got {interrupted}"
                    break
                if len(procs) == processes and all(c is not None for c in codes):
                    why = ""
                    break
                if any(c not in (None, 0) for c in codes):
                    bad = next(i for i, c in enumerate(codes) if c not in (None, 0))
                    why = f"process {bad} failed"
                    break
                now = time.monotonic()
                if first_ok_exit is None and any(c == 0 for c in codes):
                    first_ok_exit = (now, codes.index(0))
                if first_ok_exit is not None and now - first_ok_exit[0] > exit_grace_s:
                    hung = [i for i, c in enumerate(codes) if c is None]
                    why = (f"still running {exit_grace_s:g} s after process {first_ok_exit[1]} exited 0; "
                           "hung, or waiting for a peer that is gone")
                    break
                if now - t0 > timeout_s:
                    timed_out = True
                    why = f"the run exceeded its time limit of {timeout_s:g} s"
                    break
                time.sleep(0.05)
            ended = {i: why for i in _terminate(procs, grace_s)}
        except BaseException:
            _terminate(procs, grace_s)
            raise
        finally:
            for t in pumps:
                t.join(timeout=5.0)
    joined = read_handshakes(handshake, processes)
    _remove_folder(handshake)
    result = LaunchResult(
        [ProcessResult(i, p.pid, None if i in ended else p.returncode,
                       b"".join(outputs[i]).decode(errors="replace"), joined.get(i), ended.get(i, ""),
                       require_join)
         for i, p in enumerate(procs)],
        port, time.monotonic() - t0, timed_out, interrupted, hung,
    )
    if check and not result.ok:
        tails = "\n".join(
            f"--- process {p.process_id} ({p.reason}) ---\n{p.output[-2000:]}"
            for p in result.processes if not p.ok
        )
        raise LaunchError(f"multi-process run failed: {result.summary()}\n{tails}", result)
    return result


def _remove_folder(folder: str) -> None:
    for path in glob.glob(os.path.join(folder, "*")):
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass


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


class _OneLineParser:
    """argparse with bad arguments reported as one line and exit status 2."""

    @staticmethod
    def make(**kw):
        import argparse

        class P(argparse.ArgumentParser):
            def error(self, message):
                self.exit(2, f"launch: error: {message}\n")

        return P(**kw)


def _seconds_arg(name):
    import argparse

    def parse(text):
        try:
            return check_seconds(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _count_arg(text, high=None, why=""):
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    if high is not None and v > high:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1 and <= {high}{f' ({why})' if why else ''}")
    return v


def device_count_arg(text):
    """An argparse ``type=`` for a device count: an int in [1, `limits.MAX_DEVICE_COUNT`]."""
    return _count_arg(text, limits.MAX_DEVICE_COUNT, "XLA reads the device count as a 32-bit int")


def main_launch(argv) -> int:
    """`python -m xla_backend launch [options] -- command ...`; returns the exit status.

    Children's output is shown live, each line prefixed ``[process K]``; then one summary
    line per process. Exit status: 0 all ok, 1 any failure, 2 bad arguments, 128+N when
    the launcher was stopped by signal N (after ending every child).
    """
    if "--" in argv:
        split = argv.index("--")
        opts, command = argv[:split], argv[split + 1:]
    else:
        opts, command = argv, []
    ap = _OneLineParser.make(prog="python -m xla_backend launch",
                             description="Run a command as N local JAX processes.")
    ap.add_argument("--processes", type=_count_arg, default=2,
                    help="processes to start (default 2; at most 2 per CPU core and what memory holds without --force)")
    ap.add_argument("--devices-per-process", type=device_count_arg, default=4,
                    help="CPU: virtual devices per process (at most what memory holds in every process without "
                         "--force); GPU: devices per process (JAX_LOCAL_DEVICE_IDS)")
    ap.add_argument("--platform", default=os.environ.get("XLA_BACKEND_PLATFORM", "cpu"))
    ap.add_argument("--timeout", type=_seconds_arg("--timeout"), default=600.0,
                    help="seconds before all are ended (default 600)")
    ap.add_argument("--exit-grace", type=_seconds_arg("--exit-grace"), default=DEFAULT_EXIT_GRACE_S,
                    help="seconds the others may run on after one process exited 0 (default "
                         f"{DEFAULT_EXIT_GRACE_S:g})")
    ap.add_argument("--no-join-check", action="store_true",
                    help="do not require the processes to join the distributed runtime")
    ap.add_argument("--quiet", action="store_true", help="print only the summary, not the processes' output")
    ap.add_argument("--force", action="store_true",
                    help="start the processes even above this machine's ceilings (xla_backend.limits)")
    args = ap.parse_args(opts)
    if not command:
        ap.error("no command given: write it after `--`, e.g. -- python my_script.py")
    try:  # before any process starts: the value, the ceiling, why, and --force
        limits.check_run(processes=args.processes, devices=args.devices_per_process, platform=args.platform,
                         force=args.force, devices_flag="--devices-per-process")
    except limits.AboveCeiling as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    lock = threading.Lock()

    def echo(process_id, line):
        with lock:
            sys.stdout.write(f"[process {process_id}] {line}")
            sys.stdout.flush()

    try:
        result = run_local(command, processes=args.processes, devices_per_process=args.devices_per_process,
                           platform=args.platform, timeout_s=args.timeout, exit_grace_s=args.exit_grace,
                           require_join=not args.no_join_check, check=False,
                           echo=None if args.quiet else echo)
    except (ValueError, OSError) as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    for p in result.processes:
        print(f"launch: process {p.process_id} (pid {p.pid}): {p.reason}", file=sys.stderr)
    if result.interrupted:
        print(f"launch: INTERRUPTED by {result.interrupted}: every process was ended", file=sys.stderr)
        return 128 + int(signal.Signals[result.interrupted])
    if not result.ok:
        bad = [str(p.process_id) for p in result.processes if not p.ok]
        what = "the run exceeded its time limit" if result.timed_out else f"process(es) {', '.join(bad)} did not succeed"
        print(f"launch: FAILED: {what}", file=sys.stderr)
        return result.exit_status()
    print(f"launch: ok: {len(result.processes)} processes joined and exited 0 in {result.seconds:.1f} s",
          file=sys.stderr)
    return 0
