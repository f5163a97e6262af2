"""``tfmigrate verify``: the typer command (registered by tfmigrate.cli). Imports no TensorFlow."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:  # numpy comes with them: loaded when verify runs, not at every start-up
    from tfmigrate.verify.verifier import VerifyOptions

EXIT_ERROR = 2


def verify(
    legacy: Annotated[
        Path, typer.Argument(help="The legacy TF1 tower training script.", show_default=False)
    ],
    migrated: Annotated[
        Path,
        typer.Argument(
            help="The migrated TF2 script, run as its user runs it.", show_default=False
        ),
    ],
    script_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Arguments for both scripts, after `--`.", show_default=False, metavar="[-- ARGS]"
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            "-n",
            min=1,
            show_default=False,
            help="Towers / replicas [default: 2; with --workers on cpu: 1 per worker].",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Run the migrated side as W MultiWorkerMirroredStrategy worker processes "
            "on localhost; the legacy side gets W x replicas towers (0: off).",
        ),
    ] = 0,
    steps: Annotated[
        int, typer.Option("--steps", "-k", min=1, help="Training steps to compare.")
    ] = 20,
    seed: Annotated[int, typer.Option(help="Seed for Python, numpy and TF on both sides.")] = 0,
    report: Annotated[
        Path | None,
        typer.Option(help="Write report.json, report.md and loss.png (and the runs) here."),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(help="tfmigrate.json (default: next to MIGRATED or in its parents)."),
    ] = None,
    mapping: Annotated[
        Path | None, typer.Option(help="Explicit variable mapping JSON for hand-migrated code.")
    ] = None,
    device: Annotated[
        str, typer.Option(help="cpu: N logical CPU devices; gpu: the first N GPUs.")
    ] = "cpu",
    timeout: Annotated[float, typer.Option(help="Seconds for both sides together.")] = 600.0,
    atol: Annotated[
        float, typer.Option(help="Per-step scalars: absolute tolerance (early steps).")
    ] = 1e-5,
    rtol: Annotated[
        float, typer.Option(help="Per-step scalars: relative tolerance (later steps).")
    ] = 1e-4,
    early_steps: Annotated[
        int, typer.Option(help="Steps judged by --atol before --rtol applies.")
    ] = 10,
    weights_atol: Annotated[float, typer.Option(help="Variables: absolute tolerance.")] = 1e-6,
    weights_rtol: Annotated[float, typer.Option(help="Variables: relative tolerance.")] = 1e-4,
    update_rtol: Annotated[
        float,
        typer.Option(
            help="Variables: or each step's update within this fraction of the legacy step's "
            "(L2 over the variable; 0: the elementwise tolerances alone)."
        ),
    ] = 1e-2,
    legacy_rev: Annotated[
        str | None, typer.Option(help="Take the legacy script's folder from this git revision.")
    ] = None,
    legacy_cache: Annotated[
        Path | None,
        typer.Option(help="Reuse the legacy run from this cache while its script folder and the run "
                          "parameters are unchanged (fast iteration on the migrated side).",
                     envvar="TFMIGRATE_LEGACY_CACHE"),
    ] = None,
    noise_floor: Annotated[
        bool,
        typer.Option(
            "--noise-floor/--no-noise-floor",
            help="If something diverges, run the legacy program again under other kernel settings "
            "and accept failing steps within 3x its drift from itself (rounding).",
        ),
    ] = True,
    replay_inputs: Annotated[
        bool,
        typer.Option(
            help="Feed the migrated replicas the legacy towers' batches of each step instead of "
            "what the program's own input pipeline gives (the pipeline is then not compared)."
        ),
    ] = False,
    roundtrip: Annotated[
        bool,
        typer.Option(
            help="Also check that what the migrated program saves brings it back: its state after "
            "the last step is restored into a fresh run, whose variables and next steps must "
            "match."
        ),
    ] = False,
) -> None:
    """Train LEGACY and MIGRATED side by side on N devices and show whether they learn the same.

    Exit status: 0 equivalent, 1 diverged, 2 could not run (crash, different inputs, bad arguments).
    """
    from tfmigrate.verify.compare import COULD_NOT_RUN, Tolerances, could_not_run
    from tfmigrate.verify.report import print_terminal, write_report
    from tfmigrate.verify.verifier import Outcome, VerifyOptions, run_verify

    console = Console(highlight=False, soft_wrap=True)
    # The sides run in scratch folders: every path the user gave is made absolute first.
    report, manifest, mapping, legacy_cache = (
        p.resolve() if p is not None else None for p in (report, manifest, mapping, legacy_cache)
    )
    opts = VerifyOptions(
        legacy=legacy,
        migrated=migrated,
        replicas=replicas or (1 if workers else 2),
        steps=steps,
        seed=seed,
        device=device,
        timeout=timeout,
        report_dir=report,
        manifest=manifest,
        mapping=mapping,
        tolerances=Tolerances(
            atol=atol,
            rtol=rtol,
            early_steps=early_steps,
            weights_atol=weights_atol,
            weights_rtol=weights_rtol,
            update_rtol=update_rtol,
        ),
        script_args=tuple(script_args or ()),
        legacy_rev=legacy_rev,
        legacy_cache=legacy_cache,
        roundtrip=roundtrip,
        workers=workers,
        noise_floor=noise_floor,
        replay_inputs=replay_inputs,
    )
    problem = _argument_problem(opts) or _workers_problem(opts) or _roundtrip_problem(opts)
    if problem:
        outcome = Outcome(could_not_run(problem), opts)
    else:
        where = f"{workers} workers" if workers else f"{opts.replicas} {device} replicas"
        with console.status(f"training both sides for {steps} steps on {where}..."):
            outcome = run_verify(opts)
    print_terminal(outcome, console)
    if report is not None:
        write_report(outcome, report)
        console.print(f"report: {report / 'report.md'}", style="dim")
    code = outcome.comparison.exit_code
    raise typer.Exit(EXIT_ERROR if outcome.comparison.verdict == COULD_NOT_RUN else code)


def _argument_problem(opts: VerifyOptions) -> str | None:
    if opts.device not in ("cpu", "gpu"):
        return f"--device must be cpu or gpu, not {opts.device!r}"
    for label, path in (("legacy", opts.legacy), ("migrated", opts.migrated)):
        if not path.is_file() and not (label == "legacy" and opts.legacy_rev):
            return f"{label} script {path} does not exist"
    for label, given in (("--manifest", opts.manifest), ("--mapping", opts.mapping)):
        if given is not None and not given.is_file():
            return f"{label} {given} does not exist"
    return None


def _workers_problem(opts: VerifyOptions) -> str | None:
    if not opts.workers:
        return None
    if opts.device == "cpu" and opts.replicas != 1:
        return (
            "--workers on cpu: MultiWorkerMirroredStrategy gives each worker exactly one CPU device, "
            f"so --replicas must be 1 (the legacy side gets {opts.workers} towers), not {opts.replicas}"
        )
    if opts.replay_inputs:
        return "--replay-inputs is not supported with --workers yet"
    if opts.roundtrip:
        return "--roundtrip is not supported with --workers yet (every worker would save into one folder)"
    return None


def _roundtrip_problem(opts: VerifyOptions) -> str | None:
    if opts.roundtrip and opts.replay_inputs:
        # the resumed run would have to be fed the legacy batches too
        return "--roundtrip is not supported with --replay-inputs yet"
    return None
