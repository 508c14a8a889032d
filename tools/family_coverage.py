"""Which offline family takes each KernelBench file, on CPU and without a GPU: the file's analysis (its
traced ops and ATen graph, on the meta device) and the expert generator's choice, or the line it refuses
with. Writes OUT/coverage.md (a table, with the command) and OUT/coverage.json.

    python3 tools/family_coverage.py --kernelbench DIR [--levels 1,2] [--out benchmarks/results/kernelbench]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from kernelbrain.child.analysis import analyse
from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.generators.base import GenerationError
from kernelbrain.generators.expert import ExpertGenerator


def family_of(path: Path) -> str:
    source = path.read_text()
    try:
        analysis = ProblemAnalysed(**analyse(source, "cpu"), families=[])
    except Exception as e:  # the file's own fault, as kb run would say
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    try:
        family, _ = ExpertGenerator().match_family(analysis, problem_source=source)
    except GenerationError as e:
        return f"none: {str(e)[:140]}"
    return family.FAMILY


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True)
    ap.add_argument("--levels", default="1,2")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/kernelbench"))
    args = ap.parse_args()
    found: dict[str, dict[str, str]] = {}
    for level in args.levels.split(","):
        for path in sorted((args.kernelbench / f"level{level}").glob("*.py")):
            found.setdefault(f"level{level}", {})[path.stem] = family_of(path)
            print(f"level{level}/{path.stem}: {found[f'level{level}'][path.stem]}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coverage.json").write_text(json.dumps(found, indent=1))
    lines = [
        "# Offline family coverage: which family takes each file (CPU, no GPU)",
        "",
        f"`python3 tools/family_coverage.py --kernelbench KERNELBENCH --levels {args.levels}`: each file's",
        "analysis on the meta device and the expert generator's choice. A match is not a gate pass nor a",
        "speedup: those are the sweep's (README.md beside this file).",
        "",
    ]
    for level, files in found.items():
        counts = collections.Counter(
            v if not v.startswith(("none", "refused")) else v.split(":")[0] for v in files.values()
        )
        lines += [f"## {level}: {len(files) - counts['none'] - counts['refused']}/{len(files)} matched", ""]
        lines += ["| family | files |", "| --- | --- |"]
        lines += [f"| {k} | {n} |" for k, n in counts.most_common()]
        lines += ["", "| file | family |", "| --- | --- |"]
        lines += [f"| {stem} | {v.replace('|', '/')} |" for stem, v in files.items()]
        lines.append("")
    (args.out / "coverage.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
