"""The ICT recipe (ORQA, Lee et al. 2019): warm-start both retriever towers with the Inverse Cloze Task.

Per step: one sentence of each block is its pseudo-query, the block (without that sentence 90% of the
time) its positive and the other blocks of the batch its negatives (models/ict.py). Under torchrun each
process uses its share of the global batch as its negatives.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedTokenizerBase

from realm.common.device import autocast, default_device
from realm.config import CorpusConfig, Preset, record_run_config
from realm.data.blocks import BlockStore, sentence_starts
from realm.models.ict import ICTModel
from realm.models.inputs import encode_blocks, pad_batch
from realm.models.retriever import Retriever
from realm.recipes.model_card import write_model_card
from realm.training.checkpoints import resume_training, save_checkpoint
from realm.training.data import DataOrder, DataPosition, Prefetched, example_rng, prefetch_depth
from realm.training.distributed import Dist, setup_distributed
from realm.training.metrics import MetricsLog
from realm.training.optim import bert_optimizer, optimizer_step
from realm.training.schedule import TimedSchedule, TimedSteps, linear_schedule, record_steps

Batch = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]

log = logging.getLogger(__name__)


def sentence_spans(body: str) -> list[tuple[int, int]]:
    starts = sentence_starts(body)
    return list(zip(starts, starts[1:] + [len(body)]))


def ict_pair(body: str, rng: np.random.Generator, remove_prob: float) -> tuple[str, str]:
    """(pseudo-query sentence, context) for one block of at least two sentences."""
    spans = sentence_spans(body)
    start, end = spans[int(rng.integers(len(spans)))]
    query = body[start:end].strip()
    context = (body[:start] + body[end:]).strip() if rng.random() < remove_prob else body
    return query, context


def make_ict_batch(
    tokenizer: PreTrainedTokenizerBase,
    titles: list[str],
    bodies: list[str],
    rngs: list[np.random.Generator],
    remove_prob: float,
    query_max_tokens: int,
    corpus_config: CorpusConfig,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Pseudo-queries (B, Lq) and their contexts (B, Ld) for B blocks of at least two sentences."""
    pairs = [ict_pair(body, rng, remove_prob) for body, rng in zip(bodies, rngs)]
    query = dict(
        tokenizer(
            [q for q, _ in pairs], padding=True, truncation=True, max_length=query_max_tokens, return_tensors="pt"
        )
    )
    ids, types = encode_blocks(tokenizer, titles, [c for _, c in pairs], corpus_config)
    return query, pad_batch(ids, types, tokenizer.pad_token_id)


def ict_batches(
    titles: list[str],
    bodies: list[str],
    usable: np.ndarray,
    corpus_config: CorpusConfig,
    start: DataPosition,
    preset: Preset,
    tokenizer: PreTrainedTokenizerBase,
    d: Dist,
) -> Iterator[tuple[DataPosition, Batch]]:
    """This rank's batches of the `usable` blocks (of a corpus's `titles` and `bodies`) from `start` on, each with
    the data position after it. A batch depends on the data order and each example's seeded randomness alone, so it
    can be built ahead of the step (training.Prefetched)."""
    cfg = preset.ict
    tokenizer = copy.deepcopy(tokenizer)  # the building thread's own
    for position, epoch, local in DataOrder(len(usable), cfg.seed).batches(start, cfg.batch_size, d):
        yield (
            position,
            make_ict_batch(
                tokenizer,
                [titles[usable[i]] for i in local],
                [bodies[usable[i]] for i in local],
                [example_rng(cfg.seed, epoch, int(i)) for i in local],
                cfg.remove_sentence_prob,
                preset.retriever.query_max_tokens,
                corpus_config,
            ),
        )


def ict_settings(preset: Preset, steps: int | None = None) -> dict:
    """Every setting ICT reads (`steps`: the length it trains, if not the preset's): its config.json, and its
    stage's fingerprint in the pipeline."""
    ict = dataclasses.replace(preset.ict, steps=steps or preset.ict.steps)
    return {"ict": asdict(ict), "retriever": asdict(preset.retriever), "compute_dtype": preset.embed.compute_dtype}


def train_ict(
    corpus: Path,
    out: Path,
    model_spec: str,
    preset: Preset,
    resume: bool = False,
    progress: bool = True,
    steps: int | None = None,
    allow_config_change: bool = False,
    timed: TimedSteps | None = None,
) -> Path:
    """Train both towers with ICT; writes config.json, checkpoints and the final retriever to out/retriever.
    `timed`: the deadline the steps end by and what sizes them (training/schedule.py: TimedSteps); None: `steps`.
    What it trained is recorded in steps.json."""
    cfg = preset.ict
    steps = steps or cfg.steps
    d = setup_distributed()
    device = default_device()
    dtype = preset.compute_dtype(device)
    torch.manual_seed(cfg.seed + d.rank)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = BlockStore(corpus)
    titles, bodies = store.slice(0, len(store))
    usable = np.array([i for i, body in enumerate(bodies) if len(sentence_spans(body)) >= 2], dtype=np.int64)
    if len(usable) < cfg.batch_size:
        raise ValueError(f"{corpus}: only {len(usable)} blocks with two or more sentences; ICT needs a batch of them")

    retriever = Retriever.load(model_spec, preset.retriever).to(device).train()
    model = ICTModel(retriever)
    optimizer = bert_optimizer(model, cfg.lr)
    scheduler = linear_schedule(optimizer, cfg.warmup_steps, steps, decay_from=cfg.decay_from)
    if d.main:
        run = {"recipe": "ict", "corpus": str(corpus), "model": model_spec}
        record_run_config(out, run | ict_settings(preset, steps), resume, allow_config_change)
    step, position, _ = resume_training(out, resume, model, optimizer, scheduler, d, "ICT")
    trained = DistributedDataParallel(model) if d.world_size > 1 else model
    schedule = scheduler.schedule  # its length, as a deadline settles it (training/schedule.py: TimedSchedule)
    timer = TimedSchedule(timed, schedule, recurs={"checkpoint": cfg.checkpoint_every})
    metrics_log = MetricsLog(out, steps, step, d, "ICT", progress)
    blocks = ict_batches(titles, bodies, usable, store.config, position, preset, retriever.tokenizer, d)
    batches = Prefetched(blocks, prefetch_depth(device))
    with batches, metrics_log:
        while step < schedule.total:
            timer.before_step(step)
            waited = time.perf_counter()
            position, (query, docs) = next(batches)
            query, docs = ({k: v.to(device) for k, v in x.items()} for x in (query, docs))
            waited = time.perf_counter() - waited
            with autocast(dtype, device):
                loss, accuracy = trained(query, docs)
            loss.backward()
            optimizer_step(model, optimizer, scheduler)
            step += 1
            last = step == schedule.total
            metrics = {"loss": loss.item(), "accuracy": accuracy.item(), "lr": float(scheduler.get_last_lr()[0])}
            metrics_log.step(
                step,
                metrics | {"batch_seconds": waited},
                log_now=step % cfg.log_every == 0 or last,
                total=schedule.total,
            )
            if step % cfg.checkpoint_every == 0 or last:
                with timer.timing("checkpoint", cfg.checkpoint_every):
                    save_checkpoint(out, step, model, optimizer, scheduler, position, d, final=last)
    if d.main:
        planned = {"steps": steps, "decay_from": cfg.decay_from}
        record_steps(out, planned, {"steps": schedule.total, "decay_from": schedule.decay_from}, timed)
        retriever.save(out / "retriever")
        write_model_card(out / "retriever", out)
    return out / "retriever"
