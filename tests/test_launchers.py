"""Triton's launchers (a C module per kernel signature) built once by a judge and kept for every child
after: what a trial reports is checked as a signature, a launcher the judge built reaches the store and
the next trial's cache, and nothing a candidate's child wrote does.

The CPU interpreter builds no launchers, so the recording is shown on a driver that makes launchers
the way Triton's does (a class called with the kernel's source and metadata), and the judge's build is
stood in for by an entry placed in the judge's own cache."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernelbrain.child import launchers
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime import triton_cache
from kernelbrain.runtime.gate import build_launchers
from kernelbrain.runtime.sandbox import Sandbox

HERE = Path(__file__).resolve().parent
PROBLEM = (HERE / "problems" / "softmax_small.py").read_text()
GOOD = (HERE / "candidates" / "good_softmax.py").read_text()


@pytest.mark.parametrize(
    ("signature", "ok"),
    [
        (["*fp32", "*fp32", "i32", "constexpr"], True),
        ([["*bf16", "i64"], "u64", "fp32"], True),
        ([], True),
        (["tensordesc<fp32[64, 64]>"], False),  # a descriptor's launcher needs its metadata too
        (["*fp32", 'i32); system("id"'], False),
        ("*fp32", False),
        ([[[["i32"]]]], False),
        (["i32"] * 200, False),
        ([3], False),
    ],
)
def test_only_argument_types_make_a_signature(signature: Any, ok: bool) -> None:
    assert launchers.valid(signature) is ok


class _Made:
    """A driver's launcher class: called with a kernel's source and metadata."""

    calls: list[Any] = []

    def __init__(self, src: Any, metadata: Any) -> None:
        _Made.calls.append(src)


def test_the_signatures_triton_makes_launchers_for_are_noted() -> None:
    active = SimpleNamespace(launcher_cls=_Made)
    launchers.forget()
    try:
        launchers.record(active)
        launchers.record(active)  # once: not wrapped twice
        made = active.launcher_cls
        assert made.kb_original is _Made
        types = {"x": "*fp32", "n": "i32", "pair": ("*fp16", "i64"), "B": "constexpr"}
        made(SimpleNamespace(signature=types), SimpleNamespace(tensordesc_meta=None))
        made(SimpleNamespace(signature={"d": "tensordesc<fp32[8]>"}), SimpleNamespace(tensordesc_meta=[{}]))
        assert launchers.seen() == [["*fp32", "i32", ["*fp16", "i64"], "constexpr"]]
        assert len(_Made.calls) == 2  # Triton's own launcher is still made for both
        # the judge builds with Triton's class, not the recording one, and tuples as Triton writes them
        _Made.calls.clear()
        assert launchers.build_with(active, [*launchers.seen(), ["bad type!"]]) == {"built": 1}
        assert list(_Made.calls[0].signature.values()) == ["*fp32", "i32", ("*fp16", "i64"), "constexpr"]
    finally:
        launchers.forget()


def test_without_a_gpu_driver_the_judge_builds_nothing() -> None:
    assert launchers.build([["*fp32", "i32"]]) == {"built": 0}


@pytest.mark.needs("bwrap")  # a child's own Triton cache is bubblewrap's
def test_a_judges_launcher_fills_the_next_trials_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_cache, "LAUNCHERS", tmp_path / "launchers")
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    box = Sandbox("cpu", fresh_untrusted=False)  # its child kept after the gate, to look into
    try:
        box.start_judge()
        box.start()
        assert box.judge is not None and box.judge.tmp is not None and box.tmp is not None
        built = box.judge.tmp / "triton" / "launcher-key"
        built.mkdir(parents=True)
        (built / "__triton_launcher.so").write_bytes(b"the judge's")
        (box.judge.tmp / "triton" / "judge-kernel").mkdir()  # the judge's own kernels stay its own
        forged = box.tmp / "triton" / "forged-key"  # what a candidate's child might leave
        forged.mkdir(parents=True)
        (forged / "__triton_launcher.so").write_bytes(b"a candidate's")

        assert build_launchers(box, [["*fp32", "i32"]], timeout_s=60, task="t") >= 0.0
        store = tmp_path / "launchers"
        assert sorted(p.name for p in store.iterdir()) == ["launcher-key"]
        # a signature the judge built before is not sent again
        assert build_launchers(box, [["*fp32", "i32"]], timeout_s=60, task="t") == 0.0

        request = GateRequest(problem_source=PROBLEM, cand_source=GOOD, device="cpu", seeds=3)
        assert box.call(request, timeout_s=120)[0].passed
        assert box.tmp is not None
        cache = box.tmp / "triton"
        assert (cache / "launcher-key" / "__triton_launcher.so").read_bytes() == b"the judge's"
        assert not (cache / "forged-key").exists()
    finally:
        box.close()
