"""Which torch build pip would install, read from pip's own resolution (install.sh's helper; the standard
library only: it runs before kb is installed).

A CUDA build of torch carries a +cuNNN local version label (the PyTorch indexes' wheels) or requires
NVIDIA's runtime packages (nvidia-*, cuda-*: PyPI's Linux x86_64 wheels); any other build is a CPU one
(PyPI's wheels for other machines, the +cpu wheels).

    python tools/torch_build.py report REPORT.json  # `pip install --dry-run --report`: BUILD VERSION URL N
    pip index versions torch | python tools/torch_build.py newest-cpu  # the newest +cpu version listed

BUILD is cpu or cuda, N the number of NVIDIA packages the resolution brings along.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote

NVIDIA = re.compile(r"^(nvidia|cuda)[-_]", re.I)
CUDA_LABEL = re.compile(r"\+cu\d+")


def classify(report: dict) -> tuple[str, str, str, int]:
    """(cpu or cuda, torch's version, its wheel's URL or path, NVIDIA packages) of a pip report."""
    installs = report.get("install", [])
    torch = next((i for i in installs if i["metadata"]["name"].lower() == "torch"), None)
    if torch is None:
        raise ValueError("the resolution installs no torch")
    version = torch["metadata"]["version"]
    nvidia = sum(bool(NVIDIA.match(i["metadata"]["name"])) for i in installs)
    build = "cuda" if nvidia or CUDA_LABEL.search(version) else "cpu"
    url = torch.get("download_info", {}).get("url", "?")
    return build, version, unquote(url.removeprefix("file://")), nvidia


def newest_cpu(listing: str) -> str | None:
    """The first (newest) +cpu version in `pip index versions` output."""
    for line in listing.splitlines():
        if line.strip().startswith("Available versions:"):
            versions = [v.strip() for v in line.split(":", 1)[1].split(",")]
            return next((v for v in versions if v.endswith("+cpu")), None)
    return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["report"] and len(argv) == 2:
        build, version, url, nvidia = classify(json.loads(Path(argv[1]).read_text()))
        print(build, version, url, nvidia)
        return 0
    if argv == ["newest-cpu"]:
        found = newest_cpu(sys.stdin.read())
        if found:
            print(found)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
