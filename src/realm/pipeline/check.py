"""`realm results --check RUN`: does a rerun of a README command agree with the record of its row?

pyserini's reproduction pages are the model: a command, the figures it should give, and a checker. A run's
figures are compared with the recorded run of the same command (`docs/runs/<name>/`, the record a README row links):
each figure agrees when it lies within the recorded 95% interval, and the budget when the run kept it. The record
is chosen among those of the same command: computed in the same precision if one was, then the newest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from realm.common.provenance import PACKAGE, describe_commit
from realm.pipeline.results_page import command_of, load_records, machine_of


@dataclasses.dataclass(frozen=True)
class Figure:
    name: str
    value: float
    interval: tuple[float, float] | None  # the 95% interval (None: a limit instead)
    at_most: float | None = None  # the minutes a run took: its budget is a deadline


@dataclasses.dataclass(frozen=True)
class Comparison:
    name: str
    value: float | None  # the checked run's; None where it did not measure it
    recorded: Figure

    @property
    def agrees(self) -> bool:
        if self.value is None:
            return False
        if self.recorded.at_most is not None:
            return self.value <= self.recorded.at_most
        assert self.recorded.interval is not None
        low, high = self.recorded.interval
        return low <= self.value <= high

    @property
    def mine(self) -> str:
        return "not measured" if self.value is None else f"{self.value:.2f}"

    @property
    def expected(self) -> str:
        if self.recorded.at_most is not None:
            return f"at most {self.recorded.at_most:.2f} (recorded {self.recorded.value:.2f})"
        assert self.recorded.interval is not None
        low, high = self.recorded.interval
        return f"{low:.2f} to {high:.2f} (recorded {self.recorded.value:.2f})"

    def line(self) -> str:
        return f"  {self.name:<42} {self.mine:>12}   {self.expected:<32} {'agrees' if self.agrees else 'DIFFERS'}"


def _interval(values: list[float] | None) -> tuple[float, float] | None:
    return (float(values[0]), float(values[1])) if values else None


def run_figures(run_dir: Path) -> dict[str, Figure]:
    """The figures of a finished run a README row reports, by name."""
    plan, stages = load_records(run_dir)
    r = {name: record["result"] for name, record in stages.items()}
    found: list[Figure] = []
    finished = max((record["finished"] for record in stages.values()), default=None)
    if finished and plan.get("began") and plan.get("budget_minutes"):
        budget = plan["budget_minutes"]
        found.append(Figure(f"minutes taken of {budget:g}", (finished - plan["began"]) / 60, None, at_most=budget))
    ev = r.get("eval", {})
    for system in ("hybrid", "dense", "bm25"):
        if ev.get(system, {}).get("exact_match_95ci"):  # records before every system had its interval: hybrid
            em = ev[system]
            found.append(Figure(f"exact match, {system}", em["exact_match"], _interval(em["exact_match_95ci"])))
    for k, gain in ev.get("realm_vs_start", {}).items():
        if k.startswith("recall@"):
            name = f"REALM minus its start, zero-shot {k}"
            found.append(Figure(name, gain["difference"], _interval(gain["difference_95ci"])))
    scored = r.get("examples", {}).get("with_retrieval")
    if scored:
        gain = scored["retrieval_gain"]
        found.append(Figure("held-out masked-LM gain", gain, _interval(scored["retrieval_gain_95ci"])))
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


def check_run(run_dir: Path, records: Path | None = None) -> tuple[bool, list[str]]:
    """(whether every recorded figure agrees, the lines that say so)."""
    reference = reference_for(run_dir, records or default_records())
    plan, _ = load_records(run_dir)
    recorded_plan, _ = load_records(reference)
    mine, recorded = run_figures(run_dir), run_figures(reference)
    if not mine:
        raise ValueError(f"{run_dir}: no finished stage with a figure to check (is the run still going?)")
    lines = [
        f"checking {run_dir} (`{command_of(plan)}`; {machine_of(plan)}; code {describe_commit(plan.get('code'))})",
        f"against {reference} ({machine_of(recorded_plan)}; code {describe_commit(recorded_plan.get('code'))})",
    ]
    if plan.get("compute_dtype") != recorded_plan.get("compute_dtype"):
        lines.append("  note: computed in another precision than the record; figures may differ for that alone")
    comparisons = [Comparison(name, mine[name].value if name in mine else None, f) for name, f in recorded.items()]
    lines += [c.line() for c in comparisons]
    differs = [c for c in comparisons if not c.agrees]
    if differs:
        lines.append("does not agree: " + "; ".join(f"{c.name} {c.mine}, expected {c.expected}" for c in differs))
    else:
        lines.append(
            f"agrees: the budget kept, and each of {len(comparisons) - 1} figures within the recorded interval"
        )
    return not differs, lines
