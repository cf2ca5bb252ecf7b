"""The suite on a real GPU (marked `gpu`): skipped, with the reason, where there is none.

Run on a GPU machine with `python -m pytest -m gpu tests/conformance/engine/test_hardware_gpu.py`. Each test starts
fresh processes: the test process itself runs JAX on CPU (tests/conftest.py).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def _gpu_count() -> tuple[int, str]:
    """(number of NVIDIA GPUs, why none) without starting JAX here."""
    from xla_backend.platform import installed_plugins

    if not any("cuda" in name for name in installed_plugins()):
        return 0, "no JAX CUDA plugin installed (pip install -U 'jax[cuda12]')"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no nvidia-smi: no NVIDIA driver on this machine"
    r = subprocess.run([smi, "--list-gpus"], capture_output=True, text=True, timeout=60)
    n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    return n, "nvidia-smi lists no GPU"


GPUS, WHY = _gpu_count()
needs_gpu = pytest.mark.skipif(GPUS < 1, reason=WHY)


def _records(folder):
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


@needs_gpu
def test_collectives_and_programs_on_the_gpu(tmp_path):
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--platform", "cuda", "--suite",
                        "collectives,programs", "--examples", "3", "--no-progress", "--report", str(tmp_path)],
                       capture_output=True, text=True, timeout=1800)
    records = _records(tmp_path)
    hw = records[0]["hardware"]
    assert hw["platform"] in ("gpu", "cuda") and hw["device_count"] == GPUS and hw["device_kinds"]
    assert any(name.startswith(("jax-cuda", "jax_cuda")) for name in hw["packages"])
    bad = [(x["case_id"], x["message"][:300]) for x in records if x["type"] == "case"
           and x["status"] in ("fail", "error")]
    # every difference a GPU shows must be listed in xfails/cuda.txt with its signature
    assert r.returncode == 0 and not bad, bad


@needs_gpu
def test_preflight_refuses_more_devices_than_the_gpus(tmp_path):
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--platform", "cuda", "--devices",
                        str(GPUS + 1), "--suite", "collectives", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and f"{GPUS + 1} devices are needed" in r.stderr and r.stdout == ""


@pytest.mark.skipif(GPUS < 2, reason=WHY if GPUS < 1 else "a distributed GPU run needs 2 GPUs or more")
@pytest.mark.multiprocess
def test_distributed_run_over_two_gpu_processes(tmp_path):
    per = GPUS // 2
    r = subprocess.run([sys.executable, "-m", "xla_backend", "launch", "--platform", "cuda", "--processes", "2",
                        "--devices-per-process", str(per), "--timeout", "1800", "--",
                        sys.executable, "-m", "conformance", "run", "--distributed", "--platform", "cuda",
                        "--suite", "collectives", "--examples", "3", "--no-progress", "--report", str(tmp_path)],
                       capture_output=True, text=True, timeout=2400, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    hw = _records(tmp_path)[0]["hardware"]
    assert hw["process_count"] == 2 and hw["device_count"] == 2 * per
