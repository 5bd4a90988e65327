"""Training infrastructure shared by the ICT and REALM recipes: data order, checkpoints, logging, DDP.

Resuming is exact: the data order is a function of (seed, epoch), per-example randomness is seeded by
the example's global index, and the checkpoint holds the weights (safetensors), optimizer and
scheduler state, every rank's torch RNG state (dropout) and the data position. So after a kill -9, a
resumed run sees exactly the batches an uninterrupted run would have seen: none lost, none repeated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn
from tqdm import tqdm

from realm.common.io import write_dir_atomic, write_json_atomic

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"


# -- distributed ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


ONE_PROCESS = Dist()  # the default: no torchrun, no process group


def setup_distributed() -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK: join the process group (gloo on CPU, nccl on GPUs, one GPU per
    rank: this process's default CUDA device becomes GPU LOCAL_RANK of its machine)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Dist()
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size())


def barrier(d: Dist) -> None:
    """Wait for every rank (nothing to wait for in one process)."""
    if d.world_size > 1:
        dist.barrier()


def broadcast(value, d: Dist):
    """Rank 0's value on every rank (e.g. which index version to use this step)."""
    if d.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_every_rank(flag: bool, d: Dist) -> bool:
    """True when `flag` is true on every rank (e.g. every rank could read a file)."""
    if d.world_size == 1:
        return flag
    flags: list = [None] * d.world_size
    dist.all_gather_object(flags, flag)
    return all(flags)


# -- data order -----------------------------------------------------------------------------------
@dataclass
class DataPosition:
    epoch: int = 0
    offset: int = 0


class DataOrder:
    """Epoch-wise permutations of n examples, seeded by (seed, epoch): reproducible from a position alone."""

    def __init__(self, n: int, seed: int):
        if n == 0:
            raise ValueError("no training examples")
        self.n, self.seed = n, seed
        self._cache: tuple[int, np.ndarray] | None = None

    def _perm(self, epoch: int) -> np.ndarray:
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._cache[1]

    def take(self, position: DataPosition, size: int) -> tuple[np.ndarray, DataPosition]:
        """The next `size` example indices (crossing epochs as needed) and the position after them."""
        out: list[int] = []
        epoch, offset = position.epoch, position.offset
        while len(out) < size:
            perm = self._perm(epoch)
            chunk = perm[offset : offset + size - len(out)]
            out.extend(chunk.tolist())
            offset += len(chunk)
            if offset >= self.n:
                epoch, offset = epoch + 1, 0
        return np.array(out, dtype=np.int64), DataPosition(epoch, offset)

    def batches(self, position: DataPosition, size: int, d: Dist) -> Iterator[tuple[DataPosition, int, np.ndarray]]:
        """Endless batches from `position` on: the position after each, its epoch and this rank's share of it."""
        while True:
            epoch = position.epoch
            indices, position = self.take(position, size)
            yield position, epoch, indices[d.rank :: d.world_size]


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """Randomness of one example in one epoch (masks, ICT sentence choice): independent of batching and ranks."""
    return np.random.default_rng([seed, epoch, index])


PREFETCH_ENV = "REALM_PREFETCH"  # batches built ahead of the step (0: none); default `prefetch_depth`
T = TypeVar("T")


def prefetch_depth(device: torch.device) -> int:
    """How many batches (their model-independent part) are built ahead of the step, in a background thread:
    $REALM_PREFETCH, else 2 on a GPU, whose steps would otherwise wait on the host, and 1 on a CPU (measured on 2 cores:
    docs/log/2026-11-28-benchmarks-batches-built-ahead-issue-61.md)."""
    value = os.environ.get(PREFETCH_ENV, "").strip()
    if not value:
        return 2 if device.type == "cuda" else 1
    if not value.isdigit():
        raise ValueError(f"${PREFETCH_ENV} must be a whole number of batches (0: none), not {value!r}")
    return int(value)


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetched(Generic[T]):
    """The items of `items`, in their order, each built up to `depth` ahead in a background thread (0: built when
    asked, in the caller's thread). The items must not depend on what the caller does between them (the model's
    weights): then the sequence is the same at any depth, and a resumed run that restarts `items` from its
    checkpoint's data position sees what an uninterrupted one would. What the thread uses (a tokenizer: Hugging
    Face's fast tokenizers are not safe to share between threads) must be its own. An error in the thread is
    raised in the caller at the item it stopped; `close` (or leaving the `with`) stops the thread."""

    def __init__(self, items: Iterator[T], depth: int):
        self.items, self.depth = items, depth
        self.stopping = threading.Event()
        self.built: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.thread: threading.Thread | None = None
        if depth > 0:
            self.thread = threading.Thread(target=self._build, name="realm-prefetch", daemon=True)
            self.thread.start()

    def _put(self, item: object) -> bool:
        while not self.stopping.is_set():
            try:
                self.built.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _build(self) -> None:
        try:
            for item in self.items:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as error:  # handed to the caller, who raises it
            self._put(_Failed(error))

    def __iter__(self) -> Prefetched[T]:
        return self

    def __next__(self) -> T:
        if self.thread is None:
            return next(self.items)
        item = self.built.get()
        if isinstance(item, _Failed):
            raise item.error
        if item is _END:
            self.built.put(_END)  # every later call ends too
            raise StopIteration
        return item

    def close(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()

    def __enter__(self) -> Prefetched[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- optimisation ---------------------------------------------------------------------------------
def bert_optimizer(
    model: nn.Module, lr: float, weight_decay: float = 0.01, prefix_lrs: dict[str, float] | None = None
) -> torch.optim.AdamW:
    """BERT's default optimiser: AdamW, eps 1e-6, no weight decay on biases and LayerNorm. Parameters whose
    name starts with a key of `prefix_lrs` get that learning rate (first match); each group records its
    prefix ("" for the rest) so a schedule can treat it apart. The fused kernel updates each tensor in one pass
    (45M MiniLM parameters: 40 ms a step against 140 ms for the per-op `foreach` update, on 2 CPU cores)."""
    prefix_lrs = prefix_lrs or {}
    groups: dict[tuple[bool, str], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            no_decay = param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name
            prefix = next((p for p in prefix_lrs if name.startswith(p)), "")
            groups.setdefault((no_decay, prefix), []).append(param)
    return torch.optim.AdamW(
        [
            {
                "params": params,
                "weight_decay": 0.0 if no_decay else weight_decay,
                "lr": prefix_lrs.get(prefix, lr),
                "prefix": prefix,
            }
            for (no_decay, prefix), params in sorted(groups.items())
        ],
        lr=lr,
        eps=1e-6,
        fused=True,
    )


@dataclass
class LinearSchedule:
    """Linear warm-up over `warmup` steps, then (not before `decay_from`) linear decay to 0 at `total`. Groups whose
    prefix is in `starts` keep a zero rate until that step, then warm up (e.g. towers frozen while a fresh head
    learns). `flat_until`: where a flat phase ends (REALM's reader warm-up; 0: none). Mutable: a deadline settles
    `flat_until`, `total` and `decay_from` as the run goes (`TimedSchedule`); every checkpoint holds it, so a
    resumed run keeps the schedule its first part ran on. `sizings`: how often a deadline has sized the decaying
    phase (at its start, then once from its timed steps)."""

    warmup: int
    total: int
    decay_from: int = 0
    starts: dict[str, int] = field(default_factory=dict)
    flat_until: int = 0
    sizings: int = 0

    def factor(self, prefix: str, step: int) -> float:
        start = self.starts.get(prefix, 0)
        if step < start + self.warmup:
            return max(0.0, (step - start + 1) / max(1, self.warmup)) if step >= start else 0.0
        decay_start = max(start + self.warmup, self.decay_from)
        return min(1.0, max(0.0, (self.total - step) / max(1, self.total - decay_start)))


class ScheduledLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR over a `LinearSchedule` read live (each param group by its prefix), saved with the scheduler."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LinearSchedule):
        self.schedule = schedule
        lambdas: list[Callable[[int], float]] = [
            functools.partial(schedule.factor, group.get("prefix", "")) for group in optimizer.param_groups
        ]
        super().__init__(optimizer, lambdas)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["schedule"] = dataclasses.asdict(self.schedule)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        saved = state.pop("schedule", None)  # None: a checkpoint from before schedules were saved
        super().load_state_dict(state)
        if saved is not None and saved["sizings"]:  # a deadline settled it; else this run's config holds (a branch)
            for name, value in saved.items():  # in place: the group lambdas read this object
                setattr(self.schedule, name, value)


def linear_schedule(
    optimizer: torch.optim.Optimizer,
    warmup: int,
    total: int,
    start_at: dict[str, int] | None = None,
    decay_from: int = 0,
    flat_until: int = 0,
) -> ScheduledLR:
    """A `LinearSchedule` over the optimizer's groups (by the prefix each records: `bert_optimizer`)."""
    schedule = LinearSchedule(warmup, total, decay_from, dict(start_at or {}), flat_until)
    return ScheduledLR(optimizer, schedule)


# -- deadlines ------------------------------------------------------------------------------------
TIMED_STEPS = 24  # a decaying phase is re-sized once, after at most this many of its steps were timed


@dataclass(frozen=True)
class Deadline:
    """When a trainer's steps must end (`at`, time.time() seconds: absolute, so a run killed and resumed keeps
    the deadline of the run it continues), and what sizes the phase whose rate decays: the estimate of one of its
    steps (`step_seconds`) and the fewest it may have. A flat phase before it (REALM's reader warm-up) ends when
    only `reserved_steps` of the decaying phase's steps fit before `at`, or at its planned length. QA scores its
    held-out questions at each epoch's end (`epoch_steps`, `scoring_seconds` each): the scorings before the last
    step take time from the steps (the last one is the caller's to leave time for)."""

    at: float
    step_seconds: float
    least_steps: int = 2
    reserved_steps: int = 0
    epoch_steps: int = 0
    scoring_seconds: float = 0.0
    timed_steps: int = TIMED_STEPS
    clock: Callable[[], float] = time.time

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "clock"}


class TimedSchedule:
    """Settles a trainer's `LinearSchedule` by a `Deadline` (None: the fixed steps it was given), step by step.

    A flat phase ends by time; the decaying phase is sized in steps from the time left as it begins (at the
    estimated step) and re-sized once from its own first timed steps, after which nothing changes: its rate stays
    flat while it is timed and decays linearly from there to 0 at its last step, so the schedule is one a run
    with fixed steps can replay (the trainer's steps.json). What recurs between steps (checkpoints, QA's scorings) is timed apart
    (`between`) and counted where it falls; the re-sizing waits until each of `recurs` (name -> every so many steps:
    the trainer's checkpoints) has been timed once, so that no pause it cannot see takes the time of the steps it
    sizes. `warmup_of`: the rate warm-up of a length (QA: ORQA's rule), set when the phase is first sized;
    `on_flat_end(step)`: what starts when the flat phase ends (REALM's towers)."""

    def __init__(
        self,
        deadline: Deadline | None,
        schedule: LinearSchedule,
        warmup_of: Callable[[int], int] | None = None,
        on_flat_end: Callable[[int], None] | None = None,
        recurs: dict[str, int] | None = None,
    ):
        self.deadline, self.schedule = deadline, schedule
        self.warmup_of, self.on_flat_end = warmup_of, on_flat_end
        self.recurs = {name: every for name, every in (recurs or {}).items() if every > 0}
        self.timed_from: tuple[int, float] | None = None  # (step, time) this process began timing the phase
        self.last: tuple[int, float] | None = None  # (step, time) of the last call
        self.excluded = 0.0  # seconds between steps since then (checkpoints, scorings)
        # what recurs between steps: name -> (every so many steps, seconds it took last)
        self.recurring: dict[str, tuple[int, float]] = {}
        if deadline is not None and deadline.epoch_steps:
            self.recurring["scoring"] = (deadline.epoch_steps, deadline.scoring_seconds)

    def between(self, name: str, every: int, seconds: float) -> None:
        """`seconds` spent after a step on what recurs every `every` steps (a checkpoint, a scoring)."""
        self.excluded += seconds
        self.recurring[name] = (every, seconds)

    @contextlib.contextmanager
    def timing(self, name: str, every: int) -> Iterator[None]:
        """Times what recurs every `every` steps, on the deadline's clock (`between`)."""
        clock = self.deadline.clock if self.deadline is not None else time.time
        began = clock()
        yield
        self.between(name, every, clock() - began)

    def before_step(self, step: int) -> None:
        """Called before each step (`step`: the steps done); may end the flat phase and size the decaying one."""
        d, s = self.deadline, self.schedule
        if d is None or s.sizings >= 2:
            return
        now = d.clock()
        last, self.last = self.last, (step, now)
        if step < s.flat_until:  # ends before the step that would take from the decaying phase's share
            next_step = now - last[1] if last is not None and last[0] == step - 1 else 0.0
            if now + next_step + d.reserved_steps * d.step_seconds <= d.at:
                return
            self._end_flat(step)
        if s.sizings == 0:  # the decaying phase begins: as many of its steps as the time left holds, estimated
            s.total = step + self._fitting(step, now, d.step_seconds)
            if self.warmup_of is not None:
                s.warmup = self.warmup_of(s.total)
            s.sizings = 1
        if self.timed_from is None:
            self.timed_from, self.excluded = (step, now), 0.0
            timed = step + self._timed_steps(s.total - step)
            for name, every in self.recurs.items():  # not yet timed: timed before the re-sizing counts it
                if name not in self.recurring:
                    timed = max(timed, (step // every + 1) * every)
            s.decay_from = max(s.decay_from, min(s.total, timed))
            return
        began, at = self.timed_from
        if step >= s.decay_from:  # timed: re-sized once from what its steps took
            measured = (now - at - self.excluded) / max(1, step - began)
            s.total = step + self._fitting(step, now, max(measured, 1e-6))
            s.decay_from, s.sizings = step, 2

    def _timed_steps(self, planned: int) -> int:
        assert self.deadline is not None
        return min(self.deadline.timed_steps, max(2, planned // 4))

    def _end_flat(self, step: int) -> None:
        s = self.schedule
        s.total += step - s.flat_until  # the decaying phase keeps its length until it is sized
        s.flat_until = s.decay_from = step
        if self.on_flat_end is not None:
            self.on_flat_end(step)

    def _fitting(self, step: int, now: float, step_seconds: float) -> int:
        """Steps from `step` on that end by the deadline at `step_seconds` each, with what recurs between them
        (not after the last: the caller leaves time for that); at least what leaves the phase its fewest steps."""
        d, s = self.deadline, self.schedule
        assert d is not None
        least = max(1, d.least_steps - (step - s.flat_until))
        steps = max(0, int((d.at - now) / step_seconds))
        for _ in range(4):  # what recurs depends on the steps it leaves
            pauses = sum(((step + steps - 1) // every - step // every) * sec for every, sec in self.recurring.values())
            steps = max(0, int((d.at - now - max(0.0, pauses)) / step_seconds))
        return max(least, steps)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, max_grad_norm: float = 1.0) -> None:
    """Clip (BERT: global norm 1.0), step the optimiser and the schedule, clear the gradients."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


# -- what a trainer trained ----------------------------------------------------------------------
STEPS_RECORD = "steps.json"


def record_steps(out_dir: Path, planned: dict[str, int], trained: dict[str, int], deadline: Deadline | None) -> None:
    """out_dir/steps.json: the step counts a trainer was given and those it trained (each a field of its config:
    given as fixed steps, they replay the run's schedule), the deadline it trained to and when it ended."""
    record = {
        "planned": planned,
        "trained": trained,
        "deadline": deadline.to_dict() if deadline is not None else None,
        "ended": time.time(),
    }
    write_json_atomic(Path(out_dir) / STEPS_RECORD, record)


def read_steps(out_dir: Path) -> dict | None:
    """A trainer's steps.json (None: it has none: it never finished, or it predates the record)."""
    path = Path(out_dir) / STEPS_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


# -- checkpoints ----------------------------------------------------------------------------------
def _rng_states(d: Dist) -> dict[str, torch.Tensor]:
    """Every rank's CPU RNG state and, on a GPU, its CUDA RNG state (dropout draws from the device's generator)."""
    state = {"": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_"] = torch.cuda.get_rng_state()
    states: list = [state]
    if d.world_size > 1:
        states = [None] * d.world_size
        dist.all_gather_object(states, state)
    return {f"{kind}rank{r}": tensor for r, rank_state in enumerate(states) for kind, tensor in rank_state.items()}


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    position: DataPosition,
    d: Dist,
    extra: dict | None = None,
    final: bool = False,
) -> None:
    """out_dir/checkpoints/step-XXXXXXXX/, swapped in whole (every rank must call: RNG states are gathered).
    A run keeps its last two; the `final` step's replaces them all (with MiniLM, 0.6 GB a checkpoint)."""
    rng = _rng_states(d)
    if not d.main:
        return

    def write(tmp: Path) -> None:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")  # tensors and plain types only: weights_only loads it
        save_file(rng, tmp / "rng.safetensors")
        state = {
            "step": step,
            "epoch": position.epoch,
            "offset": position.offset,
            "world_size": d.world_size,
            "scheduler": scheduler.state_dict(),
            "time": time.time(),
            **(extra or {}),
        }
        (tmp / "trainer.json").write_text(json.dumps(state, indent=2) + "\n")

    folder = Path(out_dir) / CHECKPOINTS / f"step-{step:08d}"
    write_dir_atomic(folder, write)
    for old in sorted((Path(out_dir) / CHECKPOINTS).glob("step-????????"))[: -1 if final else -2]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = sorted(p for p in (Path(out_dir) / CHECKPOINTS).glob("step-????????") if (p / "trainer.json").exists())
    return found[-1] if found else None


def resume_training(
    out_dir: Path, resume: bool, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, d: Dist, what: str
) -> tuple[int, DataPosition, dict]:
    """Where a run starts: its newest checkpoint when resuming (step, data position, trainer state), else the start."""
    found = latest_checkpoint(out_dir) if resume else None
    if found is None:
        return 0, DataPosition(), {}
    step, position, state = load_checkpoint(found, model, optimizer, scheduler, d)
    log.info("resumed %s from %s (step %d)", what, found, step)
    return step, position, state


def load_checkpoint(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, d: Dist
) -> tuple[int, DataPosition, dict]:
    """Restore everything saved by save_checkpoint; returns (step, data position, trainer state). The learning
    rates are this run's, not the checkpoint's (the same on a plain resume; a branch of a run may change them)."""
    state = json.loads((folder / "trainer.json").read_text())
    configured = [group["initial_lr"] for group in optimizer.param_groups]
    if state["world_size"] != d.world_size:
        log.warning(
            "checkpoint was written by %d processes, resuming with %d: dropout streams differ",
            state["world_size"],
            d.world_size,
        )
    load_model(model, str(folder / "model.safetensors"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(state["scheduler"])  # LambdaLR saves its base rates: those too are the checkpoint's
    scheduler.base_lrs = configured
    for group, base, factor in zip(optimizer.param_groups, configured, scheduler.lr_lambdas, strict=True):
        group["initial_lr"], group["lr"] = base, base * factor(scheduler.last_epoch)
    rng = load_file(folder / "rng.safetensors")
    torch.set_rng_state(rng.get(f"rank{d.rank}", rng["rank0"]))
    cuda_state = rng.get(f"cuda_rank{d.rank}", rng.get("cuda_rank0"))
    if cuda_state is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda_state)
    return state["step"], DataPosition(state["epoch"], state["offset"]), state


# -- logging --------------------------------------------------------------------------------------
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
