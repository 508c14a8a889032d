"""Cheats on precision and range, and on the sandbox's resources, through real sandboxed children.

Precision and range: an output of a cheaper dtype than the reference's (judged, before, at that dtype's
tolerance), a softmax offset by a constant or by the max of a few columns instead of its row max (it
passed draws of |x| <= 100). Each fails with its category; its honest twin passes.

Resources: a child that allocates past its memory cap (private memory: RLIMIT_DATA; shared memory: its
cgroup's memory.max, where the machine has cgroup v2 to give), forks past its process cap, or fills its
/tmp or its own folder fails as the candidate's fault, with its category, in a sandbox of small caps;
the child runs as an unprivileged uid (where kb is root) and sees no root-only file of /etc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernelbrain.child.draws import variant
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime import isolation, limits
from kernelbrain.runtime.sandbox import Sandbox, SandboxFault
from tests.red_team.test_gate_cheats import SOFTMAX, softmax_cheat

OFFSET = """
@triton.jit
def softmax_shifted(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr, FIRST: tl.constexpr):
    # the shift is a constant (FIRST == 0) or the max of the row's FIRST first columns, not its max
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    if FIRST == 0:
        m = 60.0
    else:
        m = tl.max(tl.where(cols < FIRST, x, -float("inf")), axis=0)
    e = tl.exp(x - m)
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


def shifted(x, first):
    y = torch.empty_like(x)
    softmax_shifted[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), FIRST=first)
    return y

"""

HONEST = "return kernel_softmax(x, torch.empty_like(x))"

# name: (candidate source, category, words the detail must hold)
PRECISION = {
    "an fp16 output for an fp32 problem": (
        softmax_cheat("return kernel_softmax(x, torch.empty_like(x)).half()"),
        "mismatch",
        "output 0 is float16; the reference returns float32",
    ),
    "a bfloat16 output for an fp32 problem": (
        softmax_cheat("return kernel_softmax(x, torch.empty_like(x)).to(torch.bfloat16)"),
        "mismatch",
        "output 0 is bfloat16; the reference returns float32",
    ),
    "exp(x - 60) instead of the row max": (softmax_cheat("return shifted(x, 0)", top=OFFSET), "nan", "NaN"),
    "the max of the row's first 16 columns": (
        softmax_cheat("return shifted(x, 16)", top=OFFSET),
        "nan",
        "NaN",
    ),
}


def _gate(box: Sandbox, source: str) -> dict:
    """The gate's verdict, a fault of the candidate's child (SandboxFault, as the gatekeeper records it)
    included."""
    args = {"problem_source": SOFTMAX, "cand_source": source, "device": "cpu", "seeds": 3}
    try:
        return box.call(GateRequest(**args), timeout_s=300)[0].model_dump()
    except SandboxFault as f:
        return {"passed": False, "category": f.category, "detail": f.detail}


@pytest.mark.parametrize("name", sorted(PRECISION))
def test_a_precision_or_range_cheat_is_caught(box: Sandbox, name: str) -> None:
    source, category, words = PRECISION[name]
    r = _gate(box, source)
    assert (r["passed"], r["category"]) == (False, category), (name, r)
    assert words in r["detail"], (name, r["detail"])


def test_the_shifted_softmax_passed_the_old_draws_and_its_honest_twin_passes(box: Sandbox) -> None:
    """On the problem's own draw and the old wide one (|x| <= 100) exp(x - 60) is as good as the row max:
    only the wider draws show it. Shifted by the whole row's max, the same kernel passes the gate."""
    torch.manual_seed(0)
    for x in (torch.rand(8, 200), variant([torch.rand(8, 200)], 2, span=100.0)[0]):
        e = torch.exp(x - 60)
        truth = torch.softmax(x.double(), 1)
        assert torch.allclose((e / e.sum(1, keepdim=True)).double(), truth, rtol=1e-4, atol=1e-4)
        # and an fp16 output is within fp16's tolerance (1e-2): refused for its dtype, not its error
        assert torch.allclose(torch.softmax(x, 1).half().double(), truth, rtol=1e-2, atol=1e-2)
    assert _gate(box, softmax_cheat("return shifted(x, x.shape[1])", top=OFFSET))["passed"] is True


# the resource cheats run in a sandbox of small caps; each returns an honest softmax if it got through
TIGHT = {"KB_SANDBOX_MEMORY_GIB": "2", "KB_SANDBOX_PROCESSES": "64", "KB_SANDBOX_FOLDER_GIB": "0.0625"}
RESOURCES = {
    "memory past the cap": ("torch.empty(3 << 30, dtype=torch.uint8)", "runtime", "memory"),
    "processes past the cap": (
        "import os\n"
        "pids = []\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        pids.append(pid)\n"
        "finally:\n"
        "    for pid in pids:\n"
        "        os.kill(pid, 9)\n"
        "        os.waitpid(pid, 0)",
        "runtime",
        "Resource temporarily unavailable",
    ),
    # shared memory, which RLIMIT_DATA does not count: only a cgroup's memory.max holds it
    "shared memory past the cap": (
        "import mmap, os\n"
        "fd = os.memfd_create('fill')\n"
        "os.ftruncate(fd, 3 << 30)\n"
        "pages = mmap.mmap(fd, 3 << 30)\n"
        "for at in range(0, 3 << 30, 1 << 24):\n"
        "    pages[at : at + (1 << 24)] = bytes(1 << 24)",
        "runtime",
        "memory",
    ),
    "its /tmp filled": (
        "with open('/tmp/fill', 'wb') as f:\n    for _ in range(96):\n        f.write(bytes(1 << 20))",
        "runtime",
        "No space left on device",
    ),
    "its own folder filled": (
        "import os\nwith open(os.path.join(os.environ['HOME'], 'fill'), 'wb') as f:\n"
        "    for _ in range(96):\n        f.write(bytes(1 << 20))",
        "policy",
        "past the sandbox's cap",
    ),
}


@pytest.fixture(scope="module")
def tight():
    """A CPU sandbox whose children start with small caps (TIGHT), again after a fault too."""
    if isolation.chosen() != "bwrap":
        pytest.skip("the caps on /tmp and on the folder, and the uid, are bubblewrap's")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in TIGHT.items():
            mp.setenv(k, v)
        sb = Sandbox("cpu")
        try:
            yield sb
        finally:
            sb.close()


@pytest.mark.needs("bwrap")
@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_a_resource_cheat_fails_as_the_candidates_fault(tight: Sandbox, name: str) -> None:
    attack, category, words = RESOURCES[name]
    if name == "processes past the cap" and os.geteuid() != 0:
        pytest.skip("the process cap holds where the children have a uid of their own (kb is root)")
    if name == "shared memory past the cap" and limits.cgroup_parent() is None:
        pytest.skip(
            f"shared memory is capped by a cgroup v2 memory.max, not here (cgroup {limits.cgroup_version()})"
        )
    r = _gate(tight, softmax_cheat(attack + "\n" + HONEST))
    assert (r["passed"], r["category"]) == (False, category), (name, r)
    assert words in r["detail"], (name, r["detail"])
    assert _gate(tight, softmax_cheat(HONEST))["passed"] is True  # nothing lost: the next one is judged


@pytest.mark.needs("bwrap")
def test_the_child_is_unprivileged_and_sees_no_root_only_file(tight: Sandbox) -> None:
    """Its uid and gid are not 0 (kb runs as root here, or as a user), its groups none; /etc holds no
    shadow file and nothing it cannot read."""
    attack = """
import os
paths = [os.path.join(d, f) for d, _, fs in os.walk("/etc") for f in fs]
hidden = [p for p in paths if not os.path.islink(p) and not os.access(p, os.R_OK)]
if 0 in (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) or os.getgroups() or hidden:
    return torch.zeros_like(x)
if any(os.path.exists(p) for p in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh")):
    return torch.zeros_like(x)
"""
    r = _gate(tight, softmax_cheat(attack + HONEST))
    assert r["passed"] is True, r
    if os.geteuid() == 0:  # the attack is real: outside the sandbox, kb itself is root and sees them
        assert Path("/etc/shadow").exists() or Path("/etc/sudoers").exists()
