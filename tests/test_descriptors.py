"""Descriptors handed between real processes (core/descriptors.py): a child gives one under a name, the
worker drains it and passes it on, the judge takes it by name; what is not taken is closed; a name with
no descriptor is Missing. On a GPU, a trial's outputs written by one process read back in another after
the writer exited (child/cuda_vmm.py), and a header that claims more than the allocation is Unreadable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernelbrain.child import tensorfile
from kernelbrain.core import descriptors
from kernelbrain.core.handoff import header_of

ROOT = Path(__file__).resolve().parents[1]

GIVER = textwrap.dedent(
    """
    import os, sys
    from kernelbrain.core import descriptors
    for name, text in (("a.bin", b"first"), ("b.bin", b"second"), ("a.bin", b"newer")):
        fd = os.memfd_create(name)
        os.write(fd, text)
        descriptors.give(name, fd)
        os.close(fd)
    """
)


def _run_giver(code: str) -> list[tuple[str, int]]:
    """Run `code` in a child with its end of a pair; what it gave."""
    mine, theirs = descriptors.pair()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, descriptors.ENV: str(theirs), "PYTHONPATH": path}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, pass_fds=(theirs,), capture_output=True, timeout=120
        )
    finally:
        os.close(theirs)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = descriptors.drain(mine)
    mine.close()
    return got


def _pass_on(given: list[tuple[str, int]], judge_end) -> None:
    """As the worker does: send what a child gave on to the judge, then close its own copies."""
    for name, fd in given:
        descriptors.send(judge_end, name, fd)
    descriptors.close_all(given)


@pytest.fixture
def judge_end(monkeypatch: pytest.MonkeyPatch):
    """This process as a judge: the child's end of a pair as its channel, the worker's end returned."""
    mine, theirs = descriptors.pair()
    monkeypatch.setenv(descriptors.ENV, str(theirs))
    descriptors.forget_channel()
    yield mine
    descriptors.discard()
    descriptors.forget_channel()
    os.close(theirs)
    mine.close()


def _read(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 100)


def test_a_descriptor_given_by_one_process_is_taken_by_name_in_another(judge_end) -> None:
    given = _run_giver(GIVER)
    assert [name for name, _ in given] == ["a.bin", "b.bin", "a.bin"]
    _pass_on(given, judge_end)
    a = descriptors.take("a.bin")
    assert _read(a) == b"newer"  # the latest under a name counts
    os.close(a)
    with pytest.raises(descriptors.Missing, match=r"no descriptor came for a\.bin"):
        descriptors.take("a.bin")
    assert descriptors.held_names() == ["b.bin"]
    open_fds = len(os.listdir("/proc/self/fd"))
    descriptors.discard()  # after the request: what was not taken is closed
    assert descriptors.held_names() == []
    assert len(os.listdir("/proc/self/fd")) == open_fds - 1


def test_a_process_without_a_channel_cannot_give(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(descriptors.ENV, raising=False)
    descriptors.forget_channel()
    assert not descriptors.available()
    with pytest.raises(descriptors.Missing, match="no channel"):
        descriptors.give("x", 0)


WRITER = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from kernelbrain.child import tensorfile
    torch.manual_seed(0)
    out = [torch.randn(1000, 257, device="cuda"), torch.arange(7, device="cuda", dtype=torch.int8),
           torch.randn(3, device="cuda").half()]
    tensorfile.write(Path(sys.argv[1]), out)
    torch.save([t.cpu() for t in out], sys.argv[2])
    """
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU memory handed over needs a GPU")
def test_gpu_outputs_read_back_in_another_process_after_the_writer_exited(tmp_path: Path, judge_end) -> None:
    path, truth = tmp_path / "out.bin", tmp_path / "truth.pt"
    given = _run_giver(f"import sys; sys.argv[1:] = [{str(path)!r}, {str(truth)!r}]\n" + WRITER)
    header = json.loads(header_of(path).read_text())
    assert header["on_gpu"] > 0 and path.stat().st_size == 0  # the bytes never went through the host
    _pass_on(given, judge_end)
    got = tensorfile.read(path, "cuda")
    for a, b in zip(torch.load(truth), got, strict=True):
        assert b.device.type == "cuda" and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b.cpu())
    del got
    # a header that claims more than the allocation holds: Unreadable, never a read past it
    given = _run_giver(f"import sys; sys.argv[1:] = [{str(path)!r}, {str(truth)!r}]\n" + WRITER)
    header = json.loads(header_of(path).read_text())
    header["tensors"][0]["shape"] = [1000, 257 * 64]
    header_of(path).write_text(json.dumps(header))
    _pass_on(given, judge_end)
    with pytest.raises(tensorfile.Unreadable, match="bytes in an allocation of"):
        tensorfile.read(path, "cuda")


def test_a_receiver_that_never_reads_cannot_hang_the_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker passes a child's descriptors on to the judge: were the judge's end full and never read,
    the send fails after SEND_TIMEOUT_S rather than waiting for ever."""
    monkeypatch.setattr(descriptors, "SEND_TIMEOUT_S", 0.2)
    mine, theirs = descriptors.pair()
    fd = os.memfd_create("x")
    sent = 0
    try:
        with pytest.raises(OSError):
            for sent in range(100_000):  # noqa: B007 - counted for the assertion below
                descriptors.send(mine, "x", fd)
        assert sent > 0
    finally:
        os.close(fd)
        os.close(theirs)
        mine.close()
