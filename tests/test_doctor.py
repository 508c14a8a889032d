"""`kb doctor` on this machine (no GPU, no ncu), with stand-in `ncu` programs, and against a real
OpenAI-compatible server on 127.0.0.1 and a dead port."""

from __future__ import annotations

import ast
import inspect
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from kernelbrain.store.driver import sqlite3

from kernelbrain.cli import main
from kernelbrain.generators.llm import EndpointError, LLMGenerator
from kernelbrain.runtime import isolation
from kernelbrain.runtime.runner import detect_device
from kernelbrain.views import doctor
from tests.kbcli import kb, kb_env
from tests.llm_server import LLMServer, closed_port

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["kb", "torch", "gpu", "triton", "ncu", "sqlite", "sandbox", "limits", "llm"]


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """kb's environment with PATH holding only tmp_path/bin (so no ncu, no nvidia-smi) and no LLM settings."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    env = {k: v for k, v in kb_env().items() if not k.startswith(("KB_LLM_", "OPENAI_"))}
    env["PATH"] = str(tmp_path / "bin")
    env.update(extra)
    return env


def doctor_json(env: dict[str, str], *args: str, code: int = 0) -> dict[str, dict]:
    """The checks `kb doctor --json` prints; its exit status is 1 when any failed, else 0."""
    r = kb("doctor", "--json", *args, env=env)
    assert r.returncode == code, r.stderr
    checks = json.loads(r.stdout)["checks"]
    assert [c["name"] for c in checks] == NAMES
    return {c["name"]: c for c in checks}


def test_this_machine(tmp_path: Path) -> None:
    checks = doctor_json(bare_env(tmp_path))
    idle_cuda = torch.version.cuda is not None and doctor.gpu_evidence() is None
    assert checks["kb"]["status"] == "ok" and checks["torch"]["status"] == ("warn" if idle_cuda else "ok")
    assert checks["triton"]["status"] == "ok" and checks["triton"]["facts"]["version"]
    if detect_device() == "cpu":
        assert checks["gpu"]["status"] == "warn" and "Triton interpreter" in checks["gpu"]["detail"]
        assert "interpreter" in checks["triton"]["detail"]
    assert checks["ncu"]["status"] == "warn" and "not on PATH" in checks["ncu"]["detail"]
    # the SQLite of the driver the store really uses, judged against the WAL-reset range
    sq = checks["sqlite"]
    assert sq["facts"]["version"] == sqlite3.sqlite_version
    assert sq["facts"]["driver"] == sqlite3.__name__.split(".")[0]
    assert sq["status"] == ("warn" if doctor.wal_reset_bug(sqlite3.sqlite_version) else "ok")
    assert checks["llm"]["status"] == "skip" and "KB_LLM_BASE_URL" in checks["llm"]["detail"]
    # with neither bwrap nor unshare on its PATH, the sandbox says it isolates nothing, and how to fix it
    sb = checks["sandbox"]
    assert sb["status"] == "warn" and sb["facts"]["isolation"] == "none", sb


def test_the_sandbox_check_names_the_strongest_isolation_that_works() -> None:
    checks = doctor_json(kb_env())
    sb = checks["sandbox"]
    want = next(level for level in isolation.LEVELS if isolation.usable(level))
    assert sb["facts"]["isolation"] == want and sb["status"] == ("ok" if want == "bwrap" else "warn"), sb
    # and the limits a child starts with, each named (runtime/limits.py)
    lim = checks["limits"]
    for words in ("uid", "memory", "RLIMIT_DATA", "folder", "files"):
        assert words in lim["detail"], lim
    assert lim["facts"]["memory_bytes"] > 0 and lim["facts"]["file_bytes"] > 0, lim
    if want == "bwrap":
        assert "/etc/ld.so.cache" in lim["facts"]["etc"] and "/etc/shadow" not in lim["facts"]["etc"], lim
        if os.geteuid() == 0:  # a uid of its own, and a process cap on it
            assert lim["status"] == "ok" and lim["facts"]["uid_per_worker"] and lim["facts"]["processes"], lim


def test_a_weaker_sandbox_is_named_with_its_fix(tmp_path: Path) -> None:
    checks = doctor_json({**bare_env(tmp_path), "KB_SANDBOX": "none"})
    sb = checks["sandbox"]
    assert sb["status"] == "warn" and sb["facts"]["isolation"] == "none", sb
    assert "install bubblewrap" in sb["detail"]


def fake_nvidia_package(site: Path, size: int) -> None:
    """An installed distribution named like CUDA's runtime libraries, one file of `size` bytes in RECORD."""
    info = site / "nvidia_cublas-13.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cublas\nVersion: 13.0.0\n")
    (info / "RECORD").write_text(f"nvidia/cublas/lib/libcublas.so.13,sha256=x,{size}\n")


def test_a_cuda_build_without_a_gpu_warns_with_its_size_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_package(tmp_path / "site", 3 * 10**9)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(doctor, "GPU_NODES", str(tmp_path / "dev" / "nvidia[0-9]*"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no nvidia-smi
    c = doctor.check_torch()
    assert c.status == "warn" and c.detail.startswith(f"torch {torch.__version__} (CUDA 13.0 build) on a ")
    assert "no NVIDIA GPU" in c.detail and "its 1 NVIDIA package take" in c.detail
    assert c.facts["footprint_bytes"] >= 3 * 10**9 and c.facts["nvidia_packages"] == 1
    assert f"take {c.facts['footprint_bytes'] / 1e9:.1f} GB" in c.detail
    assert "./install.sh" in c.detail and "--index-url https://download.pytorch.org/whl/cpu" in c.detail
    # a GPU's device node, or nvidia-smi listing one, and the CUDA build is the right one
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    assert doctor.check_torch().status == "ok"
    (tmp_path / "dev" / "nvidia0").unlink()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB'\n")
    smi.chmod(0o755)
    ok = doctor.check_torch()
    assert ok.status == "ok" and ok.detail == f"torch {torch.__version__} (CUDA 13.0 build)", ok
    assert doctor.gpu_evidence() == "nvidia-smi lists NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB"


def test_a_cpu_build_without_a_gpu_is_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    c = doctor.check_torch()
    assert c.status == "ok" and c.detail == f"torch {torch.__version__} (CPU build)"


def test_the_readme_sample_shows_every_check() -> None:
    """README.md's `$ kb doctor` sample: one line per check, in order, laid out as the command does."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme[readme.index("$ kb doctor\n") :].split("\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[1] for line in lines] == NAMES
    for line, name in zip(lines, NAMES, strict=True):
        status = line.split()[0]
        assert status in {"ok", "warn", "fail", "skip"} and line.startswith(f"{status:<5} {name:<7} "), line


def test_text_output_is_one_line_per_check() -> None:
    r = CliRunner().invoke(main, ["doctor"], prog_name="kb")  # in-process: the JSON test ran the process
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [line.split()[1] for line in lines] == NAMES
    assert all(line.split()[0] in {"ok", "warn", "fail", "skip"} for line in lines)


def test_an_answering_endpoint_and_a_dead_port(tmp_path: Path) -> None:
    with LLMServer(models=("m1", "m2")) as server:
        checks = doctor_json(bare_env(tmp_path), "--llm-base-url", server.base_url, "--llm-model", "m2")
        assert server.requests and server.requests[-1].action == "get"
    assert checks["llm"]["status"] == "ok", checks["llm"]
    assert checks["llm"]["detail"] == f"{server.base_url} answers with 2 model(s): m1, m2"
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    env = bare_env(tmp_path, KB_LLM_BASE_URL=dead)  # from the environment this time
    checks = doctor_json(env, code=1)  # a failed check: exit 1, with every check still shown
    assert checks["llm"]["status"] == "fail"
    assert checks["llm"]["detail"].startswith(f"cannot reach {dead}/models (ConnectError")
    assert [c["status"] for c in checks.values()].count("fail") == 1
    text = kb("doctor", env=env)
    assert text.returncode == 1, text.stderr
    lines = text.stdout.splitlines()
    assert [line.split()[1] for line in lines] == NAMES and lines[-1].startswith("fail  llm     cannot reach")
    assert text.stderr == ""


def test_the_generator_lists_the_models_itself() -> None:
    """doctor asks the LLM client through its public list_models(), never through its private parts."""
    with LLMServer(models=("m1", "m2")) as server:
        gen = LLMGenerator(base_url=server.base_url, model="m1", timeout_s=5, env={"KB_LLM_API_KEY": "k-9"})
        assert gen.list_models() == ["m1", "m2"]
        assert server.requests[-1].headers["authorization"] == "Bearer k-9"
    with LLMServer(models_status=403) as server:
        with pytest.raises(EndpointError, match=r"answered 403: check KB_LLM_API_KEY$") as info:
            LLMGenerator(base_url=server.base_url, model="m", env={"KB_LLM_API_KEY": "k"}).list_models()
        assert info.value.status == 403
    with pytest.raises(EndpointError, match="cannot reach") as info:
        LLMGenerator(base_url=f"http://127.0.0.1:{closed_port()}/v1", model="m", env={}).list_models()
    assert info.value.status is None
    tree = ast.parse(inspect.getsource(doctor))
    private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")}
    assert not {a for a in private if not a.startswith("__")}, private


def test_llm_answers_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KB_LLM_API_KEY", "OPENAI_API_KEY", "KB_LLM_BASE_URL", "KB_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with LLMServer(models=("m1",)) as server:
        c = doctor.check_llm(server.base_url, "other")
        assert c.status == "warn" and "'other' is not among them" in c.detail
        monkeypatch.setenv("KB_LLM_API_KEY", "k-123")
        assert doctor.check_llm(server.base_url, "m1").status == "ok"
        assert server.requests[-1].headers["authorization"] == "Bearer k-123"  # the generator's key handling
        wrong = doctor.check_llm(server.base_url.removesuffix("/v1"), None)
        assert wrong.status == "fail" and "answered 404" in wrong.detail and "/v1" in wrong.detail
    monkeypatch.delenv("KB_LLM_API_KEY")
    with LLMServer(models_status=401) as server:
        c = doctor.check_llm(server.base_url, None)
        assert c.status == "fail" and c.detail.endswith(
            "answered 401: set KB_LLM_API_KEY (or OPENAI_API_KEY)"
        )


def fake_ncu(tmp_path: Path, body: str) -> None:
    """An `ncu` on PATH: prints a version for --version, else runs body (a real program, not a mock)."""
    path = tmp_path / "bin" / "ncu"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        '#!/bin/sh\nif [ "$1" = "--version" ]; then\n'
        '  echo "NVIDIA (R) Nsight Compute Command Line Profiler"\n  echo "Version 2099.1.0.0 (build 1)"\n'
        f"  exit 0\nfi\n{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_ncu_without_a_gpu_is_found_but_not_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ncu(tmp_path, "echo should not run; exit 1")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    c = doctor.check_ncu(gpu=False)
    assert c.status == "warn" and c.facts["version"] == "Version 2099.1.0.0 (build 1)"
    assert "no GPU to profile" in c.detail


def test_ncu_counter_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's output goes through kernelbrain.core.nsight's parser: a recorded H200 CSV reads, a
    permission error names the fix."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    fake_ncu(tmp_path, f"cat '{ROOT / 'tests' / 'fixtures' / 'ncu_softmax.csv'}'")
    ok = doctor.check_ncu(gpu=True)
    assert ok.status == "ok" and ok.facts["probe"]["kernels"] == 1 and ok.facts["probe"]["duration_ns"] > 0
    fake_ncu(
        tmp_path,
        'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU '
        'Performance Counters on the target device 0."; exit 1',
    )
    denied = doctor.check_ncu(gpu=True)
    assert denied.status == "warn" and "NVreg_RestrictProfilingToAdminUsers=0" in denied.detail
    assert "ERR_NVGPUCTRPERM" in denied.detail


@pytest.mark.parametrize(
    ("version", "affected"),
    [
        ("3.6.23", False),  # before WAL existed
        ("3.7.0", True),
        ("3.40.1", True),  # Python 3.11's bundled SQLite
        ("3.44.5", True),
        ("3.44.6", False),  # backport
        ("3.50.6", True),
        ("3.50.7", False),  # backport
        ("3.51.2", True),
        ("3.51.3", False),  # the fix
        ("3.53.4", False),  # pysqlite3 0.6.1
    ],
)
def test_the_wal_reset_range(version: str, affected: bool) -> None:
    assert doctor.wal_reset_bug(version) is affected
