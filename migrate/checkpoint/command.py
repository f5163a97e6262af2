"""``tfmigrate convert-checkpoint``: the typer command (registered by tfmigrate.cli). No TensorFlow.

The conversion runs in a subprocess (convert_boot) into a scratch folder next to ``--out``; the
folder is renamed into place only when everything converted, so an error leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from tfmigrate.checkpoint.plan import EMA_SUFFIX
from tfmigrate.verify.manifest import (
    SAME_NAMES,
    ManifestError,
    ScriptManifest,
    find_manifest,
    load_manifest,
    load_mapping_file,
)

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2


def convert_checkpoint(
    legacy_checkpoint: Annotated[
        Path,
        typer.Argument(
            help="TF1 checkpoint prefix (model.ckpt-1000) or its folder.", show_default=False
        ),
    ],
    script: Annotated[
        Path,
        typer.Option(
            "--script",
            help="The migrated script (run as written up to its first training step).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Folder for the converted checkpoint.", show_default=False)
    ],
    script_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Arguments for the program(s), after `--`.",
            show_default=False,
            metavar="[-- ARGS]",
        ),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(help="tfmigrate.json (default: next to --script or in its parents)."),
    ] = None,
    mapping: Annotated[
        Path | None, typer.Option(help="Explicit variable mapping JSON instead of a manifest.")
    ] = None,
    use_ema: Annotated[
        bool,
        typer.Option(
            "--use-ema", help="Load the EMA shadow values into the weights (TF1 evaluation)."
        ),
    ] = False,
    ema_name: Annotated[
        str, typer.Option(help="The ExponentialMovingAverage's name (shadow suffix).")
    ] = EMA_SUFFIX,
    replicas: Annotated[
        int, typer.Option("--replicas", "-n", min=1, help="Replicas the program is built on.")
    ] = 2,
    device: Annotated[
        str, typer.Option(help="cpu: N logical CPU devices; gpu: the first N GPUs.")
    ] = "cpu",
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out.")] = False,
    check: Annotated[
        Path | None,
        typer.Option(
            help="The legacy script: restore it from LEGACY_CHECKPOINT, let the migrated program's "
            "own restore load the converted one, run one step each, compare (exit 1 if they differ)."
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds for the conversion (and the check).")
    ] = 600.0,
) -> None:
    """Convert a TF1 checkpoint into a TF2 checkpoint the migrated program restores.

    Exit status: 0 converted (and, with --check, the same model); 1 --check found a difference;
    2 an error (nothing written).
    """
    console = Console(highlight=False, soft_wrap=True)

    def fail(message: str, problems: list[str] | None = None) -> NoReturn:
        console.print("[bold red]error:[/] ", end="")
        console.print(
            message, markup=False
        )  # names hold brackets ("w [slot m]") that are no markup
        for problem in problems or []:
            console.print(f"  - {problem}", markup=False)
        raise typer.Exit(EXIT_ERROR)

    if not script.is_file():
        fail(f"--script {script} does not exist")
    if device not in ("cpu", "gpu"):
        fail(f"--device must be cpu or gpu, not {device!r}")
    if check is not None and not check.is_file():
        fail(f"--check {check} does not exist")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        fail(f"--out {out} exists and is not empty (use --force to replace it)")
    try:
        script_manifest = _manifest(script, manifest, mapping)
    except ManifestError as exc:
        fail(str(exc))
    if not script_manifest.variables:  # a conversion that kept the legacy names records none
        script_manifest = dataclasses.replace(script_manifest, variables=dict(SAME_NAMES))
    if legacy_checkpoint.is_dir():
        if not (legacy_checkpoint / "checkpoint").is_file():
            fail(
                f"no TF checkpoint in folder {legacy_checkpoint} (no 'checkpoint' file naming one)"
            )
    elif not Path(f"{legacy_checkpoint}.index").is_file():
        fail(f"checkpoint {legacy_checkpoint} not found ({legacy_checkpoint}.index does not exist)")

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tfmigrate-convert-"))
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        with console.status("converting (running the migrated program to its first step)..."):
            result = _run_boot(
                legacy_checkpoint,
                script,
                script_manifest,
                staging,
                scratch,
                use_ema,
                ema_name,
                replicas,
                device,
                timeout,
                script_args or [],
            )
        if result.get("status") != "ok":
            shutil.rmtree(staging, ignore_errors=True)
            if result.get("traceback"):
                console.print(result["traceback"].rstrip(), markup=False)
            fail(result.get("message", "the conversion failed"), result.get("problems"))
        _publish(staging, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    _print_result(console, result, out)
    if check is not None:
        _check(
            console,
            check,
            script,
            result,
            out,
            script_manifest,
            use_ema,
            ema_name,
            replicas,
            device,
            timeout,
            tuple(script_args or ()),
        )


def _manifest(script: Path, manifest: Path | None, mapping: Path | None) -> ScriptManifest:
    if mapping is not None:
        return load_mapping_file(mapping)
    path = manifest or find_manifest(script)
    if path is None:  # its variables are matched by name and shape, as verify does
        return ScriptManifest(variables=dict(SAME_NAMES), source="matched by name and shape")
    return load_manifest(path, script)


def _run_boot(
    checkpoint: Path,
    script: Path,
    manifest: ScriptManifest,
    staging: Path,
    scratch: Path,
    use_ema: bool,
    ema_name: str,
    replicas: int,
    device: str,
    timeout: float,
    script_args: list[str],
) -> dict[str, Any]:
    mapping_file, result_file = scratch / "mapping.json", scratch / "result.json"
    mapping_file.write_text(json.dumps(manifest.variables))
    cmd = [
        sys.executable,
        "-m",
        "tfmigrate.checkpoint.convert_boot",
        "--checkpoint",
        str(checkpoint.resolve()),
        "--script",
        str(script.resolve()),
        "--mapping",
        str(mapping_file),
        "--out",
        str(staging),
        "--result",
        str(result_file),
        "--replicas",
        str(replicas),
        "--device",
        device,
        "--ema-name",
        ema_name,
        *(["--use-ema"] if use_ema else []),
        "--",
        *script_args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONDONTWRITEBYTECODE": "1"})
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    work = scratch / "cwd"  # files the program writes while it is built land here
    work.mkdir()
    try:
        proc = subprocess.run(
            cmd,
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return {"status": "error", "message": f"the conversion timed out after {timeout:g} s"}
    if not result_file.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        return {
            "status": "error",
            "message": f"the conversion process stopped (exit status {proc.returncode}) "
            f"before writing its result:\n{tail}",
        }
    return json.loads(result_file.read_text())


def _publish(staging: Path, out: Path) -> None:
    """Rename the finished folder into place (replacing an old one only with --force)."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _print_result(console: Console, result: dict[str, Any], out: Path) -> None:
    converted = result["converted"]
    kinds = {k: sum(1 for a in converted if a["kind"] == k) for k in ("variable", "ema", "slot")}
    parts = [f"{kinds['variable'] + kinds['ema']} variables"]
    if kinds["ema"]:
        parts.append(f"{kinds['ema']} of them from their EMA shadows")
    if kinds["slot"]:
        parts.append(f"{kinds['slot']} optimizer state variables")
    console.print(
        f"converted {result['legacy_checkpoint']} -> {out / result['checkpoint']} ({', '.join(parts)})"
    )
    console.print(f"layout: {result['layout']}; files: {', '.join(result['files'])}", markup=False)
    for note in result.get("notes", []):
        console.print(f"note: {note}", style="yellow", markup=False)


def _check(
    console: Console,
    legacy: Path,
    script: Path,
    result: dict[str, Any],
    out: Path,
    manifest: ScriptManifest,
    use_ema: bool,
    ema_name: str,
    replicas: int,
    device: str,
    timeout: float,
    script_args: tuple[str, ...],
) -> None:
    from tfmigrate.checkpoint.check import run_check
    from tfmigrate.verify import compare as cmp

    with console.status("checking: both programs restored, one step each..."):
        checked = run_check(
            legacy,
            script,
            result["legacy_checkpoint"],
            out,
            # the pairs the conversion used (the manifest's, the others matched by name and shape)
            dataclasses.replace(manifest, variables=result["mapping"]),
            replicas=replicas,
            device=device,
            timeout=timeout,
            script_args=script_args,
            ema_name=ema_name if use_ema else None,
            same_update=not result.get("optimizer_state_dropped"),
        )
    for row in checked.rows:
        mark = {cmp.PASS: "ok  ", cmp.EXPECTED: "EXPECTED"}.get(row.status, "FAIL")
        size = f"max |diff| {row.max_abs:.3g}" if row.max_abs is not None else ""
        console.print(f"  {mark} {row.quantity}  {size}  {row.note}".rstrip(), markup=False)
    if checked.verdict == cmp.EQUIVALENT:
        console.print(
            "check: the migrated program restored from the converted checkpoint computes the same "
            "as the legacy program restored from the legacy checkpoint",
            style="green",
        )
    elif checked.verdict == cmp.DIVERGED:
        console.print(f"check: DIFFERENT: {checked.reason}", style="bold red", markup=False)
    else:
        console.print(f"check: could not run: {checked.reason}", style="bold red", markup=False)
    raise typer.Exit(checked.exit_code)
