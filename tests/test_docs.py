"""README.md and docs/*.md stay true to the code.

- Commands on bundled files (a path under ``fixtures/``, or none: ``tfmigrate rules``) run, in the
  order each document shows them, in a scratch copy of the fixtures; the output a ``console``
  block shows under a command must be what it prints (``...`` alone on a line skips lines, a line
  ending in ``...`` is a prefix). Commands that train (verify, convert-checkpoint) run in the slow
  test only.
- Commands on a user's own files are parsed against the command line's real options (an unknown
  option, a missing value or a bad choice fails), as are the repository's scripts (``bench/``)
  against their ``--help`` and ``make`` against the Makefile's targets.
- Every link to a local file resolves, anchors included; configuration examples load.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer.main
from conftest import legacy_cache_dir, run_cli

from tfmigrate.cli import app
from tfmigrate.registry import rule_by_code, unknown_selectors

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOC_IDS = [str(d.relative_to(REPO)) for d in DOCS]
COMMANDS = typer.main.get_command(app).commands  # the app has subcommands: a group
TRAINING = {"verify", "convert-checkpoint"}
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
SEPARATORS = {"&&", "||", "|", ";"}
REDIRECTS = re.compile(r"^\d*(>>?|<)(&\d+)?$")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class Block:
    info: str
    body: list[str]
    line: int  # of the opening fence


@dataclass
class Command:
    doc: Path
    line: int
    text: str
    shown: list[str] = field(default_factory=list)  # the output a console block shows under it

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}: {self.text}"


def blocks(text: str) -> list[Block]:
    """Fenced code blocks (also indented ones, inside list items)."""
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^(\s*)```(\S*)\s*$", lines[index])
        if opening is None:
            index += 1
            continue
        indent, info, start = opening.group(1), opening.group(2), index
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line)
            index += 1
        found.append(Block(info, body, start + 1))
        index += 1
    return found


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # No closing quotation: the command goes on on the next line
        return True
    return False


def _joined(body: list[str], start: int) -> list[tuple[int, str]]:
    """Lines with backslash continuations and multi-line quotes joined, each with its line
    number in the file."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, line in enumerate(body, start=start):
        if pending is None:
            pending = (offset, line)
        elif pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip() + " " + line.strip())
        else:
            pending = (pending[0], pending[1] + "\n" + line)
        if pending[1].endswith("\\") or _open_quote(pending[1]):
            continue
        out.append(pending)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def _yaml_runs(block: Block) -> list[tuple[int, str]]:
    """The ``run:`` commands of a GitHub Actions workflow block."""
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load("\n".join(block.body))
    if not isinstance(data, dict) or "jobs" not in data:
        return []
    runs = []
    for job in data["jobs"].values():
        for step in job.get("steps", []):
            for line in str(step.get("run", "")).splitlines():
                number = next(
                    (n for n, text in enumerate(block.body, block.line + 1) if line in text),
                    block.line,
                )
                runs.append((number, line))
    return runs


def commands(doc: Path) -> list[Command]:
    """Every command line the document shows, in order, with the output shown under it."""
    found: list[Command] = []
    for block in blocks(doc.read_text(encoding="utf-8")):
        if block.info == "yaml":
            found += [Command(doc, n, text) for n, text in _yaml_runs(block)]
        if block.info not in SHELL_BLOCKS:
            continue
        current: Command | None = None
        for number, line in _joined(block.body, block.line + 1):
            if block.info == "console":
                if line.startswith("$ "):
                    current = Command(doc, number, line[2:])
                    found.append(current)
                elif current is not None:
                    current.shown.append(line.rstrip())
            elif line.strip() and not line.lstrip().startswith("#"):
                found.append(Command(doc, number, line.strip()))
    return found


def segments(text: str) -> list[list[str]]:
    """The simple commands of a shell line: split at ``&&``, ``|``, ..., redirections dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    parts: list[list[str]] = [[]]
    tokens = list(lexer)
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in SEPARATORS:
            parts.append([])
        elif REDIRECTS.match(token):
            skip = not token.endswith(("&1", "&2"))
        elif token == "&":
            continue
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


@dataclass
class Parsed:
    name: str
    args: list[str]
    paths: list[str]  # the positional path arguments


def parse_tfmigrate(argv: list[str], where: str) -> Parsed:
    """Parse ``tfmigrate SUB ARGS`` with the real command's parser; fail the test if it would
    not parse."""
    assert argv, f"{where}: no subcommand"
    name, args = argv[0], argv[1:]
    assert name in COMMANDS, f"{where}: no command {name!r} (commands: {sorted(COMMANDS)})"
    command = COMMANDS[name]
    try:
        context = command.make_context(name, list(args))
    except Exception as error:  # click's UsageError/BadParameter, vendored by typer
        pytest.fail(f"{where}: {type(error).__name__}: {error}")
    paths: list[str] = []
    for param in command.params:
        if type(param).__name__ != "TyperArgument":
            continue
        value = context.params.get(param.name)
        values = value if isinstance(value, list | tuple) else [value]
        paths += [str(v) for v in values if isinstance(v, Path)]
    for option in ("select", "ignore"):
        selectors = [s for v in context.params.get(option) or () for s in str(v).split(",")]
        assert not unknown_selectors(selectors), f"{where}: unknown rule codes {selectors}"
    if name == "explain":
        assert rule_by_code(context.params["code"]), f"{where}: no rule {context.params['code']}"
    return Parsed(name, args, paths)


def _tfmigrate_argv(tokens: list[str]) -> list[str] | None:
    if Path(tokens[0]).name == "tfmigrate":
        return tokens[1:]
    if Path(tokens[0]).name.startswith("python") and tokens[1:3] == ["-m", "tfmigrate"]:
        return tokens[3:]
    return None


def _script(tokens: list[str]) -> Path | None:
    """``python bench/x.py ...``: the repository's own script (None: not one of ours)."""
    if Path(tokens[0]).name.startswith("python") and len(tokens) > 1:
        script = REPO / tokens[1]
        if tokens[1].endswith(".py") and not tokens[1].startswith("/") and script.is_file():
            return script
    return None


def bundled(parsed: Parsed) -> bool:
    """Runs on what the repository ships (or on no file at all)."""
    if not parsed.paths:
        return parsed.name in {"rules", "explain"}
    # the other paths are what earlier commands of the same document wrote (--out, --report)
    return any(p.startswith("fixtures/") for p in parsed.paths)


def _all_commands() -> list[Command]:
    return [c for doc in DOCS for c in commands(doc)]


def test_the_documents_show_commands():
    """The extraction itself: a test that found nothing to check would pass on anything."""
    found = commands(REPO / "README.md")
    assert any(c.text.startswith("tfmigrate scan fixtures/") and c.shown for c in found)
    assert any(c.text.startswith("make demo") for c in found)
    assert segments("tfmigrate rewrite a/ > m.diff && git apply m.diff") == [
        ["tfmigrate", "rewrite", "a/"],
        ["git", "apply", "m.diff"],
    ]


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_tfmigrate_commands_use_real_options(doc):
    for command in commands(doc):
        for tokens in segments(command.text):
            argv = _tfmigrate_argv(tokens)
            if argv is not None:
                parse_tfmigrate(argv, command.where)


def test_bad_options_are_caught():
    for argv in (
        ["scan", "repo/", "--bogus"],
        ["rewrite", "repo/", "--strategy", "both"],
        ["verify", "a.py", "b.py", "--replicas"],
        ["explain", "TFM999"],
        ["scan", "repo/", "--select", "TFM9"],
    ):
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            parse_tfmigrate(argv, "example")


def _makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_make_targets_and_repository_scripts_exist_with_their_options(doc):
    targets = _makefile_targets()
    helps: dict[Path, str] = {}
    for command in commands(doc):
        for tokens in segments(command.text):
            if tokens[0] == "make":
                missing = [t for t in tokens[1:] if "=" not in t and t not in targets]
                assert not missing, f"{command.where}: no make target {missing}"
            script = _script(tokens)
            if script is None:
                if Path(tokens[0]).name.startswith("python") and tokens[1:2]:
                    named = tokens[1]
                    if named.startswith(("bench/", "scripts/")):
                        pytest.fail(f"{command.where}: {named} does not exist")
                continue
            if script not in helps:
                done = subprocess.run(
                    [sys.executable, str(script), "--help"],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, f"{command.where}: --help failed: {done.stderr}"
                helps[script] = done.stdout
            args = tokens[2 : tokens.index("--")] if "--" in tokens else tokens[2:]
            for flag in (a.split("=")[0] for a in args if a.startswith("-")):
                assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", helps[script]), (
                    f"{command.where}: {script.name} has no option {flag}"
                )


def _runnable(doc: Path, training: bool) -> list[tuple[Command, list[str]]]:
    runs = []
    for command in commands(doc):
        for tokens in segments(command.text):
            argv = _tfmigrate_argv(tokens)
            if argv is None:
                continue
            try:
                parsed = parse_tfmigrate(argv, command.where)
            except (AssertionError, pytest.fail.Exception):
                continue  # test_tfmigrate_commands_use_real_options reports it
            if bundled(parsed) and (training or parsed.name not in TRAINING):
                runs.append((command, argv))
    return runs


def _matches(shown: str, line: str) -> bool:
    if shown.endswith("...") and shown != "...":
        return line.startswith(shown[:-3].rstrip())
    return line == shown


def check_output(command: Command, output: str) -> None:
    """The lines shown under a command, in order, against what it printed."""
    lines = [ANSI.sub("", line).rstrip() for line in output.splitlines()]
    position, skipping = 0, False
    for shown in command.shown:
        if shown == "...":
            skipping = True
            continue
        if skipping:
            while position < len(lines) and not _matches(shown, lines[position]):
                position += 1
        assert position < len(lines) and _matches(shown, lines[position]), (
            f"{command.where}: shows {shown!r}, which the command did not print"
            + (f" (it printed {lines[position]!r} there)" if position < len(lines) else "")
            + "\n--- output ---\n"
            + output
        )
        position += 1
        skipping = False


def run_documented(doc: Path, tmp_path: Path, training: bool) -> int:
    runs = _runnable(doc, training)
    if not runs:
        return 0
    shutil.copytree(REPO / "fixtures", tmp_path / "fixtures")
    for command, argv in runs:
        # legacy runs shared with the other tests (verify reads its --legacy-cache from the
        # environment): the documented command lines stay as a user types them
        env = {"NO_COLOR": "1", "TFMIGRATE_LEGACY_CACHE": str(legacy_cache_dir())}
        result = run_cli(*argv, cwd=tmp_path, env=env)
        assert result.returncode in (0, 1), f"{command.where}: exit {result.returncode}\n{result}"
        check_output(command, result.stdout + result.stderr)
    return len(runs)


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_bundled_commands_run_and_print_what_is_shown(doc, tmp_path):
    """scan, rewrite, rules and explain on bundled files (no training)."""
    run_documented(doc, tmp_path, training=False)


# collected once: a document whose commands do not parse fails in the options test, not here
TRAINING_DOCS = [d for d in DOCS if any(c[1][0] in TRAINING for c in _runnable(d, training=True))]


@pytest.mark.slow
@pytest.mark.parametrize(
    "doc", TRAINING_DOCS, ids=[str(d.relative_to(REPO)) for d in TRAINING_DOCS]
)
def test_bundled_commands_that_train_run_too(doc, tmp_path):
    """The whole sequence a document shows, verify and convert-checkpoint included."""
    assert run_documented(doc, tmp_path, training=True)


def test_readme_tour_runs_verify():
    """The README's tour ends with a verify of the migrated copy it wrote: the slow test runs it."""
    assert REPO / "README.md" in TRAINING_DOCS


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = _without_code(doc.read_text(encoding="utf-8"), keep_inline=True)
    seen: dict[str, int] = {}
    found = set()
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _without_code(text: str, keep_inline: bool = False) -> str:
    lines, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\s*```", line):
            inside = not inside
            continue
        if not inside:
            lines.append(line if keep_inline else re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_local_links_resolve(doc):
    text = _without_code(doc.read_text(encoding="utf-8"))
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        assert resolved.exists(), f"{doc.relative_to(REPO)}: link to {target}: no such file"
        assert resolved.is_relative_to(REPO), f"{doc.relative_to(REPO)}: {target} leaves the repo"
        if anchor:
            assert resolved.suffix == ".md", f"{doc.relative_to(REPO)}: anchor into {path}"
            assert anchor in anchors(resolved), (
                f"{doc.relative_to(REPO)}: link to {target}: no heading with that anchor "
                f"(there are: {sorted(anchors(resolved))})"
            )


def test_link_check_sees_broken_links(tmp_path):
    assert _slug("Migrated side: the protocol (`python -m tfmigrate.verify.migrated_boot`)") == (
        "migrated-side-the-protocol-python--m-tfmigrateverifymigrated_boot"
    )
    doc = tmp_path / "x.md"
    doc.write_text("# One\n\nsee [it](#two) and `[not](a link)`\n")
    assert anchors(doc) == {"one"}


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_configuration_examples_load(doc, tmp_path):
    """Every ``[tool.tfmigrate]`` example is a configuration the command line accepts."""
    examples = [
        b for b in blocks(doc.read_text(encoding="utf-8"))
        if b.info == "toml" and any("[tool.tfmigrate" in line for line in b.body)
    ]  # fmt: skip
    for block in examples:
        folder = tmp_path / f"example{block.line}"
        folder.mkdir()
        (folder / "pyproject.toml").write_text("\n".join(block.body) + "\n", encoding="utf-8")
        (folder / "empty.py").write_text("")
        result = run_cli("rewrite", "--check", folder / "empty.py", cwd=folder)
        assert result.returncode == 0, f"{doc.relative_to(REPO)}:{block.line}: {result}"


def test_hook_entries_are_valid_command_lines():
    """pre-commit runs a hook's entry with the file names appended."""
    yaml = pytest.importorskip("yaml")
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert [h["id"] for h in hooks] == ["tfmigrate-scan", "tfmigrate-rewrite-check"]
    for hook in hooks:
        assert hook["language"] == "python" and hook["types"] == ["python"]
        argv = _tfmigrate_argv(shlex.split(hook["entry"]))
        assert argv is not None, hook
        parse_tfmigrate([*argv, *hook.get("args", []), "train.py"], hook["id"])
    # the documented `args:` of a hook, appended to its entry the same way
    entries = {h["id"]: shlex.split(h["entry"])[1:] for h in hooks}
    shown = 0
    for block in blocks((REPO / "docs" / "pre-commit.md").read_text(encoding="utf-8")):
        if block.info != "yaml":
            continue
        data = yaml.safe_load("\n".join(block.body))
        items = data if isinstance(data, list) else []
        for item in items:
            if isinstance(item, dict) and item.get("id") in entries and "args" in item:
                argv = [*entries[item["id"]], *item["args"], "train.py"]
                parse_tfmigrate(argv, f"docs/pre-commit.md:{block.line}")
                shown += 1
    assert shown, "docs/pre-commit.md shows no hook with args"


def test_output_check_sees_a_line_not_printed():
    printed = "a.py:1:1: TFM101 tower loop\nFound 1 finding\n"
    command = Command(REPO / "README.md", 1, "tfmigrate scan a.py")
    command.shown = ["a.py:1:1: TFM101 ...", "...", "Found 1 finding"]
    check_output(command, printed)
    command.shown = ["a.py:1:1: TFM102 ..."]
    with pytest.raises(AssertionError):
        check_output(command, printed)
