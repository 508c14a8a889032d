"""The documentation cannot drift from the code: the event catalogue in docs/architecture.md is what
tools/event_catalogue.py prints from the models; the source tree there and in README.md is what
tools/source_tree.py prints from the tree, with every module and folder; every `kb` command and flag the
docs show exists;
every option of every command is documented in docs/configuration.md; every KB_* variable named is
read by the code; the README's two set-up commands are the ones .ci/run runs; and the README names
every template family."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import click
import pytest

from kernelbrain.cli import main as kb_cli
from kernelbrain.core import events
from tools import event_catalogue as ec
from tools import source_tree as st

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"
# flags the docs name that belong to other programs, and the file that must define each
FOREIGN = {
    "--index-url": None,  # pip's
    "--job-name": None,  # Slurm's sbatch (docs/multi-host.md)
    "--array": None,
    "--gres": None,
    "--time": None,
    "--export": None,
    "--all-shapes": "kernelbrain/views/export_harness.py",  # the exported kernel.py's harness
    "--seeds": "kernelbrain/views/export_harness.py",
    "--repeats": "kernelbrain/views/export_harness.py",
    "--warmup": "kernelbrain/views/export_harness.py",
    "--csv": "kernelbrain/core/nsight.py",  # ncu's, as kb runs it
    "--clock-control": "kernelbrain/core/nsight.py",
    "--die-with-parent": "kernelbrain/runtime/isolation.py",  # bubblewrap's, as the sandbox runs it
    "--write": "tools/event_catalogue.py",
    "--knobs": "tools/gpu_template_check.py",  # a tuning variant for the GPU check
    "--extra": "tools/attn_check.py",
    "--host": "tools/kernel_breakdown.py",  # host time a call
    "--kernelbench": "tools/kernelbench_sweep.py",  # the KernelBench sweep
    "--levels": "tools/kernelbench_sweep.py",
    "--time-limit-s": "tools/kernelbench_sweep.py",
    "--gpus": "tools/scaling_bench.py",  # the scaling measurement (docs/multi-gpu.md)
    "--timing-noise": "tools/scaling_bench.py",
    "--out": "tools/scaling_bench.py",
}
LONG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHORT = re.compile(r"(?<![\w-])-[a-zA-Z](?![\w-])")
KB_CALL = re.compile(r"(?:^|[\s/(])kb\s+(--[a-z-]+|[a-z]+)(.*)$")


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


COMMANDS: dict[str | None, set[str]] = {name: _options(c) for name, c in kb_cli.commands.items()}
COMMANDS[None] = {"--help", "--version"}  # `kb --help`, `kb --version`


FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```", re.M | re.S)


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced code block, an indented one (in a list item) dedented."""
    return [(m[2], [line.removeprefix(m[1]) for line in m[3].splitlines()]) for m in FENCE.finditer(text)]


def kb_invocations(text: str) -> list[str]:
    """Every `kb ...` command line the text shows: sh blocks (comments dropped, indented continuation
    lines joined), `$ ` lines of text blocks, and inline code spans that start with `kb `."""
    calls: list[str] = []
    for lang, lines in _blocks(text):
        for line in lines:
            if lang == "sh":
                line = line.split("#", 1)[0]
                if line[:1].isspace() and calls and line.strip():
                    calls[-1] += " " + line.strip()
                    continue
            elif line.startswith("$ "):
                line = line[2:]
            else:
                continue
            if KB_CALL.search(line):
                calls.append(line)
    prose = FENCE.sub("", text)
    calls += [
        span for span in re.findall(r"`([^`\n]+)`", prose) if span.startswith("kb ") and KB_CALL.search(span)
    ]
    return calls


def _check_call(line: str) -> list[str]:
    m = KB_CALL.search(line)
    assert m is not None
    word, rest = m[1], m[2]
    if word.startswith("--"):
        name, rest = None, f"{word} {rest}"
    else:
        name = word
    if name not in COMMANDS:
        return [f"`{line.strip()}`: kb has no command {name!r}"]
    allowed = COMMANDS[name] | {"--help"}
    return [
        f"`{line.strip()}`: kb {name or ''} has no option {flag}"
        for flag in LONG.findall(rest) + SHORT.findall(rest)
        if flag not in allowed
    ]


def test_the_catalogue_in_architecture_md_is_the_one_the_models_give():
    doc = ec.DOC.read_text(encoding="utf-8")
    assert ec.embedded(doc) == ec.catalogue(), (
        "docs/architecture.md's event catalogue is stale: run `python tools/event_catalogue.py --write`"
    )


def test_the_catalogue_has_every_event_and_field_with_its_writer():
    text = ec.catalogue()
    sections = dict(re.findall(r"^### (\w+) \(v\d+\)\n(.*?)(?=^### )", text + "### end", flags=re.M | re.S))
    assert list(sections) == list(events.EVENT_TYPES)
    for name, cls in events.EVENT_TYPES.items():
        assert f"### {name} (v{cls.VERSION})" in text
        for field in cls.model_fields:
            assert f"| `{field}` |" in sections[name], (name, field)
        assert re.search(r"^Written by: .+\.", sections[name], re.M), name
    for nested in (events.RunConfig, events.RungSpec, events.ShapeTiming):
        assert f"`{nested.__name__}`:" in text
    # no row without a meaning: every field is commented in events.py or explained in NOTES
    assert "|  |" not in text


def test_writers_are_read_from_where_the_code_builds_each_event():
    who = ec.writers()
    assert set(who) == set(events.EVENT_TYPES)
    assert who["RunStarted"] == ["`kb run`"] and who["RunResumed"] == ["`kb resume`"]
    assert who["RungBenchmarked"] == ["benchmarker"] and who["Adjudicated"] == ["benchmarker"]
    assert who["GatePassed"] == who["GateFailed"] == ["gatekeeper"]
    assert who["ProblemAnalysed"] == who["CandidateProposed"] == ["generator"]
    for decision in events.DECISION_TYPES:
        assert who[decision] == ["scheduler"], decision


def test_write_refreshes_a_stale_catalogue_and_keeps_the_rest(tmp_path):
    doc = tmp_path / "architecture.md"
    shutil.copy(ec.DOC, doc)
    original = doc.read_text(encoding="utf-8")
    stale = re.sub(r"### RunStarted \(v\d+\)", "### RunStarted (v0)", original)
    assert stale != original
    doc.write_text(stale, encoding="utf-8")
    ec.write(doc)
    assert doc.read_text(encoding="utf-8") == original


def test_the_source_tree_in_the_docs_is_the_one_the_tree_gives():
    stale = "run `python tools/source_tree.py --write`"
    assert st.embedded(st.DOC.read_text(encoding="utf-8")) == st.layout(), f"architecture.md: {stale}"
    assert st.embedded(st.README.read_text(encoding="utf-8"), st.README) == st.layout(short=True), (
        f"README.md: {stale}"
    )


def _tree_entries(text: str) -> dict[str, list[str]]:
    """folder path -> the words of its entry, read back from the layout by indentation."""
    entries: dict[str, list[str]] = {}
    path: list[str] = []
    for line in text.splitlines()[1:-1]:
        head = line[: st.COLUMN].rstrip()
        if head.strip():
            depth = (len(head) - len(head.lstrip())) // 2
            path = [*path[:depth], head.strip().rstrip("/")]
            entries["/".join(path)] = []
        entries["/".join(path)] += line[st.COLUMN :].split()
    return entries


def test_every_module_and_folder_of_the_package_is_in_the_source_tree():
    """Read from the tree apart from the generator: every module, data file and folder under
    kernelbrain/, store/ and migrations/ is named in its folder's entry in docs/architecture.md."""
    entries = _tree_entries(st.embedded(st.DOC.read_text(encoding="utf-8")))
    missing = []
    for top in ("kernelbrain", "store", "migrations"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.name.startswith(".") or p.suffix == ".pyc" or p.name in ("__init__.py", "__pycache__"):
                continue
            if not (p.parent / "__init__.py").exists():
                continue  # a folder that is no package (migrations/postgres/) is named, not its files
            folder = p.parent.relative_to(ROOT).as_posix()
            if p.is_dir() and (p / "__init__.py").exists():
                if p.relative_to(ROOT).as_posix() not in entries:
                    missing.append(f"{p.relative_to(ROOT)}/ (no entry)")
            elif p.is_dir() and not any(f.is_file() for f in p.rglob("*") if "__pycache__" not in f.parts):
                continue  # a leftover of a move, bytecode only
            elif (p.name + "/" if p.is_dir() else p.name) not in entries.get(folder, []):
                missing.append(str(p.relative_to(ROOT)))
    assert not missing, f"missing from docs/architecture.md's source tree: {missing}"
    assert entries["kernelbrain/child"][:2] == ["Runs", "inside"]
    assert "runs" in entries["kernelbrain/runtime/roles"] and "worker.py" in entries["kernelbrain/runtime"]


def test_a_folder_says_what_lives_there_in_a_sentence_or_a_clause():
    assert st.summary("Candidate generators. `get(name)` builds one.\n\nMore.") == (
        "Candidate generators. `get(name)` builds one."
    )
    long = (
        "Pooling: max and average over axes (" + "x, " * 60 + "y), with stride, padding and more words. Next."
    )
    assert st.summary(long) == "Pooling: max and average over axes."
    assert len(st.summary("word, " * 80 + "end.")) <= st.LONGEST + 1


def test_write_refreshes_a_stale_source_tree_and_keeps_the_rest(tmp_path):
    doc, readme = tmp_path / "architecture.md", tmp_path / "README.md"
    shutil.copy(st.DOC, doc)
    shutil.copy(st.README, readme)
    originals = doc.read_text(encoding="utf-8"), readme.read_text(encoding="utf-8")
    for path in (doc, readme):
        stale = path.read_text(encoding="utf-8").replace("  views/", "  viewz/")
        assert stale != path.read_text(encoding="utf-8")
        path.write_text(stale, encoding="utf-8")
    st.write(doc, readme)
    assert (doc.read_text(encoding="utf-8"), readme.read_text(encoding="utf-8")) == originals


def test_every_script_of_tools_and_experiments_named_exists():
    """A tool moved to experiments/ (or gone) leaves no stale path in the docs, tests, tools or code.
    Result records under benchmarks/results/ may name a script where it was then."""
    script = re.compile(r"(?<![\w/])(?:tools|experiments)/\w+\.(?:py|sh)\b")
    named = [
        *DOCS,
        *(
            p
            for d in ("tests", "tools", "experiments", "kernelbrain", "store")
            for p in (ROOT / d).rglob("*")
        ),
    ]
    stale = [
        f"{p.relative_to(ROOT)}: {m}"
        for p in named
        if p.is_file() and p.suffix in (".md", ".py", ".sh")
        for m in script.findall(p.read_text(encoding="utf-8"))
        if not (ROOT / m).exists() and m != "tools/x.py"  # device_env.sh's example of a tool
    ]
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_kb_command_and_flag_shown_exists(path):
    calls = kb_invocations(path.read_text(encoding="utf-8"))
    problems = [p for line in calls for p in _check_call(line)]
    assert not problems, "\n".join(problems)


def test_the_invocation_parser_sees_commands_and_catches_a_wrong_flag():
    text = "```sh\nkb run p.py --db x.db \\\n   --bogus-flag 1  # a comment\n```\nand `kb frobnicate RUN`\n"
    calls = kb_invocations(text)
    assert len(calls) == 2
    assert _check_call(calls[0]) == [f"`{calls[0].strip()}`: kb run has no option --bogus-flag"]
    assert _check_call(calls[1]) == ["`kb frobnicate RUN`: kb has no command 'frobnicate'"]
    readme = kb_invocations((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(readme) > 20 and any("--external-workers" in c for c in readme)


def test_every_flag_named_anywhere_belongs_to_kb_or_to_a_named_program():
    known = set().union(*COMMANDS.values())
    for path in DOCS:
        for flag in set(LONG.findall(path.read_text(encoding="utf-8"))) - known:
            assert flag in FOREIGN, f"{path.name} names {flag}, which no kb command has"
            owner = FOREIGN[flag]
            if owner is not None:
                assert f'"{flag}"' in (ROOT / owner).read_text(encoding="utf-8"), (flag, owner)


def test_configuration_md_documents_every_option_of_every_command():
    text = CONFIGURATION.read_text(encoding="utf-8")
    missing = [
        f"kb {name} {param.opts}"
        for name, cmd in kb_cli.commands.items()
        for param in cmd.params
        if isinstance(param, click.Option)
        and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in param.opts)
    ]
    assert not missing, f"docs/configuration.md does not mention: {missing}"


def test_every_kb_variable_named_is_read_by_the_code():
    code = "\n".join(
        p.read_text(encoding="utf-8") for d in ("kernelbrain", "store") for p in (ROOT / d).rglob("*.py")
    )
    for path in DOCS:
        for var in set(re.findall(r"\bKB_[A-Z_]+[A-Z]\b", path.read_text(encoding="utf-8"))):
            assert var in code, f"{path.name} names {var}, which no code reads"


def test_the_readme_commands_are_the_ones_ci_runs():
    """The set-up's two commands are the README's first two sh blocks, and .ci/run runs them as they read
    there, under CI=true (where a test whose piece is missing fails: tests/needs.py)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [lines for lang, lines in _blocks(readme) if lang == "sh"]
    install, test = blocks[0], blocks[1]
    assert install == ["./install.sh && .venv/bin/kb run benchmarks/problems/softmax.py"]
    assert test == ["./test.sh"]
    ci = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")
    ]
    assert ci[-2:] == [install[0], test[0]]
    assert "export CI=true" in ci
    for script in ("install.sh", "test.sh", ".ci/run"):
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


def test_the_readme_names_every_template_family():
    from kernelbrain.templates import FAMILIES

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("The offline templates cover these op families") :]
    section = section[: section.index("\n## ")]
    missing = [f.FAMILY for f in FAMILIES if f"`{f.FAMILY}`" not in section]
    assert not missing, f"README.md's list of op families lacks {missing}"
