"""Who holds the GPU's memory, against what kb reserved: every INTERVAL seconds one JSON line with each
compute process's used memory (nvidia-smi), what the process is (its command line, cut), and the
reservations of kb's device room files (runtime/device_room.py: held, waiting, contexts). Run beside a
sweep on the device machine, to see which processes hold the memory an out-of-memory fault names.

    python3 tools/memory_watch.py OUT.jsonl [--interval 1] &
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from kernelbrain.runtime import gpu_lock


def processes() -> list[dict[str, object]]:
    """Each compute process on the GPUs: pid, MiB used, command line."""
    text = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    out: list[dict[str, object]] = []
    for line in text.splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out.append({"pid": int(pid), "mib": float(mib or 0), "cmd": cmd[:160]})
    return out


def rooms() -> dict[str, object]:
    """The device room files as they are now."""
    found: dict[str, object] = {}
    for path in sorted(gpu_lock.folder().glob("*.room")):
        try:
            found[path.stem] = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            found[path.stem] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    with args.out.open("a") as f:
        while True:
            f.write(json.dumps({"t": time.time(), "procs": processes(), "rooms": rooms()}) + "\n")
            f.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
