"""The stage engine of `realm pipeline`: a stage runs once for its fingerprint, and resumes after a cut.

A stage's fingerprint covers its settings, the content of its input files and the fingerprints of the
stages it reads. `<run>/stages/<stage>.json` is written atomically when the stage finishes: a matching
record means skip; a started but unrecorded stage resumes in its folder; a stage whose settings changed
starts in a fresh folder and the old one is kept as `<stage>.stale-<time>`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from realm.common.io import write_json_atomic
from realm.config import RUN_CONFIG, record_run_config
from realm.data.sources import BUILTIN_CORPORA
from realm.training.metrics import read_metrics

log = logging.getLogger(__name__)

STAGES = "stages"  # stage records, beside the stage folders


def fingerprint_of(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def describe_input(spec: str) -> dict:
    """What identifies an input file: the built-in corpus name, or the file's content digest. Not its path or
    mtime: a moved or re-copied file is the same input, and must not re-run hours of training."""
    if spec in BUILTIN_CORPORA:
        return {"builtin": spec}
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"input {spec!r} is not a file (nor one of {', '.join(BUILTIN_CORPORA)})")
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")  # ~0.9 GB/s here: seconds even for a full Wikipedia dump
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}


@dataclass(frozen=True)
class StageRecord:
    name: str
    fingerprint: str
    seconds: float  # in the invocation that finished it
    finished: float
    result: dict
    resumed: bool = False  # so `seconds` leaves out the time before the interruption


class Stages:
    """Runs named stages into `run_dir/<name>/`; a stage whose record matches its fingerprint is skipped.
    Records live in `run_dir/stages/` (`<name>.json` when done, `<name>.started.json` while running), so a
    stage folder holds only what the stage wrote."""

    def __init__(
        self, run_dir: Path, echo: Callable[[str], None] = print, on_finish: Callable[[], object] = lambda: None
    ):
        self.run_dir = Path(run_dir)
        self.echo = echo
        self.on_finish = on_finish  # after each stage that ran
        self.records: dict[str, StageRecord] = {}

    def output(self, stage: str | StageRecord, *parts: str) -> Path:
        """A path inside a stage's folder (`stage`: its name, or its record), e.g. output("realm", "retriever")."""
        return self.run_dir.joinpath(stage if isinstance(stage, str) else stage.name, *parts)

    def _record_path(self, name: str) -> Path:
        return self.run_dir / STAGES / f"{name}.json"

    def _started_path(self, name: str) -> Path:
        return self.run_dir / STAGES / f"{name}.started.json"

    def record(self, name: str) -> StageRecord | None:
        path = self._record_path(name)
        return StageRecord(**json.loads(path.read_text())) if path.is_file() else None

    def run(self, name: str, settings: dict, work: Callable[[Path, bool], dict]) -> StageRecord:
        """`work(folder, resume)` does the stage and returns its results (JSON-serialisable)."""
        folder = self.run_dir / name
        fingerprint = fingerprint_of({"stage": name, **settings})
        done = self.record(name)
        if done is not None and done.fingerprint == fingerprint and folder.is_dir():
            self.echo(f"[pipeline] {name}: up to date ({done.seconds / 60:.1f} min when it ran)")
            self.records[name] = done
            return done
        started = self._started_path(name)
        resume = done is None and started.is_file() and json.loads(started.read_text())["fingerprint"] == fingerprint
        if folder.exists() and not resume:
            stale = folder.with_name(f"{name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
            folder.rename(stale)
            for path in (self._record_path(name), started):  # its provenance goes with it
                if path.is_file():
                    path.rename(stale / path.name.replace(name, "stage", 1))
            self.echo(f"[pipeline] {name}: settings changed; the old output is kept in {stale}")
        self._record_path(name).unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(started, {"fingerprint": fingerprint, "settings": settings})
        self.echo(f"[pipeline] {name}: {'resuming' if resume else 'running'}")
        began = time.monotonic()
        result = work(folder, resume)
        if not (folder / RUN_CONFIG).exists():  # a trainer's recipe wrote its own, with its resolved config
            record_run_config(folder, {"stage": name, **settings}, resume=False)
        record = StageRecord(name, fingerprint, time.monotonic() - began, time.time(), result, resume)
        write_json_atomic(self._record_path(name), dataclasses.asdict(record))
        started.unlink(missing_ok=True)
        self.echo(f"[pipeline] {name}: done in {record.seconds / 60:.1f} min")
        self.records[name] = record
        self.on_finish()
        return record


def last_metrics(folder: Path, window: int = 20) -> dict[str, float]:
    """Means of the last `window` logged steps of a trainer's metrics.jsonl (one batch is too noisy)."""
    rows = read_metrics(folder)
    tail = rows[-window:]
    keys = {k for row in tail for k, v in row.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
    out = {k: sum(row[k] for row in tail if k in row) / sum(1 for row in tail if k in row) for k in sorted(keys)}
    return {"steps": rows[-1]["step"], **out} if rows else {}


def stepping_seconds(folder: Path) -> float | None:
    """The seconds a trainer's run spent in its steps: the mean seconds a step between logged rows (`step_seconds`),
    times its steps. None: fewer than two rows."""
    rows = read_metrics(folder)
    per_step = step_seconds(rows)
    return per_step * rows[-1]["step"] if per_step is not None else None


def step_seconds(rows: list[dict], first: int = 0, last: int | None = None) -> float | None:
    """The mean seconds a step of a trainer's logged `rows` (metrics.jsonl) between steps `first` and `last`, from
    the rows' wall times. Left out: rows that also scored the dev questions, and gaps over ten times the median (a
    cut and a resume). None: no two rows in the range."""
    pairs = [
        (b["time"] - a["time"], b["step"] - a["step"])
        for a, b in zip(rows, rows[1:])
        if b["step"] > a["step"] and "dev_em" not in b and a["step"] >= first and (last is None or b["step"] <= last)
    ]
    if not pairs:
        return None
    median = sorted(seconds / steps for seconds, steps in pairs)[len(pairs) // 2]
    kept = [(seconds, steps) for seconds, steps in pairs if seconds / steps <= 10 * median]
    return sum(seconds for seconds, _ in kept) / sum(steps for _, steps in kept)
