"""What this machine can give a process: its free memory and the CPU cores it may run on.

One place for the figures that size ceilings: `refsim.Mesh` refuses a device-id array that
cannot fit in memory, and `xla_backend.limits` derives the ceilings on virtual devices and
processes that `python -m conformance run` and `python -m xla_backend launch` apply. It
imports nothing from the project and never imports JAX.

    from refsim import resources
    resources.available_memory()   # bytes this process may still allocate, e.g. 22_000_000_000
    resources.usable_cores()       # CPU cores this process may run on, e.g. 2
"""
from __future__ import annotations

import os

__all__ = ["available_memory", "format_bytes", "usable_cores"]


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo (Linux: free memory plus what the kernel can reclaim)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sysconf_available() -> int | None:
    """Free physical pages times the page size (POSIX systems without /proc/meminfo)."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def _cgroup_headroom() -> int | None:
    """What the cgroup v2 memory limit still allows (a container's limit below the host's memory)."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as fh:
            used = int(fh.read().strip())
        return max(0, int(limit) - used)
    except (OSError, ValueError):
        return None


def _rlimit_headroom() -> int | None:
    """The address-space limit (`ulimit -v`) when one is set."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def available_memory() -> int | None:
    """Bytes this process may still allocate: the least of the system's available memory, the
    cgroup's headroom and the address-space limit; None when none of them can be read."""
    known = [v for v in (_meminfo_available() or _sysconf_available(), _cgroup_headroom(), _rlimit_headroom())
             if v is not None]
    return min(known) if known else None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; else the machine's count; at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def format_bytes(n: float) -> str:
    """`n` bytes in words: ``512 B``, ``1.5 KiB``, ``21.6 GiB``, ``8 EiB``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024:
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.3g} EiB"
