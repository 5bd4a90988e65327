"""Per-step metrics: metrics.jsonl (what the pipeline reads back), TensorBoard and the progress bar."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm import tqdm

from realm.training.distributed import Dist

METRICS = "metrics.jsonl"


def _logged_step(line: str) -> dict | None:
    """One metrics.jsonl line, or None for a blank one or the last line of a trainer killed while writing it."""
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None


def read_metrics(out_dir: Path) -> list[dict]:
    """The logged steps of a trainer's metrics.jsonl (what MetricsLog writes), in order; [] if there are none."""
    path = Path(out_dir) / METRICS
    if not path.exists():
        return []
    return [row for line in path.read_text().splitlines() if (row := _logged_step(line)) is not None]


class MetricsLog:
    """Per-step scalars to TensorBoard, to metrics.jsonl, and to the progress bar (rank 0 only). Each trainer logs
    `batch_seconds`: how long its step waited for its batch and built the part that depends on the model (the
    host's share of the step, where `Prefetched` builds the rest ahead)."""

    def __init__(self, out_dir: Path, total_steps: int, start_step: int, d: Dist, desc: str, progress: bool = True):
        self.enabled = d.main
        self.bar = tqdm(
            total=total_steps,
            initial=start_step,
            desc=desc,
            unit="step",
            dynamic_ncols=True,
            disable=not (progress and d.main),
        )
        self.path = Path(out_dir) / METRICS
        self.writer = None
        if self.enabled and self.path.exists():  # a resumed run rewrites the steps after its checkpoint
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if (row := _logged_step(line)) is not None and row["step"] <= start_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=start_step + 1)

    def step(self, step: int, metrics: dict[str, float], log_now: bool, total: int | None = None) -> None:
        """Log a step; `total`: the steps the run now has (a deadline settles them as it goes)."""
        if total is not None and total != self.bar.total:
            self.bar.total = total
        self.bar.update(1)
        if not (self.enabled and log_now):
            return
        assert self.writer is not None  # enabled on rank 0, where the writer exists
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self.bar.set_postfix(
            {
                k: f"{v:.3g}"
                for k, v in metrics.items()
                if k in ("loss", "accuracy", "utility", "p_null", "index_version")
            }
        )

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
