"""Show an Outcome: rich terminal table, and in --report DIR report.json, report.md, loss.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tfmigrate.verify import compare as cmp
from tfmigrate.verify.criterion import SCALAR_RESOLUTION, percent
from tfmigrate.verify.verifier import Outcome

EXACT_FLOOR = 1e-10  # where a zero difference is drawn on the log axis
STATUS_STYLE = {cmp.PASS: "green", cmp.FAIL: "bold red", cmp.EXPECTED: "yellow", cmp.UNMATCHED: "dim", cmp.NOISE: "cyan"}
VERDICT_TEXT = {
    cmp.EQUIVALENT: ("EQUIVALENT", "green"),
    cmp.DIVERGED: ("DIVERGED", "red"),
    cmp.ANNOUNCED: ("DIFFERS AS ANNOUNCED", "yellow"),
    cmp.COULD_NOT_RUN: ("COULD NOT RUN", "red"),
}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _side_summary(outcome: Outcome) -> dict[str, dict[str, Any]]:
    sides: dict[str, dict[str, Any]] = {}
    for run in (outcome.legacy, outcome.migrated, *outcome.workers, outcome.roundtrip, *outcome.noise):
        if run is None:
            continue
        rec = run.record
        sides[run.side] = {
            "status": rec.status if rec else "no record",
            "message": rec.message if rec else "",
            "traceback": rec.traceback if rec else "",
            "steps": len(rec.steps) if rec else 0,
            "devices": rec.devices if rec else None,
            "steps_per_second": rec.steps_per_second() if rec else None,
            "peak_memory_bytes": rec.peak_memory_bytes if rec else None,
            "memory_source": rec.memory_source if rec else "",
            "returncode": run.returncode,
            "timed_out": run.timed_out,
            "stdout_tail": "\n".join(run.stdout.splitlines()[-20:]),
            "stderr_tail": run.tail(40) if (rec is None or rec.status != "ok") else "",
        }
    return sides


def to_json(outcome: Outcome) -> dict[str, Any]:
    o = outcome.options
    return {
        "verdict": outcome.comparison.verdict,
        "exit_code": outcome.comparison.exit_code,
        "reason": outcome.comparison.reason,
        "first_divergence": outcome.comparison.first_divergence,
        "legacy": str(o.legacy),
        "migrated": str(o.migrated),
        "replicas": o.replicas,
        "workers": o.workers,  # 0: one process; else replicas is per worker
        "steps": o.steps,
        "steps_compared": outcome.comparison.steps_compared,
        "seed": o.seed,
        "device": o.device,
        "manifest": outcome.manifest.source if outcome.manifest else None,
        "tolerances": vars(o.tolerances),
        "rows": [vars(r) for r in outcome.comparison.rows],
        "series": [vars(s) for s in outcome.comparison.series],
        "notes": outcome.comparison.notes,
        "sides": _side_summary(outcome),
    }


def _short(path: Path) -> str:
    """'towers/cifar_average/train.py' reads better than 'train.py' vs 'train.py'."""
    parts = path.parts
    return "/".join(parts[-3:]) if len(parts) >= 3 else str(path)


def _first_col(row: cmp.Row) -> str:
    if row.first_step is not None:
        return f"step {row.first_step}"
    return "final" if row.status == cmp.FAIL else ""


def print_terminal(outcome: Outcome, console: Console | None = None) -> None:
    console = console or Console()
    comp = outcome.comparison
    if comp.rows:
        o = outcome.options
        table = Table(title=f"tfmigrate verify: {_short(o.legacy)} vs {_short(o.migrated)}", title_justify="left",
                      show_edge=False, pad_edge=False)
        table.add_column("status", no_wrap=True)
        table.add_column("quantity", overflow="fold", ratio=3)
        table.add_column("kind", no_wrap=True)
        table.add_column("steps", justify="right", no_wrap=True)
        table.add_column("max |Δ|", justify="right", no_wrap=True)
        table.add_column("Δ update", justify="right", no_wrap=True)
        table.add_column("first", no_wrap=True)
        table.add_column("note", overflow="fold", ratio=2)
        for r in comp.rows:
            style = STATUS_STYLE.get(r.status, "")
            table.add_row(f"[{style}]{r.status.upper()}[/]", r.quantity, r.category, str(r.steps_compared),
                          _num(r.max_abs), percent(r.update_error), _first_col(r), r.note)
        console.print(table)
    sides = _side_summary(outcome)
    perf = []
    for name, s in sides.items():
        sps = s["steps_per_second"]
        mem = s["peak_memory_bytes"]
        if s["status"] != "ok":
            perf.append(f"{name}: {s['status']}")
            continue
        if name == "roundtrip":
            continue
        perf.append(f"{name}: {sps:.1f} steps/s after warm-up" if sps else f"{name}: - steps/s")
        if mem:
            perf[-1] += f", peak {mem / 2**20:.0f} MiB ({s['memory_source']})"
    if perf:
        console.print("  " + " | ".join(perf), style="dim")
    for note in comp.notes:
        console.print(f"  note: {note}", style="dim", markup=False)
    if outcome.crash is not None and outcome.crash.record is not None:
        body = Text(outcome.crash.record.traceback.rstrip() or outcome.crash.record.message, overflow="fold")
        console.print(Panel(body, title=f"{outcome.crash.side} script traceback", border_style="red"))
    text, style = VERDICT_TEXT[comp.verdict]
    console.print(f"[bold {style}]{text}[/]" + (f": {comp.reason}" if comp.reason else ""), highlight=False)


def to_markdown(outcome: Outcome) -> str:
    data = to_json(outcome)
    comp = outcome.comparison
    text, _ = VERDICT_TEXT[comp.verdict]
    lines = [
        f"# tfmigrate verify: {text}",
        "",
        f"- legacy: `{data['legacy']}`",
        f"- migrated: `{data['migrated']}`",
        f"- {data['replicas']} replicas on {data['device']}, {data['steps']} steps requested, "
        f"{data['steps_compared']} compared, seed {data['seed']}",
        f"- manifest: `{data['manifest']}`",
    ]
    if comp.reason:
        lines += ["", f"**{comp.reason}**"]
    if comp.rows:
        lines += ["", "| quantity | kind | steps | max abs diff | max rel diff | update error | status | first | note |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in comp.rows:
            lines.append(f"| `{r.quantity}` | {r.category} | {r.steps_compared} | {_num(r.max_abs)} | "
                         f"{_num(r.max_rel)} | {percent(r.update_error)} | {r.status.upper()} | {_first_col(r)} | "
                         f"{r.note} |")
    lines += ["", "| side | status | steps/s (after warm-up) | peak memory |", "|---|---|---|---|"]
    for name, s in data["sides"].items():
        if name == "roundtrip":
            continue
        sps = f"{s['steps_per_second']:.1f}" if s["steps_per_second"] else "-"
        mem = f"{s['peak_memory_bytes'] / 2**20:.0f} MiB ({s['memory_source']})" if s["peak_memory_bytes"] else "-"
        lines.append(f"| {name} | {s['status']} | {sps} | {mem} |")
    if comp.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in comp.notes]
    if outcome.crash is not None and outcome.crash.record is not None:
        lines += ["", f"## {outcome.crash.side} traceback", "", "```", outcome.crash.record.traceback.rstrip(), "```"]
    t = outcome.options.tolerances
    lines += ["", f"Tolerances: fetched scalars {t.scalar_text()}; variables: {t.variable_text()}. "
              "Update error: ‖Δmigrated − Δlegacy‖ / ‖Δlegacy‖ of a step, the largest over the steps.", ""]
    if comp.series:
        lines += ["![loss curves](loss.png)", ""]
    return "\n".join(lines)


def plot(outcome: Outcome, path: Path) -> bool:
    series = outcome.comparison.series
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = sorted(series, key=lambda s: ("loss" not in s.label.lower(), s.label))[:4]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 2],
                                      constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(chosen):
        c = colors[i % len(colors)]
        top.plot(s.steps, s.legacy, "-", color=c, lw=2, alpha=0.6, label=f"{s.label} — legacy (TF1)")
        top.plot(s.steps, s.migrated, "o--", color=c, ms=3, lw=1, label=f"{s.label} — migrated (TF2)")
        diff = [abs(a - b) for a, b in zip(s.legacy, s.migrated, strict=True)]
        bottom.plot(s.steps, [max(d, EXACT_FLOOR) for d in diff], "o-", color=c, ms=3, lw=1, label=s.label)
    t = outcome.options.tolerances
    ref = chosen[0]
    tolerance = [max(t.atol, (SCALAR_RESOLUTION if step <= t.early_steps else t.rtol) * abs(v))
                 for step, v in zip(ref.steps, ref.legacy, strict=True)]
    bottom.step(ref.steps, tolerance, where="mid", color="grey", ls=":", lw=1.2, label="tolerance")
    bottom.set_yscale("log")
    bottom.set_ylim(bottom=EXACT_FLOOR / 3)
    bottom.text(0.99, 0.02, "points on the floor: bit-identical", transform=bottom.transAxes, ha="right",
                va="bottom", fontsize=7, color="grey")
    from matplotlib.ticker import MaxNLocator

    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("|legacy − migrated|")
    bottom.set_xlabel("training step")
    top.set_ylabel("value")
    first = outcome.comparison.first_divergence
    if first and first.get("step"):
        for ax in (top, bottom):
            ax.axvline(first["step"], color="red", ls="--", lw=1)
        top.annotate(f"first divergence: {first['quantity']}", (first["step"], top.get_ylim()[1]),
                     xytext=(4, -12), textcoords="offset points", color="red", fontsize=8)
    text, style = VERDICT_TEXT[outcome.comparison.verdict]
    fig.suptitle(f"{text}", color="darkgreen" if style == "green" else "darkred", fontweight="bold")
    top.set_title(f"{_short(outcome.options.legacy)}  vs  {_short(outcome.options.migrated)}  "
                  f"({outcome.options.replicas} replicas)", fontsize=9)
    top.legend(fontsize=7, loc="upper right")
    bottom.legend(fontsize=7, loc="upper left")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(outcome: Outcome, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(to_json(outcome), indent=2, default=str))
    has_plot = plot(outcome, folder / "loss.png")
    md = to_markdown(outcome)
    if not has_plot:
        md = md.replace("![loss curves](loss.png)\n", "")
    (folder / "report.md").write_text(md)
