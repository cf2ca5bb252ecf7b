"""Ceilings on what one command-line argument may ask of this machine: processes and CPU devices.

Without them `python -m conformance run --devices 1000000000` had XLA allocate 6 GiB in 12 s
before it failed, `--processes 64` started 41 JAX processes on 2 cores, and `python -m
xla_backend launch --devices-per-process 1000000000` did the same per process. The ceilings are
derived from this machine (`refsim.resources`: its available memory and usable cores) and the
costs below; a command that exceeds one stops before it starts anything, naming the value, the
ceiling and why; `--force` runs it anyway.

Costs (measured on x86-64 Linux, jax 0.10.2; docs/hardware.md):

* a virtual CPU device: about 125 KiB of resident memory in every process that starts it (RSS of
  `python -m xla_backend info --devices N`: 160 MiB at 8, 275 MiB at 1024, 583 MiB at 4096,
  1.0 GiB at 8192, 2.0 GiB at 16384). `CPU_DEVICE_BYTES` allows twice that, for the buffers and
  programs of a case over every device.
* a JAX process (Python, JAX, refsim, conformance and its compiled programs): 220 MiB for a small
  program, more as programs accumulate; `PROCESS_BYTES` = 512 MiB.
* `PROCESSES_PER_CORE`: more processes than twice the usable cores only queue for them (the
  default of `conformance run` is one per core); `MIN_PROCESSES` (4) are allowed on any machine,
  as a small distributed job needs them whatever the cores.

On an accelerator platform, `launch --devices-per-process` names real devices: each process's
share of the host's devices (counted from /dev/nvidia*, /dev/dri/renderD*, /dev/accel*; at most
`MAX_LOCAL_ACCELERATORS` where none can be counted) is the ceiling.

`MAX_DEVICE_COUNT` is a hard limit, not a ceiling: XLA reads the CPU device count
(``--xla_force_host_platform_device_count``) as a 32-bit int and answers a larger value with the
help text of its flags; `--force` does not lift it.

    from xla_backend import limits
    limits.check_run(processes=2, devices=8)              # None, or raises AboveCeiling
    limits.max_processes().value, limits.max_cpu_devices(processes=2).value
"""
from __future__ import annotations

import dataclasses

from refsim import resources

__all__ = ["AboveCeiling", "CPU_DEVICE_BYTES", "Ceiling", "MAX_DEVICE_COUNT", "MAX_LOCAL_ACCELERATORS",
           "MIN_PROCESSES", "PROCESSES_PER_CORE", "PROCESS_BYTES", "check", "check_run", "local_accelerators",
           "max_accelerators", "max_cpu_devices", "max_processes"]

CPU_DEVICE_BYTES = 256 * 1024
PROCESS_BYTES = 512 * 1024 * 1024
PROCESSES_PER_CORE = 2
MIN_PROCESSES = 4
MAX_DEVICE_COUNT = 2**31 - 1
MAX_LOCAL_ACCELERATORS = 64


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """The most this machine allows for one argument, and why (a sentence naming the figures)."""

    value: int
    why: str


class AboveCeiling(ValueError):
    """An argument above this machine's ceiling; the message names the value, the ceiling, why,
    and `--force`. `.flag`, `.value`, `.ceiling` (a `Ceiling`)."""

    def __init__(self, flag: str, value: int, ceiling: Ceiling):
        self.flag, self.value, self.ceiling = flag, value, ceiling
        super().__init__(f"{flag} {value} is above the ceiling of {ceiling.value} ({ceiling.why}); "
                         f"pass {flag} {ceiling.value} or less, or add --force to run with {value} anyway.")


def _memory(memory):
    return resources.available_memory() if memory is None else memory


def _cores_why(cores: int) -> str:
    return (f"{PROCESSES_PER_CORE} per usable CPU core, and this machine has {cores}"
            + (f"; {MIN_PROCESSES} on any machine" if PROCESSES_PER_CORE * cores < MIN_PROCESSES else ""))


def max_processes(devices_per_process: int = 1, *, cpu: bool = True, memory: int | None = None,
                  cores: int | None = None) -> Ceiling:
    """How many JAX processes this machine runs at once: `PROCESSES_PER_CORE` per usable core (at
    least `MIN_PROCESSES`), and no more than its available memory holds (`PROCESS_BYTES` each, plus
    `devices_per_process` virtual devices each on CPU). memory / cores: the machine's figures
    (default: measured now)."""
    cores = resources.usable_cores() if cores is None else cores
    by_cores = max(MIN_PROCESSES, PROCESSES_PER_CORE * cores)
    memory = _memory(memory)
    if memory is None:
        return Ceiling(by_cores, _cores_why(cores))
    each = PROCESS_BYTES + (devices_per_process * CPU_DEVICE_BYTES if cpu else 0)
    by_memory = max(1, memory // each)
    if by_memory < by_cores:
        per = (f"{resources.format_bytes(each)} each with {devices_per_process} virtual CPU device"
               f"{'s' if devices_per_process != 1 else ''}" if cpu else f"{resources.format_bytes(each)} each")
        return Ceiling(by_memory, f"a JAX process takes about {per}, and {resources.format_bytes(memory)} of "
                                  "memory is available")
    return Ceiling(by_cores, _cores_why(cores))


def max_cpu_devices(processes: int = 1, *, memory: int | None = None) -> Ceiling:
    """How many virtual CPU devices each of `processes` JAX processes may start at once: what the
    available memory holds after `PROCESS_BYTES` per process, at `CPU_DEVICE_BYTES` a device (at
    most `MAX_DEVICE_COUNT`, at least 1)."""
    memory = _memory(memory)
    if memory is None:
        return Ceiling(MAX_DEVICE_COUNT, "XLA's limit; this machine's memory could not be read")
    budget = memory // max(1, processes) - PROCESS_BYTES
    value = int(min(MAX_DEVICE_COUNT, max(1, budget // CPU_DEVICE_BYTES)))
    who = f"each of the {processes} processes" if processes > 1 else "the process"
    return Ceiling(value, f"a virtual CPU device takes about {resources.format_bytes(CPU_DEVICE_BYTES)} in {who} "
                          f"that start{'s' if processes == 1 else ''} it, next to "
                          f"{resources.format_bytes(PROCESS_BYTES)} per process, and "
                          f"{resources.format_bytes(memory)} of memory is available")


# The device files of each accelerator platform, counted to bound devices per process.
_DEVICE_FILES = {"cuda": "/dev/nvidia[0-9]*", "gpu": "/dev/nvidia[0-9]*", "rocm": "/dev/dri/renderD*",
                 "tpu": "/dev/accel[0-9]*"}


def local_accelerators(platform: str) -> int | None:
    """How many `platform` devices this host has, counted from their device files (/dev/nvidia0,
    ...), without starting JAX; None when the platform's files are unknown or none are visible."""
    import glob

    pattern = _DEVICE_FILES.get(platform)
    n = len(glob.glob(pattern)) if pattern else 0
    return n or None


def max_accelerators(platform: str, processes: int = 1) -> Ceiling:
    """How many `platform` devices each of `processes` processes may take: its share of the
    host's devices, or of `MAX_LOCAL_ACCELERATORS` where they cannot be counted."""
    n = local_accelerators(platform)
    if n is None:
        return Ceiling(max(1, MAX_LOCAL_ACCELERATORS // max(1, processes)),
                       f"a host has at most {MAX_LOCAL_ACCELERATORS} {platform} devices, shared by {processes} "
                       f"process{'es' if processes != 1 else ''} (this host's device files could not be counted)")
    return Ceiling(max(1, n // max(1, processes)),
                   f"this host has {n} {platform} devices ({_DEVICE_FILES[platform]}), shared by {processes} "
                   f"process{'es' if processes != 1 else ''}")


def check(flag: str, value: int, ceiling: Ceiling, *, force: bool = False) -> None:
    """Raise `AboveCeiling` when `value` exceeds `ceiling` and `force` is not set."""
    if not force and value > ceiling.value:
        raise AboveCeiling(flag, value, ceiling)


def check_run(*, processes: int, devices: int | None, platform: str = "cpu", force: bool = False,
              processes_flag: str = "--processes", devices_flag: str = "--devices",
              memory: int | None = None, cores: int | None = None) -> None:
    """Check a command's process count and its devices per process against this machine, in that
    order: the processes against the cores and against the memory they take with one device
    each; then virtual CPU devices against the memory left to each of those processes, or
    accelerators against the host's (`max_accelerators`). devices=None: not checked.
    Raises `AboveCeiling` (a ValueError) for the first one above its ceiling, unless `force`."""
    cpu = platform == "cpu"
    memory = _memory(memory)
    check(processes_flag, processes, max_processes(1, cpu=cpu, memory=memory, cores=cores), force=force)
    if devices is None:
        return
    ceiling = max_cpu_devices(processes, memory=memory) if cpu else max_accelerators(platform, processes)
    check(devices_flag, devices, ceiling, force=force)
