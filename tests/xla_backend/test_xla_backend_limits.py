"""Ceilings from this machine's memory and cores (issue 28, point 5), with the machine's figures
pinned so the expectations are hand-computed: 1 GiB = 1024 MiB; a process takes 512 MiB, a
virtual CPU device 256 KiB (xla_backend.limits)."""
import pytest

from xla_backend import limits

GIB = 1 << 30


def test_processes_are_bounded_by_cores_and_by_memory():
    assert limits.max_processes(cores=2, memory=64 * GIB).value == 4          # 2 per core
    assert limits.max_processes(cores=1, memory=64 * GIB).value == 4          # at least 4 anywhere
    assert limits.max_processes(cores=16, memory=64 * GIB).value == 32
    # 4 GiB hold 7 processes of 512 MiB + 256 KiB (8 would need 4 GiB + 2 MiB)
    assert limits.max_processes(cores=16, memory=4 * GIB).value == 7
    # 4 GiB, 1024 devices each: 512 MiB + 256 MiB = 768 MiB a process -> 5
    assert limits.max_processes(1024, cores=16, memory=4 * GIB).value == 5
    assert limits.max_processes(1024, cpu=False, cores=16, memory=4 * GIB).value == 8  # no CPU devices


def test_cpu_devices_are_bounded_by_the_memory_left_to_each_process():
    # 4 GiB over 2 processes: 2048 MiB - 512 MiB = 1536 MiB each, at 256 KiB a device
    assert limits.max_cpu_devices(2, memory=4 * GIB).value == 1536 * 4
    assert limits.max_cpu_devices(1, memory=4 * GIB).value == 3584 * 4
    assert limits.max_cpu_devices(16, memory=4 * GIB).value == 1                # never below one device


def test_a_machine_whose_memory_cannot_be_read_is_bounded_by_its_cores_and_xla(monkeypatch):
    monkeypatch.setattr(limits.resources, "available_memory", lambda: None)
    assert limits.max_processes(cores=3).value == 6
    assert limits.max_cpu_devices(1).value == limits.MAX_DEVICE_COUNT


def test_a_refusal_names_the_value_the_ceiling_why_and_force():
    with pytest.raises(limits.AboveCeiling) as info:
        limits.check_run(processes=64, devices=8, cores=2, memory=64 * GIB)
    assert str(info.value) == ("--processes 64 is above the ceiling of 4 (2 per usable CPU core, and this machine "
                               "has 2); pass --processes 4 or less, or add --force to run with 64 anyway.")
    assert isinstance(info.value, ValueError) and info.value.ceiling.value == 4
    with pytest.raises(limits.AboveCeiling, match=r"^--devices-per-process 1000000000 is above the ceiling of 6144 "
                                                  r"\(a virtual CPU device takes about 256 KiB in each of the 2 "
                                                  r"processes that start it, next to 512 MiB per process, and 4 GiB "
                                                  r"of memory is available\); pass --devices-per-process 6144 or less, "
                                                  r"or add --force"):
        limits.check_run(processes=2, devices=10**9, cores=2, memory=4 * GIB, devices_flag="--devices-per-process")
    limits.check_run(processes=64, devices=10**9, cores=2, memory=4 * GIB, force=True)  # --force: no check
    limits.check_run(processes=2, devices=6144, cores=2, memory=4 * GIB)  # at the ceiling: allowed
    limits.check_run(processes=4, devices=2048, cores=2, memory=4 * GIB)  # (1024 MiB - 512 MiB) / 256 KiB


def test_accelerators_are_bounded_by_the_hosts_devices(monkeypatch):
    monkeypatch.setattr(limits, "local_accelerators", lambda platform: 8)
    assert limits.max_accelerators("cuda", 2).value == 4
    with pytest.raises(limits.AboveCeiling, match=r"^--devices 5 is above the ceiling of 4 \(this host has 8 cuda "):
        limits.check_run(processes=2, devices=5, platform="cuda", cores=2, memory=64 * GIB)
    monkeypatch.setattr(limits, "local_accelerators", lambda platform: None)
    assert limits.max_accelerators("cuda", 2).value == limits.MAX_LOCAL_ACCELERATORS // 2


def test_the_xla_device_count_flag_is_range_checked_before_xla_reads_it():
    from xla_backend import platform

    with pytest.raises(ValueError, match=r"devices=9223372036854775808: the CPU device count must be <= 2147483647"):
        platform.configure("cpu", 2**63)
    from xla_backend import launch

    with pytest.raises(ValueError, match=r"devices_per_process=9223372036854775808: pass an int <= 2147483647"):
        launch.run_local(["true"], devices_per_process=2**63)
