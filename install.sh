#!/usr/bin/env bash
# The README's first command: a fresh .venv holding torch and kb with its dev extra (tests, lint).
#
# torch comes first, chosen for this machine. With an NVIDIA GPU: pip's default build. Without one, a
# CPU build, as a CUDA build costs gigabytes and does nothing there: the build pip's configured sources
# resolve to if that is a CPU one (tools/torch_build.py reads pip's own dry-run resolution), else the
# newest +cpu version those sources list (a local wheel), else torch from the PyTorch CPU index
# ($TORCH_CPU_INDEX overrides its URL). The last line says which torch was installed and why.
# Usage: ./install.sh   (PYTHON=python3.12 ./install.sh for another interpreter)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
say() { echo "install.sh: $*"; }

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || { say "kb needs Python >= 3.11 ($PYTHON is $("$PYTHON" -V 2>&1)); set PYTHON" >&2; exit 1; }
rm -rf .venv
"$PYTHON" -m venv .venv
py=.venv/bin/python
pip=(.venv/bin/python -m pip)
# --dry-run --report came with pip 22.2
"$py" -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 2))' \
    || "${pip[@]}" install -q --upgrade 'pip>=22.2'
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# kb's own requirement on torch, from pyproject.toml
spec=$("$py" -c 'import re, tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(next(r for r in d if re.match(r"torch\b", r)))')

resolve() {  # resolve ARGS...: pip's choice of torch for these arguments, as "BUILD VERSION URL N"
    "${pip[@]}" install -qq --dry-run --ignore-installed --report "$work/report.json" "$@" >/dev/null 2>&1 \
        && "$py" tools/torch_build.py report "$work/report.json"
}

gpu=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    gpu="nvidia-smi lists $(nvidia-smi -L | grep -c '^GPU') GPU(s)"
elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    gpu="$(compgen -G '/dev/nvidia[0-9]*' | head -1) exists"
fi

from=()  # where torch comes from, when not pip's default sources
if [ -n "$gpu" ]; then
    want=("$spec")
    why="pip's default build: an NVIDIA GPU is here ($gpu)"
else
    none="no NVIDIA GPU here (no working nvidia-smi, no /dev/nvidia*)"
    read -r build version url nvidia < <(resolve "$spec" || echo "? ? ? 0")
    if [ "$build" = cpu ]; then
        want=("torch==$version")
        why="a CPU build, pip's default here ($url): $none"
    else
        default="pip's default, torch $version, is a CUDA build ($nvidia NVIDIA packages)"
        [ "$build" != "?" ] || default="pip's sources resolve no torch by themselves"
        local_cpu=$("${pip[@]}" index versions torch 2>/dev/null | "$py" tools/torch_build.py newest-cpu || true)
        if [ -n "$local_cpu" ] && read -r build version url nvidia < <(resolve "$spec" "torch==$local_cpu") \
            && [ "$build" = cpu ]; then
            want=("torch==$version")
            why="a CPU build from pip's configured sources ($url): $none, and $default"
        elif read -r build version url nvidia < <(resolve --index-url "$CPU_INDEX" --timeout 20 --retries 1 "$spec") \
            && [ "$build" = cpu ]; then
            want=("torch==$version")
            from=(--index-url "$CPU_INDEX")
            why="a CPU build from the PyTorch CPU index ($CPU_INDEX): $none, and $default"
        else
            want=("$spec")
            why="pip's default: $none, but pip's sources list no CPU build and $CPU_INDEX did not answer;"
            why="$why kb runs on it, but a CUDA build takes GBs (TORCH_CPU_INDEX=URL names a CPU index)"
        fi
    fi
fi

"${pip[@]}" install -q "${from[@]}" "${want[@]}"
"${pip[@]}" install -q -e '.[dev]'
# the editable install leaves kb's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set no
# process writes them: every kb process and sandboxed child would compile them again (0.1 s of CPU each)
"$py" -m compileall -q kernelbrain store tests tools >/dev/null || true # a speed-up only
installed=$("$py" -c 'import torch; print(torch.__version__, f"(CUDA {torch.version.cuda})" if torch.version.cuda else "(CPU)")')
say "kb and torch $installed in .venv ($(du -sh .venv | cut -f1)): $why"
