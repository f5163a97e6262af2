"""One verify run from options to a Comparison: manifest → both sides → records → comparison.

No TensorFlow in this process: the sides run in subprocesses (sides.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tfmigrate.verify import compare as cmp
from tfmigrate.verify import loss_scaling
from tfmigrate.verify.as_written import PROGRESS_JSON
from tfmigrate.verify.manifest import (
    RESOLVED_MAPPING,
    SAME_NAMES,
    ManifestError,
    ScriptManifest,
    find_manifest,
    load_manifest,
    load_mapping_file,
)
from tfmigrate.verify.record import (
    CRASHED,
    FINAL_NPZ,
    INIT_NPZ,
    OK,
    RECORD_JSON,
    ROUNDTRIP_AFTER,
    ROUNDTRIP_BEFORE,
    TRACE_NPZ,
    RunRecord,
    load_arrays,
)
from tfmigrate.verify.sides import (
    RunPlan,
    SideRun,
    noise_label,
    noise_runs,
    run_noise,
    run_roundtrip,
    run_sides,
)


@dataclass
class VerifyOptions:
    legacy: Path
    migrated: Path
    replicas: int = 2
    steps: int = 20
    seed: int = 0
    device: str = "cpu"
    timeout: float = 600.0
    report_dir: Path | None = None
    manifest: Path | None = None
    mapping: Path | None = None
    tolerances: cmp.Tolerances = field(default_factory=cmp.Tolerances)
    script_args: tuple[str, ...] = ()
    legacy_rev: str | None = None
    legacy_cache: Path | None = (
        None  # reuse legacy runs across verify calls (same inputs → same run)
    )
    roundtrip: bool = False
    workers: int = (
        0  # >0: the migrated side runs as W MultiWorkerMirroredStrategy workers (workers.py)
    )
    # on a divergence, measure the legacy program's own drift under other kernels (sides.noise_runs)
    noise_floor: bool = True
    replay_inputs: bool = False  # the migrated replicas train on the legacy towers' batches


@dataclass
class Outcome:
    comparison: cmp.Comparison
    options: VerifyOptions
    legacy: SideRun | None = None
    migrated: SideRun | None = None
    manifest: ScriptManifest | None = None
    crash: SideRun | None = None  # the side whose user code crashed, for the traceback
    roundtrip: SideRun | None = None
    workers: list[SideRun] = field(default_factory=list)  # --workers: the workers after the chief
    noise: list[SideRun] = field(default_factory=list)  # the noise floor's legacy runs


def resolve_manifest(opts: VerifyOptions) -> ScriptManifest:
    if opts.mapping is not None:
        return load_mapping_file(opts.mapping)
    path = opts.manifest or find_manifest(opts.migrated)
    if path is None:
        # a program run as written: its variables are matched to the legacy ones by name and shape
        return ScriptManifest(
            variables=dict(SAME_NAMES),
            source="matched by name and shape",
            notes=["no manifest and no --mapping: variables matched by name and shape"],
        )
    manifest = load_manifest(path, opts.migrated)
    if not manifest.variables:
        # a conversion that kept the legacy variable names (the staged converter's TF1Variables)
        # records no mapping: matched by name and shape, its notes and announcements kept
        manifest = dataclasses.replace(manifest, variables=dict(SAME_NAMES))
    return manifest


def legacy_from_git(legacy: Path, rev: str, into: Path) -> Path:
    """The legacy script's folder as it was at ``rev`` (read-only git: ``git archive``)."""
    folder = legacy.resolve().parent
    top = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rel = folder.relative_to(Path(top).resolve()).as_posix()
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", top, "archive", "--format=tar", rev, rel or "."],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / rel / legacy.name


def legacy_cache_key(legacy: Path, opts: VerifyOptions, mapping: dict[str, str]) -> str:
    """Everything a legacy run depends on: the script's folder (.py files), the run parameters."""
    h = hashlib.sha1()
    runtime = Path(__file__).parent  # a changed legacy runtime invalidates the cache too
    for path in [*sorted(runtime.glob("*.py")), *sorted(legacy.resolve().parent.rglob("*.py"))]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(
        json.dumps(
            [
                legacy.name,
                opts.replicas * max(opts.workers, 1),
                opts.steps,
                opts.seed,
                opts.device,
                list(opts.script_args),
                sorted(mapping),
            ]
        ).encode()
    )
    return h.hexdigest()[:20]


def _cached_legacy(folder: Path | None) -> Path | None:
    if folder is None or not (folder / RECORD_JSON).exists():
        return None
    return folder if RunRecord.load(folder).status == OK else None


def side_problem(run: SideRun, timeout: float) -> str | None:
    if run.timed_out:
        progress = run.out / PROGRESS_JSON
        if progress.exists() and not json.loads(progress.read_text()).get("steps"):
            return f"the {run.side} side reached no training step in {timeout:g} s (timed out)"
        return f"the {run.side} side timed out after {timeout:g} s"
    if run.record is None:
        return (
            f"the {run.side} runtime stopped (exit status {run.returncode}) before writing its record"
            + (f":\n{run.tail()}" if run.stderr.strip() else "")
        )
    if run.record.status == CRASHED:
        return f"the {run.side} script crashed: {run.record.message}"
    if run.record.status != "ok":
        return f"the {run.side} side could not run: {run.record.message}"
    return None


def side_data(run: SideRun) -> cmp.SideData:
    assert run.record is not None
    return cmp.SideData(
        run.record,
        load_arrays(run.out / INIT_NPZ),
        load_arrays(run.out / FINAL_NPZ),
        load_arrays(run.out / TRACE_NPZ),
    )


def run_verify(opts: VerifyOptions) -> Outcome:
    try:
        manifest = resolve_manifest(opts)
    except ManifestError as exc:
        return Outcome(cmp.could_not_run(str(exc)), opts)
    if not manifest.variables:
        return Outcome(
            cmp.could_not_run(f"{manifest.source}: the variable mapping is empty"),
            opts,
            manifest=manifest,
        )

    scratch_parent = opts.report_dir / "runs" if opts.report_dir else None
    if scratch_parent is not None:
        shutil.rmtree(scratch_parent, ignore_errors=True)
        scratch_parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tfmigrate-verify-", dir=scratch_parent))
    legacy = opts.legacy
    if opts.legacy_rev:
        try:
            legacy = legacy_from_git(opts.legacy, opts.legacy_rev, workdir / "legacy-src")
        except (subprocess.CalledProcessError, ValueError, OSError) as exc:
            return Outcome(
                cmp.could_not_run(
                    f"cannot take {opts.legacy} from git rev {opts.legacy_rev}: {exc}"
                ),
                opts,
                manifest=manifest,
            )
    cache_dir = None
    if opts.legacy_cache is not None:
        cache_dir = opts.legacy_cache / legacy_cache_key(legacy, opts, manifest.variables)
    plan = RunPlan(
        legacy=legacy,
        migrated=opts.migrated,
        workdir=workdir,
        replicas=opts.replicas,
        steps=opts.steps,
        seed=opts.seed,
        device=opts.device,
        timeout=opts.timeout,
        mapping=manifest.variables,
        mapping_source=manifest.source,
        script_args=opts.script_args,
        legacy_done=_cached_legacy(cache_dir),
        roundtrip=opts.roundtrip,
        workers=opts.workers,
        replay_inputs=opts.replay_inputs,
    )
    worker_runs: list[SideRun] = []
    if opts.workers:
        from tfmigrate.verify.workers import run_worker_sides

        runs = run_worker_sides(plan)
        legacy_run, migrated_run, worker_runs = runs.legacy, runs.workers[0], runs.workers[1:]
    else:
        legacy_run, migrated_run = run_sides(plan)
    resolved = migrated_run.out / RESOLVED_MAPPING
    if resolved.exists():  # what the migrated side matched: by name, or a mapping plus names
        manifest.variables = json.loads(resolved.read_text())
    if cache_dir is not None and plan.legacy_done is None and _cached_legacy(legacy_run.out):
        _publish(legacy_run.out, cache_dir)
    outcome = Outcome(
        cmp.could_not_run(""), opts, legacy_run, migrated_run, manifest, workers=worker_runs
    )
    for run in _problem_first([legacy_run, migrated_run, *worker_runs]):
        problem = side_problem(run, opts.timeout)
        if problem:
            outcome.comparison = cmp.could_not_run(problem)
            if run.record is not None and run.record.status == CRASHED:
                outcome.crash = run
            break
    else:
        assert legacy_run.record is not None and migrated_run.record is not None  # no side_problem
        scaling = loss_scaling.scale_differentiated(legacy_run.record, migrated_run.record)
        outcome.comparison = cmp.compare(
            side_data(legacy_run), side_data(migrated_run), manifest, opts.tolerances
        )
        if outcome.comparison.verdict != cmp.COULD_NOT_RUN:
            outcome.comparison.notes += scaling
        elif "different inputs" in outcome.comparison.reason and not opts.replay_inputs:
            outcome.comparison.notes.append(
                "--replay-inputs trains the migrated replicas on the legacy towers' batches, so the "
                "training step is compared whatever the input pipelines do"
            )
        if _wants_noise_floor(opts, outcome.comparison):
            _noise_floor(plan, outcome, side_data(legacy_run), cache_dir)
        if opts.roundtrip and outcome.comparison.verdict != cmp.COULD_NOT_RUN:
            _roundtrip(plan, outcome)
        if worker_runs and outcome.comparison.verdict != cmp.COULD_NOT_RUN:
            from tfmigrate.verify.workers import add_agreement, agreement_rows

            rows = agreement_rows(
                side_data(migrated_run),
                {r.side: side_data(r) for r in worker_runs},
                opts.tolerances,
                outcome.comparison.notes,
            )
            add_agreement(outcome.comparison, rows)
    outcome.comparison.notes = (
        manifest.notes + _record_notes(legacy_run, migrated_run) + outcome.comparison.notes
    )
    if opts.report_dir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome


def _problem_first(runs: list[SideRun]) -> list[SideRun]:
    """A side whose user code crashed explains the others (stopped while waiting for it)."""
    return sorted(
        runs, key=lambda r: 0 if r.record is not None and r.record.status == CRASHED else 1
    )


def _wants_noise_floor(opts: VerifyOptions, comparison: cmp.Comparison) -> bool:
    """A divergence is checked against the legacy program's own drift before it is reported:
    rounding grown by training (chaotic programs) or a kernel's rounding larger than the update
    tolerance looks like one (docs/verify.md, "Verdict criterion")."""
    return opts.noise_floor and comparison.verdict == cmp.DIVERGED


def _publish(out: Path, cache: Path) -> None:
    """Copy a finished legacy run into the cache (atomic rename: a reader never sees half of it)."""
    tmp = cache.with_name(f"{cache.name}.{out.parent.parent.name}.{out.parent.name}")
    shutil.copytree(out, tmp, dirs_exist_ok=True)
    try:
        tmp.rename(cache)
    except OSError:  # a concurrent run may have won the race
        shutil.rmtree(tmp, ignore_errors=True)


def _noise_floor(
    plan: RunPlan, outcome: Outcome, legacy: cmp.SideData, cache_dir: Path | None
) -> None:
    """The noise floor's legacy runs (kept in the legacy cache beside the legacy run: they are as
    deterministic as it is) compared with the legacy run, then the failing rows re-judged."""
    assert outcome.manifest is not None
    floors = []
    for spec in noise_runs():
        cached = _cached_legacy(
            cache_dir.with_name(f"{cache_dir.name}.{spec.name}") if cache_dir else None
        )
        if cached is not None:
            run = SideRun(noise_label(spec), cached, 0, "", "", False, RunRecord.load(cached))
        else:
            run = run_noise(plan, spec)
            if cache_dir is not None and _cached_legacy(run.out):
                _publish(run.out, cache_dir.with_name(f"{cache_dir.name}.{spec.name}"))
        outcome.noise.append(run)
        problem = side_problem(run, plan.timeout)
        if problem:
            outcome.comparison.notes.append(f"noise floor run {spec.name} not used: {problem}")
            continue
        floors.append(
            cmp.compare(
                legacy,
                side_data(run),
                cmp.noise_manifest(outcome.manifest),
                outcome.options.tolerances,
            )
        )
    if floors:
        cmp.apply_noise_floor(outcome.comparison, floors)


def _roundtrip(plan: RunPlan, outcome: Outcome) -> None:
    run = run_roundtrip(plan)
    outcome.roundtrip = run
    problem = side_problem(run, plan.timeout)
    if problem:
        outcome.comparison = cmp.could_not_run(
            problem.replace("roundtrip side", "round trip (reload)"), outcome.comparison.notes
        )
        if run.record is not None and run.record.status == CRASHED:
            outcome.crash = run
        return
    before = load_arrays(plan.roundtrip_dir / ROUNDTRIP_BEFORE)["predictions"]
    after = load_arrays(plan.roundtrip_dir / ROUNDTRIP_AFTER)["predictions"]
    cmp.add_roundtrip(
        outcome.comparison, cmp.compare_roundtrip(before, after, outcome.options.tolerances)
    )


def _record_notes(*runs: SideRun) -> list[str]:
    return [f"{r.side}: {n}" for r in runs if r.record for n in r.record.notes]
