"""Inverse Cloze Task (ORQA, Lee et al. 2019): the warm start of REALM's retriever.

A pseudo-query is one sentence of a block; its positive is the block with that sentence removed (90%
of the time; kept 10% so the retriever still learns word matching); the other blocks of the batch are
the negatives. Both towers train:

    loss = CrossEntropy(softmax_j Embed_input(q_i) · Embed_doc(c_j), target j = i)

Under torchrun each process uses its share of the global batch as its negatives.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedTokenizerBase

from realm.config import CorpusConfig, Preset
from realm.corpus import BlockStore, sentence_starts
from realm.embed import default_device, encode_blocks, pad_batch, resolve_compute_dtype
from realm.retriever import Retriever
from realm.training import (
    DataOrder,
    DataPosition,
    MetricsLog,
    autocast,
    bert_optimizer,
    example_rng,
    latest_checkpoint,
    linear_schedule,
    load_checkpoint,
    optimizer_step,
    save_checkpoint,
    setup_distributed,
)

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


def make_ict_batch(tokenizer: PreTrainedTokenizerBase, titles: list[str], bodies: list[str],
                   rngs: list[np.random.Generator], remove_prob: float, query_max_tokens: int,
                   corpus_config: CorpusConfig) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Pseudo-queries (B, Lq) and their contexts (B, Ld) for B blocks of at least two sentences."""
    pairs = [ict_pair(body, rng, remove_prob) for body, rng in zip(bodies, rngs)]
    query = dict(tokenizer([q for q, _ in pairs], padding=True, truncation=True, max_length=query_max_tokens,
                           return_tensors="pt"))
    ids, types = encode_blocks(tokenizer, titles, [c for _, c in pairs], corpus_config)
    return query, pad_batch(ids, types, tokenizer.pad_token_id)


class ICTModel(nn.Module):
    def __init__(self, retriever: Retriever):
        super().__init__()
        self.retriever = retriever

    def forward(self, query: dict[str, torch.Tensor], docs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.retriever.query_tower(**query)  # (B, D)
        d = self.retriever.doc_tower(**docs)  # (B, D)
        logits = (q @ d.T).float()  # (B, B): the diagonal holds the positives
        target = torch.arange(len(q), device=logits.device)
        loss = nn.functional.cross_entropy(logits, target)
        return loss, (logits.argmax(-1) == target).float().mean().detach()


def train_ict(corpus: Path, out: Path, model_spec: str, preset: Preset, resume: bool = False,
              progress: bool = True, steps: int | None = None) -> Path:
    """Train both towers with ICT; writes checkpoints and the final retriever to out/retriever."""
    cfg = preset.ict
    steps = steps or cfg.steps
    d = setup_distributed()
    device = default_device()
    dtype = resolve_compute_dtype(preset.embed.compute_dtype, device)
    torch.manual_seed(cfg.seed + d.rank)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = BlockStore(corpus)
    titles, bodies = store.slice(0, len(store))
    usable = np.array([i for i, body in enumerate(bodies) if len(sentence_spans(body)) >= 2], dtype=np.int64)
    if len(usable) < cfg.batch_size:
        raise ValueError(f"{corpus}: only {len(usable)} blocks with two or more sentences; ICT needs a batch of them")
    order = DataOrder(len(usable), cfg.seed)

    retriever = Retriever.load(model_spec, preset.retriever).to(device).train()
    model = ICTModel(retriever)
    optimizer = bert_optimizer(model, cfg.lr)
    scheduler = linear_schedule(optimizer, cfg.warmup_steps, steps)
    step, position = 0, DataPosition()
    found = latest_checkpoint(out) if resume else None
    if found is not None:
        step, position, _ = load_checkpoint(found, model, optimizer, scheduler, d)
        log.info("resumed ICT from %s (step %d)", found, step)
    trained = DistributedDataParallel(model) if d.world_size > 1 else model
    tokenizer = retriever.tokenizer
    metrics_log = MetricsLog(out, steps, step, d, "ICT", progress)
    while step < steps:
        epoch = position.epoch
        indices, position = order.take(position, cfg.batch_size)
        local = indices[d.rank :: d.world_size]
        query, docs = make_ict_batch(tokenizer, [titles[usable[i]] for i in local], [bodies[usable[i]] for i in local],
                                     [example_rng(cfg.seed, epoch, int(i)) for i in local], cfg.remove_sentence_prob,
                                     preset.retriever.query_max_tokens, store.config)
        with autocast(dtype, device):
            loss, accuracy = trained({k: v.to(device) for k, v in query.items()}, {k: v.to(device) for k, v in docs.items()})
        loss.backward()
        optimizer_step(model, optimizer, scheduler)
        step += 1
        metrics_log.step(step, {"loss": loss.item(), "accuracy": accuracy.item(), "lr": scheduler.get_last_lr()[0]},
                         log_now=step % cfg.log_every == 0 or step == steps)
        if step % cfg.checkpoint_every == 0 or step == steps:
            save_checkpoint(out, step, model, optimizer, scheduler, position, d)
    metrics_log.close()
    if d.main:
        retriever.save(out / "retriever")
    return out / "retriever"
