"""Where one rung-0 bench of a template candidate spends its time: the bench op run in this process
(no sandbox) on the problem's first round-0 candidate, once to compile, then again under cProfile.
Prints the bench's own steps and the functions with the most time.

    python3 tools/bench_profile.py benchmarks/problems/softmax.py [--device cuda] [--top 25]
        [--which smallest|primary|all]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path

from kernelbrain.child.analysis import analyse
from kernelbrain.child.timing import bench
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.generators import get


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--which", default="smallest", help="the rung's shapes: smallest, primary or all")
    args = ap.parse_args()
    source = args.problem.read_text()
    analysis = ProblemAnalysed(**analyse(source, args.device), families=[])
    candidate = get("expert").first_round(analysis, problem_source=source)[0].source
    bench(source, candidate, args.device, args.which, 10, 3)  # compiles, warms the caches
    profiler = cProfile.Profile()
    profiler.enable()
    reply = bench(source, candidate, args.device, args.which, 10, 3)
    profiler.disable()
    steps = {k: round(v, 4) for k, v in reply["steps"].items()}
    print("steps:", steps, "calls:", reply["shapes"][0]["calls"])
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(args.top)
        print(out.getvalue()[-6000:])


if __name__ == "__main__":
    main()
