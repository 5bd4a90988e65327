"""`realm pipeline --seeds N`: one recipe run N times, seeds 0 to N-1, so that a figure comes with training's spread.

Each seed is a run of its own in `<run>/seed-<k>/` (its own plan, budget and report; a cut run resumes where it
stopped, a finished seed is skipped), with every trainer seeded with k (data order, masks, dropout); the dev
questions and held-out sentences are the same for every seed (their orders have seeds of their own), so the seeds
can be paired. `<run>/seeds.json` and `seeds.md` then give each headline figure per seed, their mean and standard
deviation, the 95% t-interval of the mean, and the 95% interval in which one more run should fall (what
`realm results --check` holds a rerun to where the record is a seeds folder).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from realm.common.io import write_atomic, write_json_atomic
from realm.config import Preset
from realm.eval.intervals import seed_interval
from realm.pipeline.check import run_figures
from realm.pipeline.document import ReportDocument
from realm.pipeline.results_page import SEEDS_SUMMARY


def seeded(preset: Preset, seed: int) -> Preset:
    """`preset` with every trainer seeded with `seed`."""
    return dataclasses.replace(
        preset,
        ict=dataclasses.replace(preset.ict, seed=seed),
        pretrain=dataclasses.replace(preset.pretrain, seed=seed),
        reading=dataclasses.replace(preset.reading, seed=seed),
        qa=dataclasses.replace(preset.qa, seed=seed),
    )


def seed_dir(run_dir: Path, seed: int) -> Path:
    return Path(run_dir) / f"seed-{seed}"


def summarise_seeds(run_dirs: list[Path]) -> dict:
    """Each figure every seed's run reports (check.py: run_figures): its values by seed, mean, standard deviation,
    the t-interval of the mean and the interval for one more run (two seeds at least)."""
    if len(run_dirs) < 2:
        raise ValueError("a summary over seeds needs at least two seeds' runs")
    figures = [run_figures(d) for d in run_dirs]
    names = [name for name in figures[0] if all(name in f for f in figures[1:])]
    summary: dict = {"runs": [d.name for d in run_dirs], "figures": {}}
    for name in names:
        values = [f[name].value for f in figures]
        mean, sd, (low, high), (next_low, next_high) = seed_interval(values)
        summary["figures"][name] = {
            "values": [round(v, 4) for v in values],
            "mean": round(mean, 4),
            "sd": round(sd, 4),
            "mean_95ci": [round(low, 4), round(high, 4)],
            "next_run_95ci": [round(next_low, 4), round(next_high, 4)],
            "budget": figures[0][name].budget,
        }
    return summary


def write_seeds(run_dir: Path, summary: dict, command: str) -> Path:
    """`<run>/seeds.json` and `seeds.md` from a `summarise_seeds` summary."""
    run_dir = Path(run_dir)
    write_json_atomic(run_dir / SEEDS_SUMMARY, summary | {"command": command})
    doc = ReportDocument()
    doc.heading(f"`{command}`: {len(summary['runs'])} seeds", 1)
    doc.paragraph(
        "Each figure per seed (its own run: " + ", ".join(f"[{r}]({r}/results.md)" for r in summary["runs"]) + "), "
        "their mean and standard deviation, the 95% t-interval of the mean (training's spread, which each run's "
        "own interval over questions leaves out), and the 95% interval one more run should fall in."
    )
    rows = []
    for name, f in summary["figures"].items():
        low, high = f["mean_95ci"]
        next_low, next_high = f["next_run_95ci"]
        values = ", ".join(f"{v:.2f}" for v in f["values"])
        rows.append(
            [
                name,
                values,
                f"{f['mean']:.2f}",
                f"{f['sd']:.2f}",
                f"[{low:.2f}, {high:.2f}]",
                f"[{next_low:.2f}, {next_high:.2f}]",
            ]
        )
    doc.table(["figure", "per seed", "mean", "sd", "mean, 95% t-interval", "one more run, 95%"], rows)
    out = run_dir / "seeds.md"
    write_atomic(out, lambda tmp: tmp.write_text(doc.markdown(run_dir), encoding="utf-8"))
    return out


def read_seeds(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SEEDS_SUMMARY
    return json.loads(path.read_text()) if path.is_file() else None
