"""REALM pretraining recipe: masked-LM with retrieval over a MIPS index refreshed asynchronously.

Per step: mask one sentence per example; embed the masked queries with the current query tower; search
the current index version for the top candidates; drop the trivial ones (blocks of the sentence's own
document); prepend the null document; compute the marginal loss of models/realm.py with the current
towers and reader; step. Between steps the trainer switches to a newer index version if the builder
published one. Every `refresh_every` steps it saves a retriever snapshot for the builder. A warm-up may come
first: the null document alone, or with one block (`reader_warmup`, recipes/warmup.py).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedTokenizerBase

from realm.common.device import autocast, default_device
from realm.common.io import write_json_atomic
from realm.config import Preset, PretrainConfig, record_run_config
from realm.data.blocks import BlockStore
from realm.data.recoverable import SpanFinder
from realm.data.sentences import MaskedQuery, SentenceSet, build_sentences, mask_sentence, sentences_path
from realm.index.build import build_from_retriever
from realm.index.mips import MipsIndex, current_version
from realm.index.refresh import BuilderConfig, IndexBuilder, RefreshPolicy, save_snapshot
from realm.index.search import retrieve
from realm.models.mlm_reader import Reader
from realm.models.realm import RealmBatch, RealmModel, estimate_mask_center, make_batch, pad_queries
from realm.models.retriever import Retriever
from realm.recipes.model_card import write_model_card
from realm.recipes.warmup import WarmupReading, warmup_reading
from realm.training.checkpoints import resume_training, save_checkpoint
from realm.training.data import DataOrder, DataPosition, Prefetched, example_rng, prefetch_depth
from realm.training.distributed import Dist, barrier, broadcast, setup_distributed
from realm.training.metrics import MetricsLog
from realm.training.optim import bert_optimizer, optimizer_step
from realm.training.schedule import (
    LinearSchedule,
    ScheduledLR,
    TimedSchedule,
    TimedSteps,
    linear_schedule,
    record_steps,
)

log = logging.getLogger(__name__)

SENTENCE_USAGE = "sentences.json"  # the masking scheme and how many training sentences it could use
RECOVERABILITY_MAX_BLOCKS = 1_000_000  # above, recoverability is not logged (its lookup holds every block's words)


def masked_queries(
    sentences: SentenceSet,
    rows: np.ndarray,
    epoch: int,
    cfg: PretrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    query_max_tokens: int,
) -> list[MaskedQuery]:
    """The sentences `rows` masked, each with its example's own randomness in this epoch."""
    return [
        mask_sentence(
            sentences.texts[i],
            sentences.spans[i],
            cfg.masking,
            tokenizer,
            query_max_tokens,
            cfg.max_masks,
            example_rng(cfg.seed, epoch, int(i)),
        )
        for i in rows
    ]


def pretrain_queries(
    sentences: SentenceSet, start: DataPosition, preset: Preset, tokenizer: PreTrainedTokenizerBase, d: Dist
) -> Iterator[tuple[DataPosition, np.ndarray, list[MaskedQuery]]]:
    """This rank's sentences and their masked queries from `start` on, each batch with the data position after
    it: the half of a batch that does not depend on the model, so it can be built ahead (training.Prefetched)."""
    cfg = preset.pretrain
    tokenizer = copy.deepcopy(tokenizer)  # the building thread's own
    for position, epoch, local in DataOrder(len(sentences), cfg.seed).batches(start, cfg.batch_size, d):
        yield (
            position,
            local,
            masked_queries(sentences, local, epoch, cfg, tokenizer, preset.retriever.query_max_tokens),
        )


def make_pretrain_batch(
    model: RealmModel,
    index: MipsIndex | None,
    sentences: SentenceSet,
    rows: np.ndarray,
    queries: list[MaskedQuery],
    cfg: PretrainConfig,
    store: BlockStore,
    block_doc_ids: np.ndarray,
    device: torch.device,
    dtype: torch.dtype,
    warmup: WarmupReading | None = None,
) -> RealmBatch:
    """Retrieve the candidates of the sentences `rows` (masked as `queries`) from `index` with the current query
    tower (none without an index: the null document alone, or with `warmup` also its block), and assemble the
    reader inputs, on `device`."""
    tokenizer = model.retriever.tokenizer
    doc_ids = [sentences.doc_ids[i] for i in rows]
    bodies, retrieved = None, np.empty((len(rows), 0), dtype=np.int64)  # without an index: the null document alone
    if index is None and warmup is not None:  # the warm-up's one block, (B, 1)
        texts = [sentences.texts[i] for i in rows]
        retrieved, bodies = warmup.blocks(model.retriever, queries, texts, doc_ids, dtype, device)
    elif index is not None:
        query, *_ = pad_queries(queries, tokenizer.pad_token_id)
        with autocast(dtype, device):
            query = {k: v.to(device) for k, v in query.items()}
            retrieved = retrieve(model, index, query, block_doc_ids, doc_ids, cfg.num_candidates - 1)
    return make_batch(queries, retrieved, store, tokenizer, store.config, bodies).to(device)


def _mean_over_ranks(values: dict[str, float], d: Dist) -> dict[str, float]:
    if d.world_size == 1:
        return values
    tensor = torch.tensor(list(values.values()), dtype=torch.float64)
    dist.all_reduce(tensor)
    return dict(zip(values, (tensor / d.world_size).tolist()))


def global_token_mean(loss: torch.Tensor, tokens: torch.Tensor, d: Dist) -> torch.Tensor:
    """A rank's loss, the mean over its masked tokens, rescaled so that DDP's average over ranks is the mean over
    every masked token of the global batch, as one process computes it (ranks hold different numbers of masks)."""
    if d.world_size == 1:
        return loss
    total = tokens.detach().float().clone()
    dist.all_reduce(total)
    return loss * tokens.float() * d.world_size / total.clamp(min=1)


@dataclass(frozen=True)
class PretrainRun:
    """The folder of a pretraining run: checkpoints and metrics (training/), config.json, and these."""

    out: Path

    @property
    def index(self) -> Path:  # every version the trainer and its builder published
        return self.out / "index"

    @property
    def snapshots(self) -> Path:  # retriever snapshots for the builder
        return self.out / "snapshots"

    @property
    def sentence_usage(self) -> Path:
        return self.out / SENTENCE_USAGE

    def record_config(
        self, preset: Preset, corpus: Path, retriever: str, reader: str, resume: bool, allow_change: bool
    ) -> None:
        """config.json: every preset section pretraining reads and what it started from (a resume with other
        settings is refused unless `allow_change`: config.py, record_run_config)."""
        models = {"corpus": str(corpus), "retriever_model": retriever, "reader_model": reader}
        record_run_config(self.out, {"recipe": "pretrain", **models, **pretrain_settings(preset)}, resume, allow_change)

    def save(self, model: RealmModel) -> None:
        """The trained towers and reader, as `--retriever`/`--reader` (and Retriever.load/Reader.load) read them,
        and the model card."""
        model.export_null_score()
        model.retriever.save(self.out / "retriever")
        model.reader.save(self.out / "reader")
        write_model_card(self.out, self.out)


def pretrain_settings(preset: Preset) -> dict:
    """Every preset section pretraining reads: its config.json, and its stage's fingerprint in the pipeline."""
    return {
        "pretrain": asdict(preset.pretrain),
        "retriever": asdict(preset.retriever),
        "embed": asdict(preset.embed),
        "index": asdict(preset.index),
    }


def train_pretrain(
    corpus: Path,
    out: Path,
    retriever_spec: str,
    reader_spec: str,
    preset: Preset,
    resume: bool = False,
    progress: bool = True,
    allow_config_change: bool = False,
    reuse_indexes: Sequence[Path] = (),
    timed: TimedSteps | None = None,
) -> Path:
    """REALM pretraining into `out`. `reuse_indexes`: index folders whose embeddings the first index may copy when
    the same document tower built them over this corpus (index/build.py: build_index). `timed`: the deadline the steps end
    by (the reader warm-up by time, the retrieval steps sized to it: training/schedule.py: TimedSteps); None: the
    preset's steps. What it trained is recorded in steps.json."""
    cfg, run = preset.pretrain, PretrainRun(Path(out))
    _check_steps(preset)
    d = setup_distributed()
    device = default_device()
    dtype = preset.compute_dtype(device)
    torch.manual_seed(cfg.seed + d.rank)
    run.out.mkdir(parents=True, exist_ok=True)
    store = BlockStore(corpus)
    retriever = Retriever.load(retriever_spec, preset.retriever)
    model = RealmModel(retriever, Reader.load(reader_spec, preset.retriever.shape), cfg.reader_loss)
    finder, sentences = training_sentences(store, model, preset, run, progress, d)
    optimizer, scheduler = _optimizer(model.to(device).train(), cfg)
    if d.main:
        run.record_config(preset, corpus, retriever_spec, reader_spec, resume, allow_config_change)
    step, position, _ = resume_training(run.out, resume, model, optimizer, scheduler, d, "REALM pretraining")
    if step == 0 and cfg.mask_center_momentum > 0:
        estimate_mask_center(model.retriever, sentences, cfg, preset.retriever.query_max_tokens, device)

    policy, builder, index, warmup = index_side(model, store, finder, run, preset, step, progress, reuse_indexes, d)
    trained = _distributed(model, cfg, d)
    schedule = scheduler.schedule  # its phases, as a deadline settles them (training/schedule.py: TimedSchedule)
    timer = _timer(timed, schedule, cfg)
    metrics_log = MetricsLog(run.out, schedule.total, step, d, "REALM", progress)
    block_doc_ids = np.array(store.column("doc_id"), dtype=object)
    batches = Prefetched(pretrain_queries(sentences, position, preset, retriever.tokenizer, d), prefetch_depth(device))
    try:
        while step < schedule.total:
            timer.before_step(step)
            index = newest_index(index, run, policy, d)
            builder.share_cores(device)
            waited = time.perf_counter()
            position, local, queries = next(batches)
            searched = index if step >= schedule.flat_until else None
            batch = make_pretrain_batch(
                model, searched, sentences, local, queries, cfg, store, block_doc_ids, device, dtype, warmup
            )
            waited = time.perf_counter() - waited
            loss, stats = realm_step(trained, model, batch, optimizer, scheduler, cfg, d, dtype)
            step += 1
            spans = finder if step > schedule.flat_until else None
            metrics = step_metrics(loss, stats, batch, spans, [sentences.doc_ids[i] for i in local], model, d)
            metrics |= {"lr": float(scheduler.get_last_lr()[0]), "batch_seconds": waited}
            metrics |= index_metrics(index, cfg, step, builder)
            last = step == schedule.total
            metrics_log.step(step, metrics, log_now=step % cfg.log_every == 0 or last, total=schedule.total)
            towers = RefreshPolicy(policy.every_steps, start_step=schedule.starts.get("retriever.", 0))
            if d.main and towers.should_snapshot(step):
                save_snapshot(model.retriever, run.snapshots, step)
            if step % cfg.checkpoint_every == 0 or last:
                with timer.timing("checkpoint", cfg.checkpoint_every):
                    save_checkpoint(run.out, step, model, optimizer, scheduler, position, d, final=last)
    finally:
        batches.close()
        metrics_log.close()
        builder.stop(finished=step >= schedule.total)
    if d.main:
        _save_trained(run, model, cfg, schedule, timed)
    return run.out


def _timer(timed: TimedSteps | None, schedule: LinearSchedule, cfg: PretrainConfig) -> TimedSchedule:
    """What ends the steps by the deadline: the reader warm-up by time, then the towers start (their rates' warm-up
    from that step); the steps re-sized once a checkpoint has been timed."""
    return TimedSchedule(
        timed,
        schedule,
        on_flat_end=lambda step: schedule.starts.update(_tower_starts(cfg, step)),
        recurs={"checkpoint": cfg.checkpoint_every},
    )


def _save_trained(
    run: PretrainRun, model: RealmModel, cfg: PretrainConfig, schedule: LinearSchedule, timed: TimedSteps | None
) -> None:
    """The trained model, and steps.json: the steps each phase planned and trained (the deadline may end them)."""
    planned = {"steps": cfg.steps, "null_warmup_steps": cfg.null_warmup_steps, "decay_from": cfg.decay_from}
    lengths = {"steps": schedule.total, "null_warmup_steps": schedule.flat_until, "decay_from": schedule.decay_from}
    record_steps(run.out, planned, lengths, timed)
    run.save(model)


class IndexSide(NamedTuple):
    """What a pretraining run searches: when it refreshes (`policy`), the builder process beside it, its first
    index (None: no retrieval, the null document alone) and what its reader warm-up reads besides the null document."""

    policy: RefreshPolicy
    builder: IndexBuilder
    first: MipsIndex | None
    warmup: WarmupReading | None


def index_side(
    model: RealmModel,
    store: BlockStore,
    finder: SpanFinder | None,
    run: PretrainRun,
    preset: Preset,
    step: int,
    progress: bool,
    reuse_indexes: Sequence[Path],
    d: Dist,
) -> IndexSide:
    """The first index (built from the current retriever where the run has none) and the builder that refreshes it
    (started where the document tower trains)."""
    cfg = preset.pretrain
    retrieval = cfg.num_candidates > 1  # 1: the null document alone, i.e. masked-LM without retrieval (a baseline)
    refresh = retrieval and cfg.doc_tower == "trained"  # a fixed document tower keeps the first index exact
    policy = RefreshPolicy(cfg.refresh_every if refresh else 0, start_step=cfg.towers_start_step)
    # The first index and every rebuild use the same settings: the builder process receives these as JSON.
    config = BuilderConfig(preset.embed, preset.index, preset.retriever, policy.every_steps)
    builder = IndexBuilder(run.out, store.folder, config, cfg.builder, cfg.builder_nice)
    index = first_index(model, store, run, builder.config, step, progress, reuse_indexes, d) if retrieval else None
    if d.main and not policy.frozen:
        builder.start()
    warmup = warmup_reading(cfg.reader_warmup, store, finder, index, cfg.reader_warmup_window) if retrieval else None
    return IndexSide(policy, builder, index, warmup)


def _distributed(model: RealmModel, cfg: PretrainConfig, d: Dist) -> torch.nn.Module:
    """The model, or its DDP wrapper under torchrun. A batch of the null document alone (the baseline, the
    warm-up) leaves the towers out of the graph."""
    if d.world_size == 1:
        return model
    null_batches = cfg.num_candidates <= 1 or cfg.null_warmup_steps > 0
    return DistributedDataParallel(model, find_unused_parameters=null_batches)


def realm_step(
    trained: torch.nn.Module,
    model: RealmModel,
    batch: RealmBatch,
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    cfg: PretrainConfig,
    d: Dist,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One optimizer step on the marginal loss of models/realm.py (`trained`: the model, or its DDP wrapper)."""
    with autocast(dtype, batch.targets.device):
        loss, stats = trained(batch)
    loss = global_token_mean(loss, batch.mask_valid.sum(), d)
    loss.backward()
    optimizer_step(model, optimizer, scheduler)
    if cfg.mask_center_momentum > 0:
        model.retriever.query_tower.track_mask_center(stats["uncentred_queries"], cfg.mask_center_momentum)
    return loss, stats


def _check_steps(preset: Preset) -> None:
    cfg = preset.pretrain
    if cfg.num_candidates > 1 and cfg.null_warmup_steps >= cfg.steps:
        raise ValueError(
            f"--steps {cfg.steps} leaves no retrieval step after the warm-up of {cfg.null_warmup_steps} steps "
            f"({preset.name} preset): pass --null-warmup-steps below --steps (0: none)"
        )


def newest_index(index: MipsIndex | None, run: PretrainRun, policy: RefreshPolicy, d: Dist) -> MipsIndex | None:
    """The version the builder published last (the same on every rank), loaded between steps."""
    if index is None:
        return None
    published = broadcast(current_version(run.index) if d.main else None, d)
    return MipsIndex(run.index, published) if policy.should_reload(index.version, published) else index


def training_sentences(
    store: BlockStore, model: RealmModel, preset: Preset, run: PretrainRun, progress: bool, d: Dist
) -> tuple[SpanFinder | None, SentenceSet]:
    """The corpus's training sentences as the masking scheme can use them (their usage saved to
    run/sentences.json), and the span lookup when salient masking or the holder warm-up needs it."""
    cfg = preset.pretrain
    if d.main:
        build_sentences(store, progress)  # tag once, cached beside the corpus
    barrier(d)
    small = cfg.salient_spans == "recoverable" or len(store) <= RECOVERABILITY_MAX_BLOCKS  # the span lookup
    needed = cfg.masking == "salient" or cfg.reader_warmup == "holder"
    finder = SpanFinder(store, model.retriever.tokenizer) if needed and small else None
    only = finder if cfg.salient_spans == "recoverable" else None
    sentences = SentenceSet(sentences_path(store), cfg.held_out_fraction).for_masking(
        cfg.masking, model.retriever.tokenizer, preset.retriever.query_max_tokens, cfg.max_masks, only
    )
    usage = {"masking": cfg.masking, "salient_spans": cfg.salient_spans, **sentences.usage()}
    log.info("pretraining on %d of %d sentences (%s masking)", usage["used"], usage["sentences"], cfg.masking)
    if d.main:
        write_json_atomic(run.sentence_usage, usage)
    return finder, sentences


def _optimizer(model: RealmModel, cfg: PretrainConfig) -> tuple[torch.optim.Optimizer, ScheduledLR]:
    """AdamW with the reader, its fresh masked-LM head, the towers and b_null at their own rates. The decoder is tied
    to the word embeddings (trained at the base rate); the transform and bias are fresh. Until the head predicts
    something, the retrieval gradient is noise that Adam would turn into full-size steps on the towers (this
    collapsed the retriever on the cpu preset), so the towers may start later."""
    if cfg.doc_tower == "fixed":  # no gradient, no dropout: f(x, z) scores blocks as the index stores them
        model.retriever.doc_tower.requires_grad_(False).eval()
    optimizer = bert_optimizer(
        model,
        cfg.lr,
        prefix_lrs={
            "reader.mlm.cls.": cfg.lr * cfg.head_lr_multiplier,
            "retriever.": cfg.lr if cfg.retriever_lr is None else cfg.retriever_lr,
            "null_score": cfg.null_score_lr,
        },
    )
    scheduler = linear_schedule(
        optimizer,
        cfg.warmup_steps,
        cfg.steps,
        start_at=_tower_starts(cfg, cfg.null_warmup_steps),
        decay_from=max(cfg.null_warmup_steps, cfg.decay_from),  # the reader's null-document phase runs at the full rate
        flat_until=cfg.null_warmup_steps,
    )
    return optimizer, scheduler


def _tower_starts(cfg: PretrainConfig, warmup_end: int) -> dict[str, int]:
    """The steps the towers and b_null start training at, for a reader warm-up that ends at `warmup_end`."""
    return {"retriever.": max(cfg.retriever_frozen_steps, warmup_end), "null_score": warmup_end}


def first_index(
    model: RealmModel,
    store: BlockStore,
    run: PretrainRun,
    config: BuilderConfig,
    step: int,
    progress: bool,
    reuse_indexes: Sequence[Path],
    d: Dist,
) -> MipsIndex:
    """The run's index, built from the current retriever when the run has none yet (every rank embeds its share)."""
    if broadcast(d.main and current_version(run.index) is None, d):
        log.info("no index yet in %s: building the first one from the current retriever", run.index)
        build_from_retriever(
            model.retriever,
            store,
            run.index,
            config.embed,
            config.index,
            step,
            time.time(),
            progress and d.main,
            reuse=reuse_indexes,
            d=d,
        )
    return MipsIndex(run.index)


def step_metrics(
    loss: torch.Tensor,
    stats: dict[str, torch.Tensor],
    batch: RealmBatch,
    finder: SpanFinder | None,
    doc_ids: list[str],
    model: RealmModel,
    d: Dist,
) -> dict[str, float]:
    """The step's loss and statistics (models/realm.py), with `finder` how many masked spans another document and a
    candidate hold, averaged over ranks."""
    scalars = {"loss": loss.item(), **{k: v.item() for k, v in stats.items() if v.ndim == 0}}
    if finder is not None:
        scalars |= finder.shares(batch.masked_texts(model.retriever.tokenizer), doc_ids, batch.candidate_ids[:, 1:])
    return _mean_over_ranks(scalars, d)


def index_metrics(index: MipsIndex | None, cfg: PretrainConfig, step: int, builder: IndexBuilder) -> dict:
    """The index version searched; with a trained document tower how stale it is, and whether a local builder runs."""
    if index is None:
        return {}
    metrics: dict[str, float] = {"index_version": index.version}
    alive = not builder.started or builder.alive(index.version)
    if cfg.doc_tower == "trained":  # a fixed document tower's index is never stale
        metrics["staleness_steps"] = step - (index.meta.checkpoint_step or 0)
        metrics["staleness_seconds"] = time.time() - (index.meta.checkpoint_time or index.meta.created)
        if builder.started and builder.where == "local":
            metrics["builder_alive"] = float(alive)
    return metrics
