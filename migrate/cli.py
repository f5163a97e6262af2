"""The ``tfmigrate`` command line: scan, rewrite, rules, explain (and verify, in its own module)."""

from __future__ import annotations

import enum
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, TypedDict

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tfmigrate import __version__, diffs, gitcheck, manifest, writer
from tfmigrate.config import ConfigError
from tfmigrate.discovery import DiscoveryError
from tfmigrate.processing import FileResult
from tfmigrate.registry import all_rules, rule_by_code
from tfmigrate.sarif import to_sarif
from tfmigrate.workflow import RunOptions, RunResult, UsageError, run

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

app = typer.Typer(
    name="tfmigrate",
    help="Move TensorFlow 1.x multi-GPU tower training code to TensorFlow 2, and prove it trains the same.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class ScanFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"


class RewriteFormat(str, enum.Enum):
    text = "text"
    json = "json"


class Strategy(str, enum.Enum):
    """What whole-program conversions (TFM303) target; reaches rules as the `strategy` option."""

    mirrored = "mirrored"
    multi_worker = "multi-worker"


class BatchNorm(str, enum.Enum):
    """How whole-program conversions (TFM303) treat batch norm; the `batch-norm` option."""

    faithful = "faithful"
    sync = "sync"


class RulesFormat(str, enum.Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


def _version(value: bool) -> None:
    if value:
        out.print(f"tfmigrate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """tfmigrate: find TF1 tower patterns, rewrite them to TF2, verify the result trains the same."""


def _codes(values: list[str] | None) -> list[str]:
    return [c.strip() for v in values or [] for c in v.split(",") if c.strip()]


Paths = Annotated[
    list[Path], typer.Argument(help="Files or folders to process.", show_default=False)
]
Select = Annotated[
    list[str] | None,
    typer.Option("--select", help="Only these codes or prefixes (comma-separated)."),
]
Ignore = Annotated[list[str] | None, typer.Option("--ignore", help="Skip these codes or prefixes.")]
Exclude = Annotated[
    list[str] | None, typer.Option("--exclude", help="Extra gitignore-style patterns to skip.")
]
Jobs = Annotated[int, typer.Option("-j", "--jobs", min=1, help="Parallel worker processes.")]
ConfigPath = Annotated[
    Path | None, typer.Option("--config", help="pyproject.toml to read [tool.tfmigrate] from.")
]
NoConfig = Annotated[bool, typer.Option("--no-config", help="Ignore [tool.tfmigrate] settings.")]


def _progress_factory(console: Console):
    """A rich progress bar on a terminal for larger trees; nothing when piped."""

    def start(total: int):
        if total < 50 or not console.is_terminal:
            return None
        bar = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        bar.start()
        task = bar.add_task("files", total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)
            if bar.tasks[0].completed >= total:
                bar.stop()

        return advance

    return start


def _execute(options: RunOptions, include_other_files: bool = False) -> RunResult:
    try:
        return run(options, include_other_files, progress=_progress_factory(err))
    except (UsageError, ConfigError, DiscoveryError, manifest.ManifestError) as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(EXIT_ERROR) from None


def _print_errors(results: list[FileResult]) -> None:
    for result in results:
        if result.error:
            err.print(
                Text.assemble((f"{result.path}: ", "bold"), ("error: ", "bold red"), result.error)
            )


def _print_findings(results: list[FileResult]) -> None:
    first = True
    for result in results:
        if not result.findings:
            continue
        if not first:
            out.print()
        first = False
        for finding in result.findings:
            fix = ""
            if finding.fixable and not finding.applied:
                fix = f" [{finding.safety.value} fix]"
            if finding.rewritten:
                fix += " [line of the rewritten file]"
            out.print(
                Text.assemble(
                    (f"{finding.location}:", "bold"),
                    " ",
                    (
                        finding.code,
                        "bold red" if finding.safety.value == "manual" else "bold yellow",
                    ),
                    " ",
                    finding.message,
                    (fix, "cyan"),
                )
            )


def _summary_table(results: list[FileResult]) -> None:
    counts = Counter(f.code for r in results for f in r.findings)
    files_with = sum(1 for r in results if r.findings)
    errors = sum(1 for r in results if r.error)
    if counts:
        names = {r.code: r for r in all_rules()}
        table = Table(title=None, box=None, show_header=True, header_style="bold")
        table.add_column("code")
        table.add_column("rule")
        table.add_column("count", justify="right")
        table.add_column("fix")
        # What these findings' fixes are (a rule's findings may differ: TFM107 is safe for a
        # per-sample loss and unsafe for a loss over the whole batch).
        fixes: dict[str, set[str]] = {}
        for r in results:
            for f in r.findings:
                fixes.setdefault(f.code, set()).add(f.safety.value if f.fixable else "manual")
        order = ("safe", "unsafe", "manual")
        for code, count in sorted(counts.items()):
            rule = names.get(code)
            kinds = "/".join(k for k in order if k in fixes.get(code, ()))
            table.add_row(code, rule.name if rule else "?", str(count), kinds)
        out.print()
        out.print(table)
    total = sum(counts.values())
    out.print(
        f"\nFound {total} finding{'s' * (total != 1)} in {files_with} of {len(results)} file"
        f"{'s' * (len(results) != 1)}" + (f"; {errors} could not be processed." if errors else ".")
    )


def _exit_status(results: list[FileResult], pending: bool) -> int:
    if any(r.error for r in results):
        return EXIT_ERROR
    return EXIT_FINDINGS if pending else EXIT_CLEAN


@app.command()
def scan(
    paths: Paths,
    output_format: Annotated[
        ScanFormat, typer.Option("--format", help="Output format.")
    ] = ScanFormat.text,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the report to this file.")
    ] = None,
    select: Select = None,
    ignore: Ignore = None,
    exclude: Exclude = None,
    jobs: Jobs = 1,
    config: ConfigPath = None,
    no_config: NoConfig = False,
) -> None:
    """Find TF1 multi-GPU patterns and TF2 pitfalls, with what each one means."""
    options = RunOptions(
        paths,
        _codes(select),
        _codes(ignore),
        exclude or [],
        jobs=jobs,
        config=config,
        no_config=no_config,
    )
    result = _execute(options)
    results = result.results
    if output_format is ScanFormat.text and output is None:
        _print_findings(results)
        _print_errors(results)
        _summary_table(results)
    else:
        if output_format is ScanFormat.sarif:
            document = to_sarif(results, result.settings.rules)
        else:
            document = {
                "version": __version__,
                "files": [r.to_json() for r in results if r.findings or r.error],
                "summary": dict(Counter(f.code for r in results for f in r.findings)),
            }
        if output_format is ScanFormat.text:
            lines = [f"{f.location}: {f.code} {f.message}" for r in results for f in r.findings]
            text = "\n".join(lines) + "\n"
        else:
            text = json.dumps(document, indent=2) + "\n"
        if output is not None:
            writer.atomic_write(output, text.encode("utf-8"))
        else:
            sys.stdout.write(text)
        _print_errors(results)
    raise typer.Exit(_exit_status(results, any(r.findings for r in results)))


def _write_diffs(results: list[FileResult], sources: dict[str, Path]) -> None:
    raw = sys.stdout.buffer
    for result in results:
        if result.new is None:
            continue
        old = sources[result.path].read_bytes()
        patch = diffs.notes_for(result.findings) + diffs.unified_diff(result.path, old, result.new)
        if out.is_terminal:
            diffs.print_diff(out, patch)
        else:
            raw.write(patch)
    raw.flush()


class _SummaryRow(TypedDict):
    path: str
    changed: bool
    applied: list[str]
    reported: list[str]
    error: str | None


def _rewrite_summary(results: list[FileResult], output_format: RewriteFormat, mode: str) -> None:
    rows: list[_SummaryRow] = []
    for r in results:
        if not (r.findings or r.error or r.changed):
            continue
        rows.append(
            {
                "path": r.path,
                "changed": r.changed,
                "applied": sorted({f.code for f in r.findings if f.applied}),
                "reported": sorted({f.code for f in r.findings if not f.applied}),
                "error": r.error,
            }
        )
    if output_format is RewriteFormat.json:
        document = {
            "mode": mode,
            "files": rows,
            "changed": sum(1 for r in results if r.changed),
            "failed": sum(1 for r in results if r.error),
            "findings": [f.to_json() for r in results for f in r.findings],
        }
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = err if mode == "diff" and not out.is_terminal else out
    if not rows:
        console.print("Nothing to migrate.")
        return
    table = Table(box=None, header_style="bold")
    table.add_column("file")
    table.add_column("changed" if mode != "diff" else "would change")
    table.add_column("fixed" if mode != "diff" else "fixes")
    table.add_column("reported only")
    table.add_column("error")
    for row in rows:
        table.add_row(
            row["path"],
            "yes" if row["changed"] else "no",
            ", ".join(row["applied"]),
            ", ".join(row["reported"]),
            Text(row["error"] or "", style="red"),
        )
    console.print(table)


@app.command()
def rewrite(
    paths: Paths,
    write: Annotated[bool, typer.Option("--write", help="Apply the fixes in place.")] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write a migrated copy of the tree here.")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if --write would change anything.")
    ] = False,
    unsafe_fixes: Annotated[
        bool, typer.Option("--unsafe-fixes", help="Also apply fixes that change behaviour.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Allow --out into an existing non-empty folder.")
    ] = False,
    allow_dirty: Annotated[
        bool, typer.Option("--allow-dirty", help="Allow --write over uncommitted changes.")
    ] = False,
    output_format: Annotated[
        RewriteFormat, typer.Option("--format", help="Summary format.")
    ] = RewriteFormat.text,
    select: Select = None,
    ignore: Ignore = None,
    exclude: Exclude = None,
    jobs: Jobs = 1,
    config: ConfigPath = None,
    no_config: NoConfig = False,
    strategy: Annotated[
        Strategy | None,
        typer.Option(
            help="Target of whole-program conversions: one machine (mirrored, the default) or a "
            "cluster described by TF_CONFIG (multi-worker). Config: options.strategy."
        ),
    ] = None,
    batch_norm: Annotated[
        BatchNorm | None,
        typer.Option(
            "--batch-norm",
            help="Batch-norm statistics in whole-program conversions: per replica, as the "
            "towers had them (faithful, the default), or over the global batch (sync). "
            "Config: options.batch-norm.",
        ),
    ] = None,
    jit: Annotated[
        bool,
        typer.Option(
            "--jit",
            help="Whole-program conversions compile each replica's forward and backward pass "
            "with XLA (jit_compile); the manifest says what it changed. Config: options.jit.",
        ),
    ] = False,
) -> None:
    """Show the migration as diffs (default), or apply it with --write / --out DIR."""
    if sum(bool(x) for x in (write, out_dir, check)) > 1:
        err.print("[bold red]error:[/] choose one of --write, --out and --check")
        raise typer.Exit(EXIT_ERROR)
    if out_dir is not None:
        try:
            writer.check_out_dir(out_dir, paths, force)
        except writer.OutputError as exc:
            err.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(EXIT_ERROR) from None
    options = RunOptions(
        paths,
        _codes(select),
        _codes(ignore),
        exclude or [],
        fix=True,
        unsafe_fixes=unsafe_fixes,
        jobs=jobs,
        config=config,
        no_config=no_config,
        options={
            **({"strategy": strategy.value} if strategy is not None else {}),
            **({"batch-norm": batch_norm.value} if batch_norm is not None else {}),
            **({"jit": "on"} if jit else {}),
        },
    )
    result = _execute(options, include_other_files=out_dir is not None)
    results = result.results
    sources = result.sources
    changed = [r for r in results if r.changed]
    _print_errors(results)

    if check:
        _rewrite_summary(results, output_format, "check")
        raise typer.Exit(
            EXIT_ERROR
            if any(r.error for r in results)
            else (EXIT_FINDINGS if changed else EXIT_CLEAN)
        )
    if write:
        _apply_in_place(changed, sources, paths, allow_dirty)
        _rewrite_summary(results, output_format, "write")
    elif out_dir is not None:
        _write_tree(result, out_dir, paths)
        _rewrite_summary(results, output_format, "out")
    else:
        if output_format is RewriteFormat.text:
            _write_diffs(results, sources)
        _rewrite_summary(results, output_format, "diff")
        pending = bool(changed) or any(f for r in results for f in r.findings)
        raise typer.Exit(_exit_status(results, pending))
    pending = any(not f.applied for r in results for f in r.findings)
    raise typer.Exit(_exit_status(results, pending))


def _apply_in_place(
    changed: list[FileResult], sources: dict[str, Path], inputs: list[Path], allow_dirty: bool
) -> None:
    targets = [sources[r.path] for r in changed]
    if not allow_dirty:
        dirty = gitcheck.dirty_files(targets)
        if dirty:
            listing = "\n  ".join(str(p) for p in dirty)
            err.print(
                "[bold red]error:[/] refusing to --write over uncommitted changes (commit them, "
                f"or pass --allow-dirty):\n  {listing}"
            )
            raise typer.Exit(EXIT_ERROR)
    for result in changed:
        assert result.new is not None  # a changed result has its new bytes
        writer.atomic_write(sources[result.path], result.new)
    root = gitcheck.git_root(inputs[0]) or writer.output_layout(inputs)
    _update_manifest(root, changed, sources)


def _update_manifest(root: Path, changed: list[FileResult], sources: dict[str, Path]) -> None:
    root = root.resolve()
    entries = {}
    for result in changed:
        try:
            key = sources[result.path].resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        entries[key] = result
    manifest.update(root, entries)


def _write_tree(result: RunResult, out_dir: Path, inputs: list[Path]) -> None:
    base = writer.output_layout(inputs)
    by_path = {path.resolve(): r for r in result.results for path in [result.sources[r.path]]}
    changed: dict[str, FileResult] = {}
    for discovered in result.files:
        source = discovered.path.resolve()
        rel = (
            source.relative_to(base) if source.is_relative_to(base) else Path(discovered.path.name)
        )
        target = out_dir / rel
        file_result = by_path.get(source)
        if file_result is not None and file_result.new is not None:
            writer.atomic_write(target, file_result.new, mode_from=source)
            changed[rel.as_posix()] = file_result
        else:
            writer.copy_file(source, target)
    manifest.update(out_dir, changed)


@app.command("rules")
def list_rules(
    output_format: Annotated[
        RulesFormat, typer.Option("--format", help="text, json or markdown.")
    ] = RulesFormat.text,
) -> None:
    """List the rule catalog."""
    rules = all_rules()
    if output_format is RulesFormat.markdown:
        sys.stdout.write(rules_markdown())
        return
    if output_format is RulesFormat.json:
        sys.stdout.write(
            json.dumps(
                [
                    {
                        "code": r.code,
                        "name": r.name,
                        "summary": r.summary,
                        "fix": r.fix_safety.value,
                    }
                    for r in rules
                ],
                indent=2,
            )
            + "\n"
        )
        return
    table = Table(box=None, header_style="bold")
    for column in ("code", "name", "fix", "summary"):
        table.add_column(column)
    for rule in rules:
        table.add_row(rule.code, rule.name, rule.fix_safety.value, rule.summary)
    out.print(table)


def rules_markdown() -> str:
    lines = ["| code | name | fix | what it flags |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.code} | {r.name} | {r.fix_safety.value} | {r.summary} |" for r in all_rules()]
    return "\n".join(lines) + "\n"


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A rule code (TFM104) or name.")]) -> None:
    """Print one rule's documentation."""
    rule = rule_by_code(code)
    if rule is None:
        err.print(f"[bold red]error:[/] unknown rule {code!r} (see `tfmigrate rules`)")
        raise typer.Exit(EXIT_ERROR)
    from rich.markdown import Markdown  # markdown-it and pygments: only `explain` needs them

    out.print(
        Markdown(
            f"# {rule.code} {rule.name}\n\n*{rule.summary}* — fix: **{rule.fix_safety.value}**\n\n{rule.docs()}"
        )
    )


def _register_optional_commands() -> None:
    """Commands that live in their own packages; importing them must not import TensorFlow."""
    try:
        from tfmigrate.verify.command import verify
    except ImportError:
        return
    app.command()(verify)
    from tfmigrate.checkpoint.command import convert_checkpoint

    app.command("convert-checkpoint")(convert_checkpoint)


_register_optional_commands()


def main() -> None:
    app()
