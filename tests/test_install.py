"""./install.sh's choice of torch: tools/torch_build.py tells a CPU build from a CUDA one in pip's own dry-run
resolution, and finds the newest +cpu version pip's sources list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.torch_build import classify, newest_cpu

ROOT = Path(__file__).resolve().parents[1]


def report(torch_version: str, *others: str, url: str = "https://files.example/torch.whl") -> dict:
    """The part of a `pip install --dry-run --report` that classify() reads."""
    installs = [{"metadata": {"name": "torch", "version": torch_version}, "download_info": {"url": url}}]
    installs += [
        {"metadata": {"name": name, "version": "1"}, "download_info": {"url": "u"}} for name in others
    ]
    return {"version": "1", "install": installs}


def test_a_cuda_build_needs_nvidia_packages_or_says_cu_in_its_version() -> None:
    # PyPI's Linux x86_64 wheel: a plain version that pulls in NVIDIA's runtime
    assert classify(report("2.14.1", "filelock", "nvidia-cublas", "cuda-bindings"))[::3] == ("cuda", 2)
    assert classify(report("2.5.1+cu121", "filelock"))[0] == "cuda"  # a PyTorch index's CUDA wheel
    # the CPU index's wheel, and PyPI's wheel for a machine it has no CUDA build for
    assert classify(report("2.13.0+cpu", "filelock")) == (
        "cpu",
        "2.13.0+cpu",
        "https://files.example/torch.whl",
        0,
    )
    assert classify(report("2.14.1", "filelock", "sympy"))[0] == "cpu"


def test_a_local_wheel_is_named_by_its_path() -> None:
    r = report("2.13.0+cpu", url="file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl")
    assert classify(r)[2] == "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"


def test_the_newest_cpu_version_listed() -> None:
    listing = "torch (2.15.0)\nAvailable versions: 2.15.0, 2.14.1, 2.13.0+cpu, 2.13.0, 2.12.0+cpu\n"
    assert newest_cpu(listing) == "2.13.0+cpu"
    assert newest_cpu("torch (2.15.0)\nAvailable versions: 2.15.0, 2.14.1\n") is None
    assert newest_cpu("") is None


def test_the_command_line_install_sh_reads(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(report("2.14.1", "nvidia-nccl-cu13")))
    tool = [sys.executable, str(ROOT / "tools" / "torch_build.py")]
    out = subprocess.run(
        [*tool, "report", str(tmp_path / "r.json")], capture_output=True, text=True, check=True
    )
    assert out.stdout == "cuda 2.14.1 https://files.example/torch.whl 1\n"
    listing = "Available versions: 2.14.1, 2.13.0+cpu\n"
    out = subprocess.run([*tool, "newest-cpu"], input=listing, capture_output=True, text=True, check=True)
    assert out.stdout == "2.13.0+cpu\n"
