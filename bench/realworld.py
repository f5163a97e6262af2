"""The whole-program converter measured on real code: how much of each corpus program converts.

    .venv/bin/python bench/realworld.py [--corpus DIR] [-j N] [--only SUBSTR]
        [--markdown FILE] [--json FILE] [--keep DIR]

The corpus (default: ../shared/realworld next to the repository) holds real TF1 multi-GPU
programs, one folder per repository (`<owner>+<name>`) and an INDEX.tsv with one row per program
(repo, commit, license, entry_script, other_extracted_paths, style_notes, data). For each folder
the bench copies it to a temporary directory and runs the command line as a user would,
`tfmigrate rewrite --unsafe-fixes --out OUT --format json .`, then classifies each program of
that folder from the JSON summary, the manifest and the written files:

- outcome: `converted`, `converted with N TODOs` (the whole-program converter -- TFM303 towers,
  TFM401 Horovod, TFM107 Keras multi_gpu_model, TFM402 Keras Horovod -- applied to the program), `refused` (the line and
  reason of the converter's "not converted" finding, or that no converter reported the program),
  `refused: Python 2` (the tool's own Python 2 diagnosis of the entry script), or `error` (the
  tool failed on the program: that is a row, not a crash of the bench);
- what the one-file rules did: their codes and the lines they changed in the program's files
  (a second run with the whole-program codes ignored isolates them where a conversion happened);
- on the rewritten program files (the entry script, plus the other modules of the program the
  converter applied its fix to, or, for a refusal, the module it refused in):
  py_compile, `ruff check --select F821` (undefined names; the legacy files' count beside it),
  code lines converted/legacy, TODO
  markers (`# TODO(tfmigrate): TFMxxx`) with the share of the legacy statements under them, and
  whether `Session`, `placeholder` or `get_collection` remain outside TODOs;
- `counts`: converted by the counting rule of docs/realworld.md (converted, compiles, no
  undefined names, <= 20% of the legacy statements under a TODO, no banned TF1 name outside TODOs);
- `trains`: each converted program (whole-program conversion applied) run for 3 steps on fake
  data in its input format (fake_data.py) under verify's instrumentation, which counts the
  steps and stops it (trial_boot.py): `yes`, `no: <how it failed>`, `missing dependency X`, or
  `not run: <why>` (no recipe, or the program needs pretrained weights or a download).
  `--no-train` skips it.
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import difflib
import io
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import tokenize
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "realworld"

# The whole-program converters: a finding of one of these codes, applied, is a conversion.
WHOLE_PROGRAM = ("TFM303", "TFM401", "TFM107", "TFM402")
# TF1 names a converted program must not keep outside TODOs (issue 19's counting rule).
BANNED = frozenset(
    {
        "Session",
        "InteractiveSession",
        "MonitoredTrainingSession",
        "placeholder",
        "placeholder_with_default",
        "get_collection",
        "get_collection_ref",
    }
)
MAX_TODO_SHARE = 0.20
TODO_RE = re.compile(r"#\s*TODO\(tfmigrate\):?\s*(TFM\d{3})?")
REWRITE_TIMEOUT = 900


@dataclasses.dataclass(frozen=True)
class Program:
    """One row of INDEX.tsv."""

    repo: str
    entry: str
    others: tuple[str, ...]
    style: str
    data: str

    @property
    def folder(self) -> str:
        return self.repo.replace("/", "+")

    @property
    def kind(self) -> str:
        """tower / horovod / keras, from the first sentence of the style notes."""
        head = self.style.split(".", 1)[0]
        if "KERAS" in head or "Keras" in head:
            return "keras"
        if "HOROVOD" in head:
            return "horovod"
        return "tower"

    @property
    def python_files(self) -> tuple[str, ...]:
        return (self.entry, *(p for p in self.others if p.endswith(".py") and p != self.entry))


@dataclasses.dataclass
class Row:
    """What the bench measured for one program. Fields left None were not measurable."""

    repo: str
    entry: str
    kind: str
    outcome: str = "error"
    whole_program: bool = False
    converter: str | None = None
    detail: str = ""
    refusal_path: str | None = None
    refusal_line: int | None = None
    measured_files: list[str] = dataclasses.field(default_factory=list)
    one_file_rules: list[str] = dataclasses.field(default_factory=list)
    one_file_added: int = 0
    one_file_removed: int = 0
    lines_added: int = 0  # the whole rewrite of the program's files, conversion included
    lines_removed: int = 0
    todo_count: int = 0
    todo_codes: list[str] = dataclasses.field(default_factory=list)
    todo_statements: int = 0
    legacy_statements: int | None = None
    compiles: bool | None = None
    undefined_names: int | None = None
    legacy_undefined_names: int | None = None  # what the program had before the rewrite
    legacy_code_lines: int | None = None
    converted_code_lines: int | None = None
    banned_outside_todo: list[str] = dataclasses.field(default_factory=list)
    # Training the converted program for 3 steps on fake data (run_trial).
    trains: str = "not run"
    # the staged converter's reading stage (tfmigrate.convert): the entry's tower cores, or why not
    core: str = "?"
    seconds: float = 0.0

    @property
    def todo_share(self) -> float | None:
        if not self.legacy_statements:
            return None
        return self.todo_statements / self.legacy_statements

    @property
    def code_line_ratio(self) -> float | None:
        if not self.legacy_code_lines or self.converted_code_lines is None:
            return None
        return self.converted_code_lines / self.legacy_code_lines

    @property
    def counts_as_converted(self) -> bool:
        share = self.todo_share
        return (
            self.whole_program
            and bool(self.compiles)
            and self.undefined_names == 0
            and share is not None
            and share <= MAX_TODO_SHARE
            and not self.banned_outside_todo
        )

    def as_dict(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["todo_share"] = self.todo_share
        out["code_line_ratio"] = self.code_line_ratio
        out["counts_as_converted"] = self.counts_as_converted
        return out


# ---------------------------------------------------------------------------------------------
# Reading the corpus


def read_index(corpus: Path) -> list[Program]:
    index = corpus / "INDEX.tsv"
    if not index.is_file():
        raise FileNotFoundError(f"{index} not found: --corpus must name the corpus folder")
    with index.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [
        Program(
            repo=r["repo"].strip(),
            entry=r["entry_script"].strip(),
            others=tuple(p.strip() for p in (r.get("other_extracted_paths") or "").split(",")),
            style=r.get("style_notes") or "",
            data=r.get("data") or "",
        )
        for r in rows
        if r.get("repo")
    ]


# ---------------------------------------------------------------------------------------------
# Source measures (no TensorFlow, no tfmigrate internals: what a reviewer of the output sees)


def code_lines(text: str) -> int:
    """Non-blank lines that are not only a comment."""
    return sum(
        1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


def _uncomment(lines: list[str]) -> str:
    stripped = []
    for line in lines:
        body = line.lstrip()[1:]
        stripped.append(body[1:] if body.startswith(" ") else body)
    return textwrap.dedent("\n".join(stripped))


def _statements_in(tree: ast.AST) -> int:
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.stmt))


def _commented_statements(lines: list[str]) -> int:
    """Statements in a block of commented-out code. Prose that wraps a TODO's text does not
    parse; line by line, a lone name or constant (a wrapped word) is not counted either."""
    try:
        return _statements_in(ast.parse(_uncomment(lines)))
    except SyntaxError:
        pass
    count = 0
    for line in lines:
        try:
            tree = ast.parse(_uncomment([line]))
        except SyntaxError:
            continue
        for stmt in tree.body:
            lone = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Name | ast.Constant)
            count += 0 if lone else _statements_in(stmt)
    return count


@dataclasses.dataclass
class TodoScan:
    """TODO markers of one file and what they cover."""

    codes: list[str] = dataclasses.field(default_factory=list)
    statements: int = 0  # live statements under a TODO plus commented-out ones
    commented_code_lines: int = 0  # commented-out code lines under a TODO
    covered_lines: set[int] = dataclasses.field(default_factory=set)  # live lines under a TODO


def _comments(text: str) -> list[tuple[int, bool, str]]:
    """(line, standalone, commented-out code before the marker) of every TODO(tfmigrate)
    comment: `# sess.run(x)  # TODO(tfmigrate): ...` keeps its code in the same comment.
    tokenize keeps a `#` inside a string out; source that does not tokenize is read by lines."""
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            match = TODO_RE.search(tok.string) if tok.type == tokenize.COMMENT else None
            if match:
                standalone = not tok.line[: tok.start[1]].strip()
                found.append((tok.start[0], standalone, tok.string[: match.start()]))
        return found
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    for number, line in enumerate(text.splitlines(), 1):
        at = line.find("#")
        match = TODO_RE.search(line, at) if at >= 0 else None
        if match:
            found.append((number, not line[:at].strip(), line[at : match.start()]))
    return found


def scan_todos(text: str) -> TodoScan:
    """A TODO covers the statement it trails, or -- standing on its own line -- the commented-out
    code right below it, or the next statement when no commented-out code follows. A covered
    compound statement covers its body."""
    lines = text.splitlines()
    scan = TodoScan()
    try:
        tree: ast.Module | None = ast.parse(text)
    except SyntaxError:
        tree = None
    starts: dict[int, ast.stmt] = {}
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.stmt):
                starts.setdefault(node.lineno, node)
    covered_starts: set[int] = set()

    def cover(line: int) -> None:
        if line in covered_starts:
            return
        covered_starts.add(line)
        stmt = starts.get(line)
        if stmt is None:  # no tree (or a continuation line): the line itself is all we know
            scan.statements += 1
            scan.covered_lines.add(line)
            return
        scan.statements += _statements_in(stmt)
        scan.covered_lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))

    for number, standalone, before in _comments(text):
        match = TODO_RE.search(lines[number - 1])
        if match and match.group(1):
            scan.codes.append(match.group(1))
        if before.strip("# \t"):  # the marker trails commented-out code: it covers that line
            commented = _commented_statements([before])
            scan.statements += commented
            scan.commented_code_lines += 1 if commented else 0
            if standalone:
                continue
        if not standalone:
            owner = max((s for s in starts if s <= number), default=number)
            cover(owner if tree is not None else number)
            continue
        block = []
        below = number
        while below < len(lines) and lines[below].lstrip().startswith("#"):
            if TODO_RE.search(lines[below]):
                break
            block.append(lines[below])
            below += 1
        if block:
            commented = _commented_statements(block)
            scan.statements += commented
            if commented:
                scan.commented_code_lines += sum(1 for line in block if line.strip("# \t"))
            continue
        while below < len(lines) and not lines[below].strip():
            below += 1
        if below < len(lines) and not lines[below].lstrip().startswith("#"):
            cover(below + 1)
    return scan


def banned_names(text: str, skip: set[int]) -> list[str]:
    """BANNED names used in code (not comments or strings) outside the lines in `skip`."""
    found: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string in BANNED and tok.start[0] not in skip:
                found.add(tok.string)
        return sorted(found)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    word = re.compile(r"\b(" + "|".join(sorted(BANNED)) + r")\b")
    for number, line in enumerate(text.splitlines(), 1):
        if number not in skip:
            found.update(word.findall(line.split("#", 1)[0]))
    return sorted(found)


def statement_count(text: str) -> int | None:
    try:
        return _statements_in(ast.parse(text))
    except SyntaxError:
        return None


def changed_lines(before: str, after: str) -> tuple[int, int]:
    """(lines added, lines removed) between two versions of a file."""
    added = removed = 0
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    for line in diff:
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def compiles(path: Path) -> bool:
    try:
        py_compile.compile(str(path), cfile=str(path.with_suffix(".pyc-check")), doraise=True)
    except (py_compile.PyCompileError, SyntaxError, ValueError):
        return False
    finally:
        path.with_suffix(".pyc-check").unlink(missing_ok=True)
    return True


def _tool(name: str) -> list[str]:
    """A console script of this environment, else the module run by this interpreter."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return [str(beside)]
    return [sys.executable, "-m", "tfmigrate" if name == "tfmigrate" else name]


def undefined_names(paths: list[Path]) -> int | None:
    """F821 findings of ruff over the files (ruff's defaults, no project config)."""
    if not paths:
        return 0
    cmd = [
        *_tool("ruff"),
        "check",
        "--isolated",
        "--no-cache",
        "--select",
        "F821",
        "--output-format",
        "json",
        *map(str, paths),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    try:
        found = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        return None
    # A file ruff cannot parse has no measurable names (its entries carry no F821 code).
    if any(f.get("code") != "F821" for f in found):
        return None
    return len(found)


# ---------------------------------------------------------------------------------------------
# Running the tool and classifying its result


@dataclasses.dataclass
class FolderRun:
    """One `rewrite` of a repo folder: where its input and output are, and what it said."""

    src: Path
    out: Path
    returncode: int
    summary: dict | None
    stderr: str
    seconds: float


def run_rewrite(src: Path, out: Path, extra: Iterable[str] = ()) -> FolderRun:
    cmd = [
        *_tool("tfmigrate"),
        "rewrite",
        "--unsafe-fixes",
        "--out",
        str(out),
        "--format",
        "json",
        *extra,
        ".",
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=REWRITE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return FolderRun(src, out, -1, None, f"timed out after {REWRITE_TIMEOUT}s", 0.0)
    seconds = time.perf_counter() - start
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        summary = None
    return FolderRun(src, out, proc.returncode, summary, proc.stderr, seconds)


def _norm(path: str) -> str:
    return Path(path).as_posix().removeprefix("./")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _refusal(finding: dict) -> tuple[int, str]:
    """(line, reason) of a converter's "not converted" finding; the reason is what follows."""
    message = finding["message"]
    line = finding.get("line") or 0
    at = message.find("not converted")
    reason = message[at + len("not converted") :] if at >= 0 else message
    named = re.match(r"\s*\(line (\d+)\)", reason)
    if named:
        line = int(named.group(1))
        reason = reason[named.end() :]
    return line, reason.lstrip(" :;,").strip()


def _rewritten(run: FolderRun, rel: str) -> Path:
    written = run.out / rel
    return written if written.exists() else run.src / rel


def classify(program: Program, run: FolderRun, one_file_run: FolderRun | None = None) -> Row:
    """Classify one program from the rewrite of its folder (and, when a conversion happened, a
    second rewrite with the whole-program codes ignored, for what the one-file rules did)."""
    row = Row(repo=program.repo, entry=program.entry, kind=program.kind, seconds=run.seconds)
    summary = run.summary
    if summary is None:
        row.detail = f"tfmigrate rewrite exited {run.returncode}: {_last_line(run.stderr)}"
        return row
    files = {_norm(f["path"]): f for f in summary.get("files", [])}
    if run.returncode == 2 and not any(f.get("error") for f in files.values()):
        # Exit 2 names no file: the run itself failed (arguments, output folder, ...).
        row.detail = f"tfmigrate rewrite exited 2: {_last_line(run.stderr)}"
        return row
    if not (run.src / program.entry).is_file():
        row.detail = f"{program.entry} is not in the corpus folder"
        return row
    # The summary lists only files with findings, changes or errors.
    entry = files.get(program.entry, {})
    if entry.get("error"):
        error = entry["error"]
        row.outcome = "refused: Python 2" if error.startswith("Python 2") else "error"
        row.detail = error
        row.measured_files = [program.entry]
        _measure(row, program, run)
        return row

    in_program = set(program.python_files)
    whole = [
        f
        for f in summary.get("findings", [])
        if f["code"] in WHOLE_PROGRAM and _norm(f["path"]) in in_program
    ]
    applied = [f for f in whole if f.get("applied")]
    measured = [program.entry]
    if applied:
        row.whole_program = True
        row.converter = applied[0]["code"]
        row.detail = applied[0]["message"]
        measured += sorted({_norm(f["path"]) for f in applied} - {program.entry})
    else:
        row.outcome = "refused"
        refusals = [f for f in whole if "not converted" in f["message"]]
        refusals.sort(key=lambda f: (_norm(f["path"]) != program.entry, f.get("line") or 0))
        if refusals:
            first = refusals[0]
            row.converter = first["code"]
            row.refusal_path = _norm(first["path"])
            row.refusal_line, row.detail = _refusal(first)
            if row.refusal_path != program.entry:
                measured.append(row.refusal_path)
        else:
            row.detail = "no whole-program converter (TFM303, TFM401, TFM107, TFM402) reported it"
    row.measured_files = measured
    _measure(row, program, run)
    if row.whole_program:
        plural = "" if row.todo_count == 1 else "s"
        row.outcome = (
            f"converted with {row.todo_count} TODO{plural}" if row.todo_count else "converted"
        )

    for rel in program.python_files:
        if (run.src / rel).exists():
            added, removed = changed_lines(_read(run.src / rel), _read(_rewritten(run, rel)))
            row.lines_added += added
            row.lines_removed += removed

    # One-file rules: from this run when nothing was converted, else from the run without the
    # whole-program codes (the conversion's own lines are not theirs).
    base = one_file_run if row.whole_program else run
    if base is not None and base.summary is not None:
        other = {_norm(f["path"]): f for f in base.summary.get("files", [])}
        codes: set[str] = set()
        for rel in program.python_files:
            record = other.get(rel)
            if record is None or not (run.src / rel).exists():
                continue
            codes.update(c for c in record.get("applied", []) if c not in WHOLE_PROGRAM)
            added, removed = changed_lines(_read(run.src / rel), _read(_rewritten(base, rel)))
            row.one_file_added += added
            row.one_file_removed += removed
        row.one_file_rules = sorted(codes)
    return row


def _measure(row: Row, program: Program, run: FolderRun) -> None:
    """Compile, F821, code lines, TODOs and banned names over the row's measured files."""
    legacy_lines = converted_lines = todo_statements = 0
    legacy_statements: int | None = 0
    ok = True
    codes: list[str] = []
    banned: set[str] = set()
    paths, legacy_paths = [], []
    for rel in row.measured_files:
        if not (run.src / rel).exists():
            continue
        legacy, written = _read(run.src / rel), _rewritten(run, rel)
        text = _read(written)
        paths.append(written)
        legacy_paths.append(run.src / rel)
        todos = scan_todos(text)
        codes += todos.codes
        todo_statements += todos.statements
        legacy_lines += code_lines(legacy)
        converted_lines += code_lines(text) + todos.commented_code_lines
        counted = statement_count(legacy)
        legacy_statements = (
            None if counted is None or legacy_statements is None else legacy_statements + counted
        )
        ok = compiles(written) and ok
        banned.update(banned_names(text, todos.covered_lines))
    if not paths:
        return
    row.compiles = ok
    row.undefined_names = undefined_names(paths)
    row.legacy_undefined_names = undefined_names(legacy_paths)
    row.legacy_code_lines, row.converted_code_lines = legacy_lines, converted_lines
    row.todo_count, row.todo_codes = len(codes), sorted(set(codes))
    row.todo_statements, row.legacy_statements = todo_statements, legacy_statements
    row.banned_outside_todo = sorted(banned)


def _classified(program: Program, run: FolderRun, one_file_run: FolderRun | None = None) -> Row:
    """classify(), with a program the bench cannot read reported as a row of its own."""
    try:
        return classify(program, run, one_file_run)
    except Exception as error:  # one odd program must not hide the other programs' rows
        row = Row(repo=program.repo, entry=program.entry, kind=program.kind)
        row.detail = f"the bench could not classify it: {type(error).__name__}: {error}"
        return row


TRIAL_STEPS = 3
TRIAL_TIMEOUT = 420  # seconds: a big model's first trace on 2 cores


def run_trial(program: Program, out: Path, scratch: Path) -> str:
    """The converted program trained for TRIAL_STEPS steps on fake data, in a copy of its
    converted tree: what the `trains` column says."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_data import RECIPES

    recipe = RECIPES.get((program.repo, program.entry))
    if recipe is None:
        return "not run: no fake-data recipe"
    if isinstance(recipe, str):
        return f"not run: {recipe}"
    tree = scratch / "tree"
    shutil.copytree(out, tree, symlinks=True)
    trial = recipe(tree)
    record = scratch / "record"
    script = tree / program.entry
    cmd = [
        sys.executable, str(Path(__file__).with_name("trial_boot.py")), "--script", str(script),
        "--out", str(record), "--steps", str(TRIAL_STEPS),
        *(f"--fake={name}" for name in trial.keras_datasets), "--", *trial.args,
    ]  # fmt: skip
    home = scratch / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join(str(tree / p) for p in trial.python_path),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    try:
        proc = subprocess.run(
            cmd, cwd=tree / trial.cwd, env=env, capture_output=True, text=True,
            timeout=TRIAL_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"no: timed out after {TRIAL_TIMEOUT} s"
    try:
        result = json.loads((record / "trial.json").read_text())
    except (OSError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no: the trial did not finish ({tail[:200]})"
    if result["missing"]:
        return f"missing dependency {result['missing']}"
    if result["steps"] >= TRIAL_STEPS:
        return f"yes ({result['steps']} steps)"
    return f"no: {result['error'] or 'ended after ' + str(result['steps']) + ' steps'}"


def measure_folder(
    folder: str, programs: list[Program], corpus: Path, keep: Path | None, train: bool = True
) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="tfm-realworld-") as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        shutil.copytree(corpus / folder, src, symlinks=True)
        run = run_rewrite(src, out)
        one_file_run = None
        rows = [_classified(p, run) for p in programs]
        if any(r.whole_program for r in rows):
            one_file_run = run_rewrite(
                src, Path(tmp) / "out-one-file", ["--ignore", ",".join(WHOLE_PROGRAM)]
            )
            rows = [_classified(p, run, one_file_run) for p in programs]
        cores = read_cores(src)
        for row, program in zip(rows, programs, strict=True):
            row.core = cores.get(program.entry, "no entry program read")
            if train and row.whole_program and out.exists():
                scratch = Path(tmp) / f"trial-{programs.index(program)}"
                scratch.mkdir()
                row.trains = run_trial(program, out, scratch)
        if keep is not None and out.exists():
            shutil.copytree(out, keep / folder, dirs_exist_ok=True)
        return rows


def read_cores(src: Path) -> dict[str, str]:
    """Entry script (relative to ``src``) -> what the converter's reading stage found there."""
    from tfmigrate.convert import read_project

    found: dict[str, str] = {}
    try:
        readings = read_project(src)
    except Exception as exc:  # noqa: BLE001  a crash of the reader is a row, not the bench's
        return {"*": f"reader failed: {type(exc).__name__}: {exc}"}
    for reading in readings:
        entry = Path(reading.entry)
        rel = (entry.relative_to(src) if entry.is_absolute() else entry).as_posix()
        if reading.program is not None:
            cores = reading.program.cores
            found[rel] = f"{len(cores)} core{'s' if len(cores) != 1 else ''}"
        elif reading.refusal is not None:
            found[rel] = f"refused: {reading.refusal.reason}"
    return found


def measure_corpus(
    corpus: Path,
    only: str | None = None,
    jobs: int = 1,
    keep: Path | None = None,
    train: bool = True,
) -> list[Row]:
    programs = [p for p in read_index(corpus) if not only or only in f"{p.folder}/{p.entry}"]
    folders: dict[str, list[Program]] = {}
    for program in programs:
        folders.setdefault(program.folder, []).append(program)
    missing = [f for f in folders if not (corpus / f).is_dir()]
    if missing:
        raise FileNotFoundError(f"corpus folders missing: {', '.join(missing)}")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = pool.map(lambda f: measure_folder(f, folders[f], corpus, keep, train), folders)
        by_program = {(r.repo, r.entry): r for rows in results for r in rows}
    return [by_program[(p.repo, p.entry)] for p in programs]


# ---------------------------------------------------------------------------------------------
# Reporting

COLUMNS = (
    "program",
    "kind",
    "outcome",
    "whole program",
    "one-file rules",
    "TODO share",
    "compiles",
    "F821 (legacy)",
    "code lines",
    "banned",
    "trains",
    "core (reader)",
    "counts",
    "detail",
)


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def _yes(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def cells(row: Row) -> list[str]:
    share = row.todo_share
    ratio = row.code_line_ratio
    codes = ",".join(row.one_file_rules) or "-"
    detail = row.detail
    if row.refusal_line is not None:
        where = "" if row.refusal_path == row.entry else f"{row.refusal_path}:"
        detail = f"{where}{row.refusal_line}: {detail}"
    if row.todo_codes:
        detail = f"TODO {','.join(row.todo_codes)}; {detail}"
    return [
        f"{row.repo}:{row.entry}",
        row.kind,
        row.outcome,
        f"yes ({row.converter}; all +{row.lines_added}/-{row.lines_removed})"
        if row.whole_program
        else "no",
        f"{codes} +{row.one_file_added}/-{row.one_file_removed}",
        "?" if share is None else f"{share:.0%}",
        _yes(row.compiles),
        f"{_count(row.undefined_names)} ({_count(row.legacy_undefined_names)})",
        "?" if ratio is None else f"{ratio:.2f}x",
        ",".join(row.banned_outside_todo) or "-",
        row.trains,
        row.core,
        _yes(row.counts_as_converted),
        detail,
    ]


def summarize(rows: list[Row]) -> dict[str, int]:
    core = [r for r in rows if r.kind in ("tower", "horovod") and r.outcome != "refused: Python 2"]
    return {
        "programs": len(rows),
        "converted": sum(r.counts_as_converted for r in rows),
        "converted_no_todo": sum(r.counts_as_converted and r.todo_count == 0 for r in rows),
        "whole_program_applied": sum(r.whole_program for r in rows),
        "compile": sum(bool(r.compiles) for r in rows),
        "no_undefined_names": sum(r.undefined_names == 0 for r in rows),
        "tower_horovod_python3": len(core),
        "tower_horovod_converted": sum(r.counts_as_converted for r in core),
        "python2": sum(r.outcome == "refused: Python 2" for r in rows),
        "tower_horovod_cores": sum(r.core.endswith(("core", "cores")) for r in core),
        "errors": sum(r.outcome == "error" for r in rows),
        "trains": sum(r.trains.startswith("yes") for r in rows),
        "trains_counted": sum(r.trains.startswith("yes") and r.counts_as_converted for r in rows),
    }


def summary_line(s: dict[str, int]) -> str:
    return (
        f"{s['converted']} converted of {s['programs']} "
        f"({s['tower_horovod_converted']} of the {s['tower_horovod_python3']} Python 3 tower and "
        f"Horovod programs; their tower core read by the staged converter in "
        f"{s['tower_horovod_cores']}); {s['converted_no_todo']} with no TODO; whole-program conversion "
        f"applied to {s['whole_program_applied']}; {s['compile']} compile; "
        f"{s['no_undefined_names']} with no undefined names; {s['python2']} Python 2; "
        f"{s['errors']} tool errors; {s['trains']} train {TRIAL_STEPS} steps on fake data "
        f"({s['trains_counted']} of them counted as converted)"
    )


def text_table(rows: list[Row]) -> str:
    table = [list(COLUMNS)] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS) - 1)]
    out = []
    for line in table:
        out.append(
            "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + line[-1]
        )
    return "\n".join(out)


def refusal_reasons(rows: list[Row]) -> list[tuple[int, str]]:
    """Refusals grouped by reason, most frequent first: the program's own names (in backticks)
    and the trailing "the program is left as it was" are dropped so that one shape is one line."""
    tally: dict[str, int] = {}
    for row in rows:
        if row.outcome != "refused":
            continue
        reason = re.sub(r"`[^`]*`", "`…`", row.detail)
        reason = re.sub(r"[;,]?\s*the program is left as it was\.?$", "", reason).strip()
        tally[reason] = tally.get(reason, 0) + 1
    return sorted(((n, r) for r, n in tally.items()), key=lambda item: (-item[0], item[1]))


def markdown_table(rows: list[Row], summary: dict[str, int]) -> str:
    def md(cell: str) -> str:
        return cell.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(md(c) for c in cells(r)) + " |" for r in rows]
    lines += ["", f"**Summary:** {summary_line(summary)}.", "", "Refusals by reason:", ""]
    lines += [f"- {n} × {md(reason)}" for n, reason in refusal_reasons(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help="corpus folder with INDEX.tsv (default: ../shared/realworld)",
    )
    parser.add_argument("-j", "--jobs", type=int, default=1, help="folders measured at once")
    parser.add_argument("--only", help="programs whose folder/entry contains this")
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown")
    parser.add_argument("--json", type=Path, help="also write rows and summary as JSON")
    parser.add_argument("--keep", type=Path, help="keep each folder's migrated copy here")
    parser.add_argument(
        "--no-train", action="store_true", help="skip training the converted programs"
    )
    opts = parser.parse_args(argv)
    if not (opts.corpus / "INDEX.tsv").is_file():
        print(
            f"error: no corpus at {opts.corpus} (no INDEX.tsv); pass --corpus DIR", file=sys.stderr
        )
        return 2
    start = time.perf_counter()
    try:
        rows = measure_corpus(
            opts.corpus.resolve(), opts.only, opts.jobs, opts.keep, not opts.no_train
        )
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    summary = summarize(rows)
    print(text_table(rows))
    print()
    print(f"Summary: {summary_line(summary)}. Wall time {wall:.1f} s (-j {opts.jobs}).")
    reasons = refusal_reasons(rows)
    if reasons:
        print("\nRefusals by reason:")
        for n, reason in reasons:
            print(f"  {n:3d}  {reason}")
    if opts.markdown:
        opts.markdown.write_text(markdown_table(rows, summary), encoding="utf-8")
    if opts.json:
        payload = {
            "summary": summary,
            "wall_seconds": round(wall, 1),
            "rows": [r.as_dict() for r in rows],
            "refusal_reasons": [{"programs": n, "reason": r} for n, r in refusal_reasons(rows)],
        }
        opts.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
