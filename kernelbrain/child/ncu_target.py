"""The program Nsight Compute profiles: `python -m kernelbrain.child.ncu_target PROBLEM CANDIDATE`.

Warms the candidate up at the primary shape, then runs one forward between cudaProfilerStart and
cudaProfilerStop, so `ncu --profile-from-start off` sees exactly the kernels of one call. Between the two
it says it is ready (a file `ready` in its folder) and waits for `go`: the worker holds the GPU alone
from then (child/profile.py). Before it builds anything on the GPU it says so (`device`) and waits for
`on`: the worker holds the GPU's lock shared from then, and held none while ncu started and this imported
(tens of seconds a profile in session 32's H100 sweep, every timing waiting behind it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernelbrain.core import nsight


def main(problem_path: str, candidate_path: str) -> None:
    from kernelbrain.child.loading import Problem, build, load_module

    problem = Problem(Path(problem_path).read_text())
    cand = load_module(Path(candidate_path).read_text(), "cand")
    shape = problem.ladder_shapes("cuda", "primary")[0]
    nsight.reaches_device(Path.cwd())
    _, new = build(problem, cand, shape, "cuda")
    inputs = problem.inputs(shape, 11, "cuda")
    with torch.no_grad():
        for _ in range(3):  # compile and autotune outside the profiled range
            new(*inputs)
        torch.cuda.synchronize()
        nsight.ready(Path.cwd())
        torch.cuda.profiler.start()
        new(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
