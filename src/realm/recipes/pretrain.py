"""REALM pretraining recipe: masked-LM with retrieval over a MIPS index refreshed asynchronously.

Per step: mask one sentence per example; embed the masked queries with the current query tower; search
the current index version for the top candidates; drop the trivial ones (blocks of the sentence's own
document); prepend the null document; compute the marginal loss of models/realm.py with the current
towers and reader; step. Between steps the trainer switches to a newer index version if the builder
published one. Every `refresh_every` steps it saves a retriever snapshot for the builder. A warm-up may come
first: the null document alone, or with one block (`reader_warmup`, recipes/warmup.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from realm.common.device import autocast, default_device, resolve_compute_dtype
from realm.common.io import write_json_atomic
from realm.config import Preset, PretrainConfig, record_run_config
from realm.data.blocks import BlockStore
from realm.data.recoverable import SpanFinder
from realm.data.sentences import SentenceSet, build_sentences, mask_sentence, sentences_path
from realm.index.build import build_from_retriever
from realm.index.mips import MipsIndex, current_version
from realm.index.refresh import STOP_FILE, BuilderConfig, RefreshPolicy, save_snapshot, share_cores, start_builder
from realm.index.search import retrieve
from realm.models.mlm_reader import Reader
from realm.models.realm import RealmBatch, RealmModel, estimate_mask_center, make_batch, pad_queries
from realm.models.retriever import Retriever
from realm.recipes.warmup import WarmupReading, warmup_reading
from realm.training import (
    DataOrder,
    DataPosition,
    Dist,
    MetricsLog,
    bert_optimizer,
    broadcast,
    example_rng,
    latest_checkpoint,
    linear_schedule,
    load_checkpoint,
    optimizer_step,
    save_checkpoint,
    setup_distributed,
)

log = logging.getLogger(__name__)

SENTENCE_USAGE = "sentences.json"  # the masking scheme and how many training sentences it could use
RECOVERABILITY_MAX_BLOCKS = 1_000_000  # above, recoverability is not logged (its lookup holds every block's words)


def make_pretrain_batch(
    model: RealmModel,
    index: MipsIndex | None,
    sentences: SentenceSet,
    rows: np.ndarray,
    epoch: int,
    cfg: PretrainConfig,
    query_max_tokens: int,
    store: BlockStore,
    block_doc_ids: np.ndarray,
    device: torch.device,
    dtype: torch.dtype,
    warmup: WarmupReading | None = None,
) -> RealmBatch:
    """Mask the sentences `rows`, retrieve their candidates from `index` with the current query tower (none
    without an index: the null document alone, or with `warmup` also its block), and assemble the reader inputs,
    on `device`."""
    tokenizer = model.retriever.tokenizer
    queries = [
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
) -> Path:
    """REALM pretraining into `out`. `reuse_indexes`: index folders whose embeddings the first index may copy when
    the same document tower built them over this corpus (index/build.py: build_index)."""
    cfg = preset.pretrain
    if cfg.num_candidates > 1 and cfg.null_warmup_steps >= cfg.steps:
        raise ValueError(
            f"--steps {cfg.steps} leaves no retrieval step after the warm-up of {cfg.null_warmup_steps} steps "
            f"({preset.name} preset): pass --null-warmup-steps below --steps (0: none)"
        )
    d = setup_distributed()
    device = default_device()
    dtype = resolve_compute_dtype(preset.embed.compute_dtype, device)
    torch.manual_seed(cfg.seed + d.rank)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # a fixed document tower keeps the first index exact: nothing to refresh
    policy = RefreshPolicy(cfg.refresh_every if cfg.doc_tower == "trained" else 0, start_step=cfg.towers_start_step)
    store = BlockStore(corpus)
    block_doc_ids = np.array(store.column("doc_id"), dtype=object)
    if d.main:
        build_sentences(store, progress)  # tag once, cached beside the corpus
    if d.world_size > 1:
        dist.barrier()
    retriever = Retriever.load(retriever_spec, preset.retriever)
    model = RealmModel(retriever, Reader.load(reader_spec, preset.retriever.shape))
    small = cfg.salient_spans == "recoverable" or len(store) <= RECOVERABILITY_MAX_BLOCKS  # the span lookup
    needed = cfg.masking == "salient" or cfg.reader_warmup == "holder"
    finder = SpanFinder(store, model.retriever.tokenizer) if needed and small else None
    only = finder if cfg.salient_spans == "recoverable" else None
    sentences = SentenceSet(sentences_path(store), cfg.held_out_fraction, held_out=False).for_masking(
        cfg.masking, model.retriever.tokenizer, preset.retriever.query_max_tokens, cfg.max_masks, only
    )
    usage = {"masking": cfg.masking, "salient_spans": cfg.salient_spans, **sentences.usage()}
    log.info("pretraining on %d of %d sentences (%s masking)", usage["used"], usage["sentences"], cfg.masking)
    if d.main:
        write_json_atomic(out / SENTENCE_USAGE, usage)
    order = DataOrder(len(sentences), cfg.seed)

    model.to(device).train()
    if cfg.doc_tower == "fixed":  # no gradient, no dropout: f(x, z) scores blocks as the index stores them
        model.retriever.doc_tower.requires_grad_(False).eval()
    # The decoder is tied to the word embeddings (trained at the base rate); the transform and bias are fresh.
    # Until the head predicts something, the retrieval gradient is noise that Adam would turn into full-size
    # steps on the towers (this collapsed the retriever on the cpu preset), so the towers may start later.
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
        start_at={"retriever.": cfg.towers_start_step, "null_score": cfg.null_warmup_steps},
        decay_from=cfg.null_warmup_steps,  # the reader's null-document phase runs at the full rate
    )
    step, position = 0, DataPosition()
    if d.main:
        record_run_config(
            out,
            {
                "recipe": "pretrain",
                "corpus": str(corpus),
                "retriever_model": retriever_spec,
                "reader_model": reader_spec,
                "pretrain": asdict(cfg),
                "retriever": asdict(preset.retriever),
                "embed": asdict(preset.embed),
                "index": asdict(preset.index),
            },
            resume,
            allow_config_change,
        )
    found = latest_checkpoint(out) if resume else None
    if found is not None:
        step, position, _ = load_checkpoint(found, model, optimizer, scheduler, d)
        log.info("resumed REALM pretraining from %s (step %d)", found, step)
    elif cfg.mask_center_momentum > 0:
        estimate_mask_center(model.retriever, sentences, cfg, preset.retriever.query_max_tokens, device)

    index_dir = out / "index"
    retrieval = cfg.num_candidates > 1  # 1: the null document alone, i.e. masked-LM without retrieval (a baseline)
    if not retrieval:
        policy = RefreshPolicy(0)
    # The first index and every rebuild use the same settings: the builder process receives these as JSON.
    builder_config = BuilderConfig(preset.embed, preset.index, preset.retriever, policy.every_steps)
    if retrieval and broadcast(d.main and current_version(index_dir) is None, d):  # a new corpus: the first index
        log.info("no index yet in %s: building the first one from the current retriever", index_dir)
        build_from_retriever(  # every rank embeds its share
            model.retriever,
            store,
            index_dir,
            builder_config.embed,
            builder_config.index,
            step,
            time.time(),
            progress and d.main,
            reuse=reuse_indexes,
            d=d,
        )
    (out / "snapshots" / STOP_FILE).unlink(missing_ok=True)  # left by an earlier run's clean exit
    builder = None
    if d.main and not policy.frozen and cfg.builder == "local":
        builder = start_builder(out, Path(corpus), builder_config, nice=cfg.builder_nice)
    elif d.main and not policy.frozen:
        builder_config.save(out / "builder.json")
        log.info("external builder: start `realm index refresh --config %s/builder.json ...` to refresh", out)
    index = MipsIndex(index_dir) if retrieval else None
    warmup = warmup_reading(cfg.reader_warmup, store, finder, index) if retrieval else None
    # a batch of the null document alone (the baseline, the warm-up) leaves the towers out of the graph
    null_batches = not retrieval or cfg.null_warmup_steps > 0
    trained = DistributedDataParallel(model, find_unused_parameters=null_batches) if d.world_size > 1 else model
    metrics_log = MetricsLog(out, cfg.steps, step, d, "REALM", progress)
    builder_warned = False
    threads = torch.get_num_threads()
    try:
        while step < cfg.steps:
            if index is not None:
                published = broadcast(current_version(index_dir) if d.main else None, d)
                if policy.should_reload(index.version, published):
                    index = MipsIndex(index_dir, published)
            if device.type == "cpu" and cfg.builder == "local" and not policy.frozen:
                share_cores(index_dir, threads)
            epoch = position.epoch
            indices, position = order.take(position, cfg.batch_size)
            local = indices[d.rank :: d.world_size]
            batch = make_pretrain_batch(
                model,
                index if step >= cfg.null_warmup_steps else None,
                sentences,
                local,
                epoch,
                cfg,
                preset.retriever.query_max_tokens,
                store,
                block_doc_ids,
                device,
                dtype,
                warmup,
            )
            with autocast(dtype, device):
                loss, stats = trained(batch)
            loss = global_token_mean(loss, batch.mask_valid.sum(), d)
            loss.backward()
            optimizer_step(model, optimizer, scheduler)
            if cfg.mask_center_momentum > 0:
                model.retriever.query_tower.track_mask_center(stats["uncentred_queries"], cfg.mask_center_momentum)
            step += 1

            builder_alive = builder is None or builder.poll() is None
            if builder is not None and index is not None and not builder_alive and not builder_warned:
                log.warning(
                    "index builder exited (code %s); training continues on index v%d, see %s",
                    builder.returncode,
                    index.version,
                    out / "builder.log",
                )
                builder_warned = True
            scalars = {"loss": loss.item(), **{k: v.item() for k, v in stats.items() if v.ndim == 0}}
            if finder is not None and step > cfg.null_warmup_steps:  # masked spans another document / a candidate holds
                doc_ids, texts = [sentences.doc_ids[i] for i in local], batch.masked_texts(model.retriever.tokenizer)
                scalars |= finder.shares(texts, doc_ids, batch.candidate_ids[:, 1:])
            metrics = _mean_over_ranks(scalars, d)
            metrics["lr"] = float(scheduler.get_last_lr()[0])
            if index is not None:
                metrics["index_version"] = index.version
            if index is not None and cfg.doc_tower == "trained":  # a fixed document tower's index is never stale
                metrics |= {
                    "staleness_steps": step - (index.meta.checkpoint_step or 0),
                    "staleness_seconds": time.time() - (index.meta.checkpoint_time or index.meta.created),
                } | ({"builder_alive": float(builder_alive)} if builder is not None else {})
            metrics_log.step(step, metrics, log_now=step % cfg.log_every == 0 or step == cfg.steps)
            if d.main and policy.should_snapshot(step):
                save_snapshot(model.retriever, out / "snapshots", step)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                save_checkpoint(out, step, model, optimizer, scheduler, position, d)
    finally:
        metrics_log.close()
        torch.set_num_threads(threads)
        if builder is not None:
            (out / "snapshots").mkdir(parents=True, exist_ok=True)
            (out / "snapshots" / STOP_FILE).touch()
            builder.terminate()
            builder.wait(timeout=30)
    if d.main and builder is None and not policy.frozen:  # training is over: an external builder may stop
        (out / "snapshots").mkdir(parents=True, exist_ok=True)
        (out / "snapshots" / STOP_FILE).touch()
    if d.main:
        model.export_null_score()
        model.retriever.save(out / "retriever")
        model.reader.save(out / "reader")
    return out
