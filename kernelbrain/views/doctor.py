"""`kb doctor`: what this machine gives kb, checked one item at a time, each with what to do about it.

Every check returns a Check (ok, warn, fail or skip, one line of detail, facts for --json) and never
raises: a broken item is itself the finding. The command shows every check, then exits 1 when any
failed (a warning or a skip leaves it 0), so a script can gate on it.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from kernelbrain.core import nsight

Status = Literal["ok", "warn", "fail", "skip"]

# SQLite's WAL-reset bug (sqlite.org/wal.html#walresetbug): a race between two checkpoints and a commit
# by another connection can corrupt a WAL database. In every release from 3.7.0 (WAL's first) through
# 3.51.2; fixed in 3.51.3, with the fix backported to the 3.44.6 and 3.50.7 patch releases.
WAL_BUG_FIRST = (3, 7, 0)
WAL_BUG_FIXED = (3, 51, 3)
WAL_BUG_BACKPORTS = {(3, 44): 6, (3, 50): 7}  # (major, minor) -> first patch release with the fix

NCU_PROBE = "import torch; x = torch.ones(1024, device='cuda'); (x * 2).sum().item()"
GPU_NODES = "/dev/nvidia[0-9]*"  # one device node per NVIDIA GPU the driver sees
NVIDIA_PACKAGE = re.compile(r"^(nvidia|cuda)[-_]", re.I)  # the CUDA libraries a CUDA build of torch pulls in
CPU_FIX = (
    "./install.sh in kb's checkout makes a fresh .venv with a CPU build (elsewhere: a fresh environment, "
    "then pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)


class Check(BaseModel):
    name: str
    status: Status
    detail: str
    facts: dict[str, Any] = {}


class Report(BaseModel):
    checks: list[Check]

    @property
    def failed(self) -> list[str]:
        """The checks that failed: `kb doctor` exits 1 when there is any (warn and skip do not count)."""
        return [c.name for c in self.checks if c.status == "fail"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def wal_reset_bug(sqlite_version: str) -> bool:
    """True for a SQLite that has the WAL-reset bug."""
    v = _version(sqlite_version)
    if not WAL_BUG_FIRST <= v < WAL_BUG_FIXED:
        return False
    backport = WAL_BUG_BACKPORTS.get(v[:2])
    return backport is None or v[2:3] < (backport,)


def check_kb() -> Check:
    from kernelbrain import __version__

    return Check(
        name="kb",
        status="ok",
        detail=f"kernelbrain {__version__}, Python {platform.python_version()} on {platform.system()} "
        f"{platform.machine()}, {os.cpu_count()} CPUs",
        facts={"kernelbrain": __version__, "python": platform.python_version(), "cpus": os.cpu_count()},
    )


def check_torch() -> Check:
    """torch imports; a CUDA build where no NVIDIA GPU is (its gigabytes of CUDA libraries idle) warns."""
    try:
        import torch
    except Exception as e:  # an import that fails is the finding, whatever it raised
        return Check(name="torch", status="fail", detail=f"cannot import torch: {type(e).__name__}: {e}")
    cuda = torch.version.cuda
    build = f"CUDA {cuda} build" if cuda else "CPU build" if not torch.version.hip else "ROCm build"
    facts: dict[str, Any] = {"version": torch.__version__, "cuda": cuda}
    found = f"torch {torch.__version__} ({build})"
    if cuda and gpu_evidence() is None:
        size, packages = cuda_footprint()
        facts.update(footprint_bytes=size, nvidia_packages=packages)
        return Check(
            name="torch",
            status="warn",
            detail=f"{found} on a machine with no NVIDIA GPU (no nvidia-smi, no /dev/nvidia*): torch "
            f"and its {packages} NVIDIA package{'s' * (packages != 1)} take {size / 1e9:.1f} GB of this "
            f"environment, for CUDA libraries nothing here can use; {CPU_FIX}",
            facts=facts,
        )
    return Check(name="torch", status="ok", detail=found, facts=facts)


def gpu_evidence(timeout_s: float = 20.0) -> str | None:
    """What shows an NVIDIA GPU here (nvidia-smi's list, a device node); None where nothing does."""
    smi = _nvidia_smi(timeout_s)
    if isinstance(smi, list) and smi:
        return f"nvidia-smi lists {smi[0]}"
    nodes = sorted(glob.glob(GPU_NODES))
    return f"{nodes[0]} exists" if nodes else None


def cuda_footprint() -> tuple[int, int]:
    """(bytes, count) of torch and the NVIDIA packages installed beside it, from their RECORD files."""
    size, packages = 0, 0
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "torch" or NVIDIA_PACKAGE.match(name):
            size += sum(f.size or 0 for f in dist.files or [])
            packages += name != "torch"
    return size, packages


def _nvidia_smi(timeout_s: float) -> list[str] | str | None:
    """One 'name, driver, memory' line per GPU; a str says why nvidia-smi failed; None: not installed."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        r = subprocess.run(query, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    if r.returncode != 0:
        return f"nvidia-smi exited {r.returncode}: {(r.stdout + r.stderr).strip().splitlines()[:1]}"
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def check_gpu(timeout_s: float = 20.0) -> Check:
    from kernelbrain.runtime.runner import detect_device

    smi = _nvidia_smi(timeout_s)
    facts: dict[str, Any] = {"nvidia_smi": smi, "kb_device": detect_device()}
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        gpus = [
            f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
            for i in range(n)
        ]
    except Exception as e:  # a broken CUDA set-up is what this check reports
        return Check(name="gpu", status="fail", detail=f"torch cannot query CUDA: {type(e).__name__}: {e}")
    facts["torch_gpus"] = gpus
    driver = ""
    if isinstance(smi, list) and smi:
        driver = f"; driver {smi[0].split(',')[1].strip()}" if smi[0].count(",") >= 2 else ""
    if gpus:
        return Check(
            name="gpu", status="ok", detail=f"{n} CUDA GPU(s): {', '.join(gpus)}{driver}", facts=facts
        )
    if isinstance(smi, list) and smi:
        return Check(
            name="gpu",
            status="fail",
            detail=f"nvidia-smi sees {smi[0]} but torch sees no CUDA GPU: install a CUDA build of torch",
            facts=facts,
        )
    why = smi if isinstance(smi, str) else "no nvidia-smi"
    return Check(
        name="gpu",
        status="warn",
        detail=f"no CUDA GPU ({why}): kb runs candidates on the CPU through the Triton interpreter, "
        "which checks kernels but says nothing about their speed",
        facts=facts,
    )


def check_triton(gpu: bool) -> Check:
    try:
        import triton
    except Exception as e:  # an import that fails is the finding
        return Check(name="triton", status="fail", detail=f"cannot import triton: {type(e).__name__}: {e}")
    how = (
        "compiles for the GPU"
        if gpu
        else "runs through its interpreter (kb's sandbox sets TRITON_INTERPRET=1)"
    )
    return Check(
        name="triton",
        status="ok",
        detail=f"triton {triton.__version__}; {how}",
        facts={"version": triton.__version__},
    )


def check_ncu(gpu: bool, timeout_s: float = 60.0) -> Check:
    """Is Nsight Compute there, and may it read the performance counters? (one tiny profiled kernel)"""

    path = shutil.which("ncu")
    if path is None:
        return Check(
            name="ncu",
            status="warn",
            detail="ncu (Nsight Compute) is not on PATH: kb profiles with its analytical roofline instead",
        )
    facts: dict[str, Any] = {"path": path}
    try:
        r = subprocess.run(["ncu", "--version"], capture_output=True, text=True, timeout=min(timeout_s, 20))
        lines = r.stdout.strip().splitlines()
        facts["version"] = lines[-1] if lines else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(name="ncu", status="warn", detail=f"{path} does not run: {e}", facts=facts)
    found = f"{path} ({facts['version'] or 'version unknown'})"
    if not gpu:
        return Check(
            name="ncu",
            status="warn",
            detail=f"{found}, but there is no GPU to profile: counters not probed",
            facts=facts,
        )
    probe = ["ncu", "--csv", "--clock-control", "none", "--print-units", "base", "--target-processes", "all"]
    probe += ["--metrics", nsight.METRICS["duration_ns"], sys.executable, "-c", NCU_PROBE]
    try:
        r = subprocess.run(probe, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check(
            name="ncu",
            status="warn",
            detail=f"{found}: the counter probe took over {timeout_s:g} s",
            facts=facts,
        )
    try:
        metrics, kernels = nsight.parse(r.stdout + r.stderr)
    except nsight.NcuError as e:
        fix = (
            ": the counters need permission: run as root, or load the nvidia module with "
            "NVreg_RestrictProfilingToAdminUsers=0"
            if "ERR_NVGPUCTRPERM" in r.stdout + r.stderr
            else ""
        )
        return Check(
            name="ncu",
            status="warn",
            detail=f"{found} cannot read the counters ({e}){fix}; kb profiles with the roofline instead",
            facts=facts,
        )
    facts["probe"] = {"kernels": kernels, "duration_ns": metrics.get("duration_ns")}
    return Check(
        name="ncu", status="ok", detail=f"{found} reads the counters ({kernels} kernels)", facts=facts
    )


def check_sqlite() -> Check:
    """The driver the store actually uses (store/_sqlite.py picks pysqlite3 where installed)."""
    import sqlite3 as stdlib

    from kernelbrain.store.driver import sqlite3

    version = sqlite3.sqlite_version
    driver = sqlite3.__name__.split(".")[0]
    facts = {"driver": driver, "version": version, "stdlib_sqlite": stdlib.sqlite_version}
    if wal_reset_bug(version):
        return Check(
            name="sqlite",
            status="warn",
            detail=f"SQLite {version} (via {driver}) has the WAL-reset bug (3.7.0 to 3.51.2, fixed in "
            "3.51.3; sqlite.org/wal.html#walresetbug), which can corrupt a database written by several "
            "connections as kb's workers do: `pip install pysqlite3` (it bundles a fixed SQLite)",
            facts=facts,
        )
    return Check(
        name="sqlite",
        status="ok",
        detail=f"SQLite {version} via {driver}, free of the WAL-reset bug of 3.7.0 to 3.51.2",
        facts=facts,
    )


def check_store(db: str, timeout_s: float = 5.0) -> Check:
    """The store at --db: a PostgreSQL server answers (its version), and the schema is current. Read-only:
    a database that is missing, empty or behind is reported (kb run creates or migrates it), not changed."""
    from kernelbrain.store import StoreError, mask, open_store
    from kernelbrain.store.urls import is_url

    facts: dict[str, Any] = {"db": mask(db)}
    if is_url(db):
        from kernelbrain.store.postgres import server_version

        try:
            facts["server_version"] = server_version(db, timeout_s)
        except StoreError as e:
            return Check(name="store", status="fail", detail=str(e), facts=facts)
        kind = f"PostgreSQL {facts['server_version']} at {facts['db']}"
    elif not os.path.exists(db):
        return Check(
            name="store", status="ok", detail=f"no database at {db} yet; kb run creates it", facts=facts
        )
    else:
        kind = f"SQLite file {db}"
    try:
        with open_store(db, readonly=True) as store:
            facts["schema"] = store.schema_version()
    except StoreError as e:
        # a subclass (corrupt, foreign, newer than this kb) is a fault; an empty or older one, news
        status: Status = "warn" if type(e) is StoreError else "fail"
        return Check(name="store", status=status, detail=f"{kind} answers; {e}", facts=facts)
    return Check(
        name="store", status="ok", detail=f"{kind}: kb schema {facts['schema']}, current", facts=facts
    )


def check_llm(base_url: str | None, model: str | None, timeout_s: float = 5.0) -> Check:
    """Does the configured OpenAI-compatible endpoint answer GET {base}/models?"""
    from kernelbrain.generators import GenerationError
    from kernelbrain.generators.llm import EndpointError, LLMGenerator

    base_url = base_url or os.environ.get("KB_LLM_BASE_URL")
    model = model or os.environ.get("KB_LLM_MODEL")
    if not base_url:
        return Check(
            name="llm",
            status="skip",
            detail="no endpoint configured (--llm-base-url or KB_LLM_BASE_URL); "
            "only --generator llm needs one",
        )
    try:
        # the generator's own client: the same key lookup (environment only), headers and base URL
        gen = LLMGenerator(base_url=base_url, model=model or "-", timeout_s=timeout_s)
    except GenerationError as e:
        return Check(name="llm", status="fail", detail=str(e), facts={"base_url": base_url})
    facts: dict[str, Any] = {"base_url": gen.base_url, "model": model}
    try:
        ids = gen.list_models()
    except EndpointError as e:
        facts["status"] = e.status
        # no answer, or one that says the URL or the key is wrong, fails; an odd answer only warns
        failed = e.status is None or e.status in (401, 403, 404)
        return Check(name="llm", status="fail" if failed else "warn", detail=str(e), facts=facts)
    facts.update(status=200, models=ids)
    listed = f"{len(ids)} model(s): {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}"
    if model and model not in ids:
        return Check(
            name="llm",
            status="warn",
            detail=f"{gen.base_url} answers with {listed}; the configured model {model!r} is not among them",
            facts=facts,
        )
    return Check(name="llm", status="ok", detail=f"{gen.base_url} answers with {listed}", facts=facts)


def check_sandbox() -> Check:
    """The isolation candidates' children get here: bubblewrap, unshare, or none (each tried for real)."""
    from kernelbrain.runtime import isolation

    usable = {level: isolation.usable(level) for level in isolation.LEVELS}
    level = isolation.chosen()
    facts = {"isolation": level, "usable": usable, "bwrap": isolation.bwrap_binary()}
    if level == "bwrap":
        return Check(name="sandbox", status="ok", detail=isolation.describe(level), facts=facts)
    fix = "install bubblewrap (apt install bubblewrap), or set KB_BWRAP to a bwrap binary"
    return Check(name="sandbox", status="warn", detail=f"{isolation.describe(level)}; {fix}", facts=facts)


def check_limits(device: str) -> Check:
    """What a candidate's child may use (runtime/limits.py): its uid, memory, processes, folder, files.
    A warning where kb is root and the child would be too (no bubblewrap)."""
    from kernelbrain.runtime import isolation, limits

    level = isolation.chosen()
    record = limits.recorded(device, level)
    facts = record.model_dump() | {"etc": isolation.etc_entries() if level == "bwrap" else []}
    root = record.uid is None and os.geteuid() == 0
    status: Status = "warn" if root else "ok"
    return Check(name="limits", status=status, detail=limits.describe(record), facts=facts)


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    """A check that raises anyway (a bug or an odd machine) still shows, as a failure naming why."""
    try:
        return fn()
    except Exception as e:  # the doctor must show every check, whatever one of them hits
        return Check(name=name, status="fail", detail=f"the check itself failed: {type(e).__name__}: {e}")


def run(
    llm_base_url: str | None = None,
    llm_model: str | None = None,
    timeout_s: float = 5.0,
    ncu_timeout_s: float = 60.0,
    db: str | None = None,
) -> Report:
    checks = [_guarded("kb", check_kb), _guarded("torch", check_torch)]
    gpu = _guarded("gpu", check_gpu)
    has_gpu = gpu.status == "ok"
    checks += [
        gpu,
        _guarded("triton", lambda: check_triton(has_gpu)),
        _guarded("ncu", lambda: check_ncu(has_gpu, ncu_timeout_s)),
        _guarded("sqlite", check_sqlite),
        _guarded("sandbox", check_sandbox),
        _guarded("limits", lambda: check_limits("cuda" if has_gpu else "cpu")),
        _guarded("llm", lambda: check_llm(llm_base_url, llm_model, timeout_s)),
    ]
    if db is not None:  # only where asked (--db or KB_DB): a machine need not have a store to be fit
        checks.append(_guarded("store", lambda: check_store(db, timeout_s)))
    return Report(checks=checks)


def render(report: Report) -> str:
    return "\n".join(f"{c.status:<5} {c.name:<7} {c.detail}" for c in report.checks)
