"""What a candidate's gate compiled travels, on the host, to the children that time it (under bubblewrap
each child has its own Triton cache): its own entries only, never what another candidate left.

The CPU interpreter compiles nothing, so the candidate here writes a cache entry of its own: a token,
written only where there is none, so the bench child's copy is told from one written there."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.protocol import BenchRequest, GateRequest
from kernelbrain.runtime import triton_cache
from kernelbrain.runtime.sandbox import Sandbox
from kernelbrain.runtime.triton_cache import compiled_key

HERE = Path(__file__).resolve().parent
PROBLEM = (HERE / "problems" / "softmax_small.py").read_text()
FORWARD = "def forward(self, x: torch.Tensor) -> torch.Tensor:"
WRITES_ENTRY = (
    (HERE / "candidates" / "good_softmax.py")
    .read_text()
    .replace(
        FORWARD,
        FORWARD
        + "\n        import os, pathlib, uuid\n"
        + "        entry = pathlib.Path(os.environ['TRITON_CACHE_DIR']) / 'kb-entry' / 'token'\n"
        + "        if not entry.exists():\n"
        + "            entry.parent.mkdir(parents=True, exist_ok=True)\n"
        + "            entry.write_text(uuid.uuid4().hex)\n",
    )
)

pytestmark = pytest.mark.needs("bwrap")  # a child's own Triton cache is bubblewrap's


def leftover(box: Sandbox) -> Path:
    """An entry an earlier candidate left in the child's cache."""
    box.start()
    assert box.tmp is not None
    junk = box.tmp / "triton" / "left-by-another" / "kernel.cubin"
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_text("not this candidate's")
    return junk


def test_the_gates_compiled_kernels_reach_the_bench_child_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    # the bench's child kept after its request, to look into (a candidate from outside's is stopped)
    gatekeeper, benchmarker = Sandbox("cpu"), Sandbox("cpu", fresh_untrusted=False)
    try:
        junk = leftover(gatekeeper)
        args = {"problem_source": PROBLEM, "cand_source": WRITES_ENTRY, "device": "cpu"}
        assert gatekeeper.call(GateRequest(**args, seeds=3), timeout_s=120)[0].passed
        kept = tmp_path / "compiled" / compiled_key(WRITES_ENTRY)
        token = (kept / "kb-entry" / "token").read_text()
        assert not (kept / junk.parent.name).exists()  # emptied before the trial: nothing of another's

        junk = leftover(benchmarker)
        benchmarker.call(BenchRequest(**args, which="smallest", repeats=2, warmup=1), timeout_s=300)
        assert benchmarker.tmp is not None
        assert (benchmarker.tmp / "triton" / "kb-entry" / "token").read_text() == token
        assert not junk.exists()
    finally:
        gatekeeper.close()
        benchmarker.close()


def test_a_failed_gate_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    wrong = WRITES_ENTRY.replace("return y", "return y.zero_()")
    assert wrong != WRITES_ENTRY
    box = Sandbox("cpu")
    try:
        args = {"problem_source": PROBLEM, "cand_source": wrong, "device": "cpu", "seeds": 3}
        assert box.call(GateRequest(**args), timeout_s=120)[0].category == "mismatch"
        assert not (tmp_path / "compiled" / compiled_key(wrong)).exists()
    finally:
        box.close()


def _forward_with(code: str) -> str:
    body = "".join(f"\n        {line}" for line in code.strip().splitlines())
    return (HERE / "candidates" / "good_softmax.py").read_text().replace(FORWARD, FORWARD + body)


# entries made through Triton's own cache manager (the one the sandbox names), as a compile makes them
PUTS_ENTRY = _forward_with("""
import uuid
from triton.runtime.cache import get_cache_manager
entry = get_cache_manager("5ab1e" * 8)
if entry.get_file("token") is None:
    entry.put(uuid.uuid4().hex, "token")
""")
READS_ENTRY = _forward_with("""
import os, pathlib
from triton.runtime.cache import get_cache_manager
found = get_cache_manager("5ab1e" * 8).get_file("token")
seen = pathlib.Path(os.environ["TRITON_CACHE_DIR"]) / "kb-seen"
seen.mkdir(parents=True, exist_ok=True)
(seen / "token").write_text(pathlib.Path(found).read_text() if found else "none")
try:
    pathlib.Path(found or "/nonexistent").write_text("replaced")
    (seen / "write").write_text("written")
except OSError:
    (seen / "write").write_text("refused")
""")


def gate(box: Sandbox, source: str, own_code: bool) -> bool:
    request = GateRequest(problem_source=PROBLEM, cand_source=source, device="cpu", seeds=3)
    return box.call(request, timeout_s=120, own_code=own_code)[0].passed


def test_what_kbs_own_code_compiled_is_read_by_every_child_and_written_by_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    monkeypatch.setattr(triton_cache, "SHARED", tmp_path / "shared")
    # the reader's child kept after its request, to look into (a candidate from outside's is stopped)
    writer, reader = Sandbox("cpu"), Sandbox("cpu", fresh_untrusted=False)
    try:
        assert gate(writer, PUTS_ENTRY, own_code=True)
        (shared,) = (tmp_path / "shared").glob("*/token")
        token = shared.read_text()
        assert len(token) == 32

        assert gate(reader, READS_ENTRY, own_code=False)  # a candidate from outside, in a fresh child
        assert reader.tmp is not None
        seen = reader.tmp / "triton" / "kb-seen"
        assert (seen / "token").read_text() == token  # found behind its own (emptied) cache
        assert (seen / "write").read_text() == "refused"  # read-only where it is
        assert shared.read_text() == token
        assert not list((tmp_path / "shared").glob("kb-seen*"))  # what it compiled stays its own
    finally:
        writer.close()
        reader.close()


def test_a_child_that_ran_a_candidate_from_outside_shares_nothing_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    monkeypatch.setattr(triton_cache, "SHARED", tmp_path / "shared")
    box = Sandbox("cpu", fresh_untrusted=False)  # a child that ran a candidate from outside, kept
    try:
        outside = (HERE / "candidates" / "good_softmax.py").read_text()
        assert gate(box, outside, own_code=False)
        assert gate(box, PUTS_ENTRY, own_code=True)  # same process: the candidate from outside ran in it
        assert list((tmp_path / "compiled" / compiled_key(PUTS_ENTRY)).glob("*/token"))  # its own, kept
        assert not list((tmp_path / "shared").glob("*/token"))

        box.close()  # a fresh process, that runs kb's own code alone
        assert gate(box, PUTS_ENTRY, own_code=True)
        assert list((tmp_path / "shared").glob("*/token"))
    finally:
        box.close()


def test_a_bench_shares_what_it_compiled_not_what_was_brought_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    monkeypatch.setattr(triton_cache, "SHARED", tmp_path / "shared")
    gatekeeper, benchmarker = Sandbox("cpu", fresh_untrusted=False), Sandbox("cpu")
    other_key = PUTS_ENTRY.replace('"5ab1e" * 8', '"c0de" * 10')
    assert other_key != PUTS_ENTRY
    try:
        # gated in a child that ran code from outside first: its entry is kept for its benches, not shared
        assert gate(gatekeeper, (HERE / "candidates" / "good_softmax.py").read_text(), own_code=False)
        assert gate(gatekeeper, PUTS_ENTRY, own_code=True)
        bench = {"problem_source": PROBLEM, "device": "cpu", "which": "smallest", "repeats": 2, "warmup": 1}
        request = BenchRequest(**bench, cand_source=PUTS_ENTRY)
        benchmarker.call(request, timeout_s=300, own_code=True)
        assert not list((tmp_path / "shared").glob("*/token"))  # brought to the bench child, not its own

        benchmarker.call(BenchRequest(**bench, cand_source=other_key), timeout_s=300, own_code=True)
        assert len(list((tmp_path / "shared").glob("*/token"))) == 1  # compiled there: shared
    finally:
        gatekeeper.close()
        benchmarker.close()


def test_a_cache_folder_a_child_turned_into_a_link_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker (root) copies a child's cache after a passing trial: a child that put a link to any
    folder of the host's in its cache's place gets nothing of that folder kept for its next child."""
    monkeypatch.setattr(triton_cache, "COMPILED", tmp_path / "compiled")
    private = tmp_path / "root-only"
    private.mkdir()
    (private / "secret").write_text("s3cret")
    child = tmp_path / "child"
    child.mkdir()
    (child / "triton").symlink_to(private)
    triton_cache.keep_compiled(child / "triton", "source")
    assert not (tmp_path / "compiled").exists() or not any((tmp_path / "compiled").rglob("secret"))
    (child / "triton").unlink()
    (child / "triton").mkdir()
    (child / "triton" / "kernel.bin").write_text("k")
    triton_cache.keep_compiled(child / "triton", "source")  # a real folder is still kept
    assert (tmp_path / "compiled" / compiled_key("source") / "kernel.bin").read_text() == "k"
