"""`realm results --check RUN`: does a rerun of a README command agree with the record of its row?

pyserini's reproduction pages are the model: a command, the figures it should give, and a checker. A run's
figures are compared with the recorded run of the same command (`docs/runs/<name>/`, the record a README row links).
A figure agrees when the difference between the two runs is within what both runs' spread allows at 95%: paired
over the questions (or held-out sentences) both scored where both records keep their per-item outcomes, else from
both runs' intervals (the checked run's spread counts as much as the record's). The budget agrees when the run
ended within the report's band of it (report.py: BUDGET_BAND). The record is chosen among those of the same
command: computed in the same precision if one was, then the newest.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from realm.common.provenance import PACKAGE, describe_commit
from realm.eval.intervals import paired_difference
from realm.pipeline.records import EvalRecord, ExamplesRecord
from realm.pipeline.report import BUDGET_BAND
from realm.pipeline.results_page import SEEDS_SUMMARY, command_of, load_records, machine_of

Z95 = 1.96


@dataclasses.dataclass(frozen=True)
class Figure:
    """A figure a run reports: its value and 95% interval, or for the minutes taken the `budget` they are held to;
    `items`: what each scored item (a dev question's row, a held-out sentence's place in the seeded order) gave,
    where the record keeps it, so that two runs are compared on the items both scored."""

    name: str
    value: float
    interval: tuple[float, float] | None  # the 95% interval (None: a budget instead)
    budget: float | None = None  # the minutes a run may take: its budget is a deadline
    items: dict[int, float] | None = None
    next_run: tuple[float, float] | None = None  # a seeds record: where one more run should fall (95%)

    @property
    def standard_error(self) -> float | None:
        return (self.interval[1] - self.interval[0]) / (2 * Z95) if self.interval else None


@dataclasses.dataclass(frozen=True)
class Comparison:
    name: str
    mine: Figure | None  # the checked run's; None where it did not measure it
    recorded: Figure

    @property
    def difference(self) -> tuple[float, tuple[float, float], str] | None:
        """(mine - recorded, its 95% interval, how it was found); None: not measured, or a budget."""
        mine, recorded = self.mine, self.recorded
        if mine is None or recorded.budget is not None or recorded.next_run is not None:
            return None
        if mine.items and recorded.items:
            shared = sorted(mine.items.keys() & recorded.items.keys())
            if len(shared) >= 2:
                difference, interval = paired_difference(
                    [mine.items[i] for i in shared], [recorded.items[i] for i in shared]
                )
                return difference, interval, f"paired over {len(shared)}"
        spreads = [f.standard_error for f in (mine, recorded) if f.standard_error is not None]
        margin = Z95 * math.sqrt(sum(se * se for se in spreads))
        difference = mine.value - recorded.value
        return difference, (difference - margin, difference + margin), "both runs' intervals"

    @property
    def agrees(self) -> bool:
        if self.mine is None:
            return False
        if self.recorded.budget is not None:
            low, high = BUDGET_BAND
            return low * self.recorded.budget <= self.mine.value <= high * self.recorded.budget
        if self.recorded.next_run is not None:
            low, high = self.recorded.next_run
            return low <= self.mine.value <= high
        found = self.difference
        assert found is not None
        _, (low, high) = found[:2]
        return low <= 0 <= high

    @property
    def shown(self) -> str:
        return "not measured" if self.mine is None else f"{self.mine.value:.2f}"

    @property
    def expected(self) -> str:
        if self.recorded.budget is not None:
            low, high = (share * self.recorded.budget for share in BUDGET_BAND)
            return f"{low:.2f} to {high:.2f} (recorded {self.recorded.value:.2f})"
        if self.recorded.next_run is not None:
            low, high = self.recorded.next_run
            return f"{low:.2f} to {high:.2f} (one more run of the seeds' recipe; their mean {self.recorded.value:.2f})"
        found = self.difference
        if found is None:
            return f"recorded {self.recorded.value:.2f}"
        difference, (low, high), how = found
        return f"recorded {self.recorded.value:.2f}; difference {difference:+.2f} [{low:+.2f}, {high:+.2f}], {how}"

    def line(self) -> str:
        return f"  {self.name:<42} {self.shown:>12}   {self.expected:<60} {'agrees' if self.agrees else 'DIFFERS'}"


def run_figures(run_dir: Path) -> dict[str, Figure]:
    """The figures of a finished run a README row reports, by name."""
    plan, stages = load_records(run_dir)
    r = {name: record["result"] for name, record in stages.items()}
    found: list[Figure] = []
    finished = max((record["finished"] for record in stages.values()), default=None)
    if finished and plan.get("began") and plan.get("budget_minutes"):
        budget = plan["budget_minutes"]
        found.append(Figure(f"minutes taken of {budget:g}", (finished - plan["began"]) / 60, None, budget=budget))
    ev = EvalRecord.from_dict(r["eval"]) if "eval" in r else None
    for system in ("hybrid", "dense", "bm25"):
        score = ev.systems.get(system) if ev else None
        if ev and score and score.interval:  # records before every system had its interval: hybrid
            items = ev.outcomes.exact_match_by_row(system) if ev.outcomes else None
            found.append(Figure(f"exact match, {system}", score.exact_match, score.interval, None, items))
    for k, gain in (ev.realm_vs_start.recall if ev and ev.realm_vs_start else {}).items():
        found.append(Figure(f"REALM minus its start, zero-shot recall@{k}", gain.difference, gain.interval))
    if "examples" in r:
        scored = ExamplesRecord.from_dict(r["examples"]).with_retrieval
        gains = scored.per_sentence_gain  # in the seeded order: the same first sentences in every run
        items = dict(enumerate(gains)) if gains else None  # points
        found.append(Figure("held-out masked-LM gain", scored.retrieval_gain, scored.interval, None, items))
    return {f.name: f for f in found}


def recorded_runs(records: Path, command: str) -> list[Path]:
    """The recorded runs of `command` under `records` (a folder of run records, e.g. docs/runs)."""
    if not records.is_dir():
        raise FileNotFoundError(f"{records}: no such folder of run records (pass --against docs/runs of a clone)")
    commands = {
        d: command_of(json.loads((d / "plan.json").read_text()))
        for d in sorted(records.iterdir())
        if (d / "plan.json").is_file()
    }
    same = [d for d, recorded in commands.items() if recorded == command]
    if not same:
        known = sorted(set(commands.values()))
        raise ValueError(f"no record of `{command}` under {records}; recorded commands: {'; '.join(known)}")
    return same


def reference_for(run_dir: Path, records: Path) -> Path:
    """The record a run is checked against: the same command, the same precision where one was, the newest."""
    plan, _ = load_records(run_dir)
    same = [d for d in recorded_runs(records, command_of(plan)) if d.resolve() != run_dir.resolve()]
    if not same:
        raise ValueError(
            f"{run_dir} is the only record of `{command_of(plan)}` under {records}: nothing to check against"
        )

    def rank(record: Path) -> tuple[bool, float]:
        other, stages = load_records(record)
        finished = max((s["finished"] for s in stages.values()), default=0.0)
        return other.get("compute_dtype") == plan.get("compute_dtype"), finished

    return max(same, key=rank)


def default_records() -> Path:
    """docs/runs of the working folder, else of the clone the package was installed from."""
    here = Path("docs") / "runs"
    return here if here.is_dir() else PACKAGE.parents[1] / "docs" / "runs"


def seeds_record(records: Path, command: str) -> Path | None:
    """A folder of `records` holding a seeds summary of `command` (pipeline/seeds.py), if there is one."""
    for folder in sorted(records.iterdir()) if records.is_dir() else []:
        path = folder / SEEDS_SUMMARY
        if path.is_file() and command_of({"options": {"command": json.loads(path.read_text())["command"]}}) == command:
            return folder
    return None


def seed_figures(folder: Path) -> dict[str, Figure]:
    """A seeds record's figures: their mean, and the interval one more run should fall in (or the budget)."""
    summary = json.loads((folder / SEEDS_SUMMARY).read_text())
    figures = {}
    for name, f in summary["figures"].items():
        budget = f.get("budget")
        next_run = None if budget is not None else (f["next_run_95ci"][0], f["next_run_95ci"][1])
        figures[name] = Figure(name, f["mean"], None, budget=budget, next_run=next_run)
    return figures


def check_run(run_dir: Path, records: Path | None = None) -> tuple[bool, list[str]]:
    """(whether every recorded figure agrees, the lines that say so). A seeds record of the same command is
    preferred: its spread is training's as well as the questions'."""
    records = records or default_records()
    plan, _ = load_records(run_dir)
    seeds = seeds_record(records, command_of(plan))
    reference = next(iter(sorted(seeds.glob("seed-*")))) if seeds is not None else reference_for(run_dir, records)
    recorded_plan, _ = load_records(reference)
    mine = run_figures(run_dir)
    recorded = seed_figures(seeds) if seeds is not None else run_figures(reference)
    if not mine:
        raise ValueError(f"{run_dir}: no finished stage with a figure to check (is the run still going?)")
    against = f"the seeds of {seeds}" if seeds is not None else str(reference)
    lines = [
        f"checking {run_dir} (`{command_of(plan)}`; {machine_of(plan)}; code {describe_commit(plan.get('code'))})",
        f"against {against} ({machine_of(recorded_plan)}; code {describe_commit(recorded_plan.get('code'))})",
    ]
    if plan.get("compute_dtype") != recorded_plan.get("compute_dtype"):
        lines.append("  note: computed in another precision than the record; figures may differ for that alone")
    comparisons = [Comparison(name, mine.get(name), f) for name, f in recorded.items()]
    lines += [c.line() for c in comparisons]
    differs = [c for c in comparisons if not c.agrees]
    if differs:
        lines.append("does not agree: " + "; ".join(f"{c.name} {c.shown}, expected {c.expected}" for c in differs))
    else:
        figures = sum(1 for c in comparisons if c.recorded.budget is None)
        lines.append(
            f"agrees: the budget kept, and each of {figures} figures within what the runs' spread allows (95%)"
        )
    return not differs, lines
