"""Checkpoints that resume exactly: weights (safetensors), optimiser and schedule, every rank's RNG state, the data
position."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from realm.common.io import write_dir_atomic
from realm.training.data import DataPosition
from realm.training.distributed import Dist

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"


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
