"""Open-QA fine-tuning recipe (ORQA/REALM): the document index stays frozen; the query tower and the
span reader train on log p(y | x) (models/orqa.py) plus the early-update retrieval loss over the beam.

Per step: embed the questions, search the frozen index for the beam, mark the beam blocks holding an
answer, give the top k to the reader with every span that reads as an answer, step. After each epoch,
exact match on the dev questions; the best model is kept in out/best (retriever/ + reader/).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from realm.common.device import autocast, default_device
from realm.common.io import write_dir_atomic
from realm.config import Preset, QAConfig, RetrieverConfig, record_run_config
from realm.data.blocks import BlockStore
from realm.data.qa_examples import QAExample, has_answer
from realm.eval.answerer import Answerer
from realm.eval.qa import evaluate_qa
from realm.index.mips import MipsIndex
from realm.index.search import (
    HYBRID_POOL,
    BM25Searcher,
    Searcher,
    hybrid_ranking,
    hybrid_top,
    open_searcher,
)
from realm.models.orqa import QABatch, QAModel
from realm.models.span_reader import matching_spans
from realm.recipes.model_card import write_model_card
from realm.training import (
    DataOrder,
    MetricsLog,
    bert_optimizer,
    linear_schedule,
    optimizer_step,
    resume_training,
    save_checkpoint,
    setup_distributed,
)

log = logging.getLogger(__name__)

BEST = "best"


def retrieve_beam(
    model: QAModel, questions: list[str], vectors: np.ndarray, index: MipsIndex, sparse: BM25Searcher | None, beam: int
) -> tuple[np.ndarray, np.ndarray]:
    """Block ids (B, R) best first (-1: none) and their BM25(x, z) (B, R): the dense top `beam`, or with `sparse`
    the union of the dense and BM25 top `beam` ranked by f(x, z) + w · BM25(x, z)."""
    if sparse is None:
        _, ids = index.search(vectors, beam)
        return ids, np.zeros(ids.shape, dtype=np.float32)
    _, ids, bm25 = hybrid_ranking(index, sparse, questions, vectors, model.fusion_weight, beam)
    return ids, bm25


def make_qa_batch(
    model: QAModel,
    examples: Sequence[QAExample],
    index: MipsIndex,
    store: BlockStore,
    k: int,
    beam: int,
    sparse: BM25Searcher | None = None,
) -> QABatch:
    """Retrieve the beam with the current query tower (no gradient here) and label answers and spans."""
    questions = [e.question for e in examples]
    query = model.retriever.encode_queries(questions)
    vectors = model.retriever.query_vectors(query)
    ids, bm25 = retrieve_beam(model, questions, vectors, index, sparse, max(beam, k))  # (B, R), best first
    valid = ids >= 0
    top = ids[:, :k]  # the reader's blocks: what `ask` and `serve` retrieve (a hybrid beam of another depth
    if sparse is not None and max(beam, k) != max(k, HYBRID_POOL):  # ranks another pool: rank the served one)
        top = hybrid_top(index, sparse, questions, vectors, model.fusion_weight, k)[1]
    unique = np.unique(np.concatenate([ids[valid], top[top >= 0]]))
    bodies = dict(zip(unique.tolist(), (b.body for b in store.take(unique.tolist()))))
    beam_answer = np.array(
        [
            [ok and has_answer(bodies[int(i)], example) for i, ok in zip(row, row_ok)]
            for example, row, row_ok in zip(examples, ids, valid)
        ]
    )
    beam_vectors = torch.from_numpy(index.stored_vectors(np.where(valid, ids, index.block_ids[0])))  # (B, R, D)
    if (top < 0).any():
        raise ValueError(f"the index holds fewer than k={k} blocks")
    texts = [[bodies[int(i)] for i in row] for row in top]
    reader, blocks = model.reader_inputs(questions, texts, store.config.max_block_tokens)
    match = torch.zeros_like(reader.span_valid)
    for n, (example, block_id, spans) in enumerate(
        (e, int(i), s) for e, row, srow in zip(examples, top, blocks) for i, s in zip(row, srow)
    ):
        labels = matching_spans(bodies[block_id], spans, example)
        match[n, : len(labels)] = torch.tensor(labels, dtype=torch.bool)
    return QABatch(
        dict(query),
        beam_vectors,
        torch.from_numpy(bm25),
        torch.from_numpy(valid),
        torch.from_numpy(beam_answer),
        reader,
        match,
    )


def qa_searcher(model: QAModel, index: MipsIndex, store: BlockStore, sparse: BM25Searcher | None) -> Searcher:
    """The searcher fine-tuning trains for: dense, or hybrid with the model's current BM25 weight."""
    kind = "dense" if sparse is None else "hybrid"
    return open_searcher(index, kind, model.retriever, model.fusion_weight, store, sparse)


def save_best(model: QAModel, folder: Path, dev: dict) -> None:
    """retriever/, reader/, dev.json and the model card, swapped in together."""

    def write(tmp: Path) -> None:
        model.save(tmp)
        (tmp / "dev.json").write_text(json.dumps(dev, indent=2) + "\n")
        write_model_card(tmp, folder.parent)

    write_dir_atomic(folder, write)


def qa_settings(preset: Preset, retriever: RetrieverConfig | None = None) -> dict:
    """Every setting QA fine-tuning reads: its config.json, and its stage's fingerprint in the pipeline. The
    retriever's settings are the index's (`retriever`: its pooling and sizes) where one is given."""
    retriever = retriever or preset.retriever
    return {"qa": asdict(preset.qa), "retriever": asdict(retriever), "compute_dtype": preset.embed.compute_dtype}


def _optimizer(model: QAModel, cfg: QAConfig, total: int) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW with the fresh span head, the query tower and the hybrid's BM25 weight at their own rates."""
    optimizer = bert_optimizer(
        model,
        cfg.lr,
        prefix_lrs={
            "reader.span_head.": cfg.lr * cfg.head_lr_multiplier,
            "retriever.": cfg.lr if cfg.retriever_lr is None else cfg.retriever_lr,
            "bm25_weight": cfg.fusion_lr,
        },
    )
    return optimizer, linear_schedule(optimizer, cfg.warmup_steps(total), total)


def dev_exact_match(answerer: Answerer, questions: list[QAExample], epoch: int) -> float:
    """Exact match on the dev questions, the model in eval mode for it (back in training mode after)."""
    answerer.model.eval()
    em = evaluate_qa(answerer, questions, recall_ks=())["exact_match"]
    answerer.model.train()
    log.info("epoch %d: dev exact match %.2f on %d questions", epoch, em, len(questions))
    return em


def train_qa(
    model_spec: str,
    index_dir: Path,
    train: Sequence[QAExample],
    dev: Sequence[QAExample],
    out: Path,
    preset: Preset,
    resume: bool = False,
    progress: bool = True,
    reader_spec: str | None = None,
    allow_config_change: bool = False,
) -> Path:
    """Fine-tune; returns out/best, the model with the best dev exact match. `reader_spec` overrides the
    reader warm start of `model_spec` (the ORQA-style baseline: an ICT retriever with a BERT reader)."""
    cfg = preset.qa
    d = setup_distributed()
    device = default_device()
    dtype = preset.compute_dtype(device)
    torch.manual_seed(cfg.seed + d.rank)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    index = MipsIndex(index_dir)
    store = index.corpus()
    config = index.retriever_config(preset.retriever)  # pooling etc. of the index's model
    model = QAModel.load(model_spec, config, cfg.span_hidden, cfg.max_span_width, reader=reader_spec)
    index.check_doc_tower(model.retriever.doc_fingerprint())  # refuses an index built by another document tower
    if cfg.retriever not in ("dense", "hybrid"):
        raise ValueError(f"QA fine-tuning retrieves with 'dense' or 'hybrid', not {cfg.retriever!r}")
    sparse = BM25Searcher(store) if cfg.retriever == "hybrid" else None  # built once, kept for every epoch
    model.to(device).train()
    k = min(cfg.top_k, len(index.block_ids))
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = cfg.total_steps(len(train))
    optimizer, scheduler = _optimizer(model, cfg, total)
    order = DataOrder(len(train), cfg.seed)
    if d.main:
        run = {"recipe": "finetune_qa", "model": model_spec, "reader": reader_spec, "index": str(index_dir)}
        data = {"index_version": index.version, "train_questions": len(train), "dev_questions": len(dev)}
        record_run_config(out, run | qa_settings(preset, config) | data, resume, allow_config_change)
    step, position, state = resume_training(out, resume, model, optimizer, scheduler, d, "QA fine-tuning")
    best_em = state.get("best_em", -1.0)
    trained = DistributedDataParallel(model) if d.world_size > 1 else model
    dev_part = list(dev)[: cfg.dev_limit]
    metrics_log = MetricsLog(out, total, step, d, "QA", progress)
    try:
        while step < total:
            indices, position = order.take(position, cfg.batch_size)
            local = [train[i] for i in indices[d.rank :: d.world_size]]
            batch = make_qa_batch(model, local, index, store, k, cfg.beam, sparse).to(device)
            with autocast(dtype, device):
                loss, stats = trained(batch)
            loss.backward()
            optimizer_step(model, optimizer, scheduler)
            step += 1
            metrics = {"loss": loss.item(), **{m: v.item() for m, v in stats.items()}, "lr": scheduler.get_last_lr()[0]}
            end_of_epoch = step % steps_per_epoch == 0 or step == total  # epochs counted in steps
            if end_of_epoch and d.main:
                answerer = Answerer(
                    model, qa_searcher(model, index, store, sparse), k, store.config.max_block_tokens, dtype=dtype,
                    selection=cfg.answer_selection,
                )  # fmt: skip
                em = dev_exact_match(answerer, dev_part, math.ceil(step / steps_per_epoch))
                metrics |= {"dev_em": em, "bm25_weight": model.fusion_weight}
                if em > best_em:
                    best_em = em
                    best = {"exact_match": em, "epoch": math.ceil(step / steps_per_epoch), "step": step}
                    save_best(model, out / BEST, best | {"questions": len(dev_part), "time": time.time()})
            metrics_log.step(step, metrics, log_now=step % cfg.log_every == 0 or end_of_epoch)
            if step % cfg.checkpoint_every == 0 or end_of_epoch:
                save_checkpoint(
                    out, step, model, optimizer, scheduler, position, d, {"best_em": best_em}, final=step == total
                )
    finally:
        metrics_log.close()
    if d.main:
        log.info("best dev exact match %.2f: %s", best_em, json.loads((out / BEST / "dev.json").read_text()))
    return out / BEST
