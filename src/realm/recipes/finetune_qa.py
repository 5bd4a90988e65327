"""Open-QA fine-tuning recipe (ORQA/REALM): the document index stays frozen; the query tower and the
span reader train on log p(y | x) (models/orqa.py) plus the early-update retrieval loss over the beam.

Per step: embed the questions, search the frozen index for the beam, mark the beam blocks holding an
answer, give the top k to the reader with every span that reads as an answer, step. After each epoch,
exact match on the dev questions; the best model is kept in out/best (retriever/ + reader/).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedTokenizerBase

from realm.common.device import autocast, default_device
from realm.common.io import write_dir_atomic
from realm.config import Preset, QAConfig, RetrieverConfig, record_run_config
from realm.data.blocks import BlockStore
from realm.data.qa_examples import AnswerBlocks, QAExample, has_answer
from realm.eval.answerer import Answerer
from realm.eval.qa import QAScore, evaluate_qa
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
from realm.models.retriever import encode_queries
from realm.models.span_reader import matching_spans
from realm.recipes.model_card import write_model_card
from realm.training.checkpoints import resume_training, save_checkpoint
from realm.training.data import DataOrder, DataPosition, Prefetched, prefetch_depth
from realm.training.distributed import Dist, setup_distributed
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

BEST = "best"
ANSWER_INDEX_MAX_BLOCKS = 1_000_000  # above, answers are tested block by block (the token index: ~8 bytes a token)


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


@dataclass(frozen=True)
class QAQuestions:
    """The half of a QA batch that does not depend on the model, built ahead of the step (training.Prefetched)."""

    examples: list[QAExample]
    query: dict[str, torch.Tensor]  # [CLS] x [SEP] (B, Lq)
    answer_blocks: list[np.ndarray | None]  # the blocks holding each one's answer (None: test each block)


def qa_questions(
    examples: list[QAExample], tokenizer: PreTrainedTokenizerBase, max_tokens: int, answers: AnswerBlocks | None
) -> QAQuestions:
    """The questions tokenised, and where `answers` indexes the corpus the blocks holding each one's answer."""
    holding = [answers.holding(e) if answers is not None else None for e in examples]
    return QAQuestions(examples, encode_queries(tokenizer, [e.question for e in examples], max_tokens), holding)


def qa_batches(
    train: Sequence[QAExample],
    start: DataPosition,
    cfg: QAConfig,
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    answers: AnswerBlocks | None,
    d: Dist,
) -> Iterator[tuple[DataPosition, QAQuestions]]:
    """This rank's questions from `start` on, each batch with the data position after it."""
    tokenizer = copy.deepcopy(tokenizer)  # the building thread's own
    for position, _, local in DataOrder(len(train), cfg.seed).batches(start, cfg.batch_size, d):
        yield position, qa_questions([train[i] for i in local], tokenizer, max_tokens, answers)


def make_qa_batch(
    model: QAModel,
    questions: QAQuestions,
    index: MipsIndex,
    store: BlockStore,
    k: int,
    beam: int,
    sparse: BM25Searcher | None = None,
) -> QABatch:
    """Retrieve the beam with the current query tower (no gradient here) and label answers and spans."""
    examples, asked = questions.examples, [e.question for e in questions.examples]
    vectors = model.retriever.query_vectors(questions.query)
    ids, bm25 = retrieve_beam(model, asked, vectors, index, sparse, max(beam, k))  # (B, R), best first
    valid = ids >= 0
    top = ids[:, :k]  # the reader's blocks: what `ask` and `serve` retrieve (a hybrid beam of another depth
    if sparse is not None and max(beam, k) != max(k, HYBRID_POOL):  # ranks another pool: rank the served one)
        top = hybrid_top(index, sparse, asked, vectors, model.fusion_weight, k)[1]
    if (top < 0).any():
        raise ValueError(f"the index holds fewer than k={k} blocks")
    beam_answer, reader_answer = answer_labels(ids, valid, top, questions, store)  # (B, R), (B, k)
    beam_vectors = torch.from_numpy(index.stored_vectors(np.where(valid, ids, index.block_ids[0])))  # (B, R, D)
    flat = [b.body for b in store.take(top.ravel().tolist())]  # one read for the batch
    bodies = [flat[q * top.shape[1] : (q + 1) * top.shape[1]] for q in range(len(top))]  # (B, k)
    reader, blocks = model.reader_inputs(asked, bodies, store.config.max_block_tokens)
    match = torch.zeros_like(reader.span_valid)
    for n, (example, body, spans, held) in enumerate(
        (e, body, s, h)
        for e, row, srow, hrow in zip(examples, bodies, blocks, reader_answer)
        for body, s, h in zip(row, srow, hrow)
    ):
        labels = matching_spans(body, spans, example, bool(held))
        match[n, : len(labels)] = torch.tensor(labels, dtype=torch.bool)
    return QABatch(
        dict(questions.query),
        beam_vectors,
        torch.from_numpy(bm25),
        torch.from_numpy(valid),
        torch.from_numpy(beam_answer),
        reader,
        match,
    )


def answer_labels(
    ids: np.ndarray, valid: np.ndarray, top: np.ndarray, questions: QAQuestions, store: BlockStore
) -> tuple[np.ndarray, np.ndarray]:
    """Whether each beam block (B, R) and each reader block (B, k) holds the question's answer: looked up in the
    question's answer blocks, or tested block by block where it has none (regex answers)."""
    beam = np.zeros(ids.shape, dtype=bool)
    reader = np.zeros(top.shape, dtype=bool)
    for q, (example, holding) in enumerate(zip(questions.examples, questions.answer_blocks)):
        if holding is not None:
            beam[q], reader[q] = np.isin(ids[q], holding) & valid[q], np.isin(top[q], holding)
            continue
        row = np.unique(np.concatenate([ids[q][valid[q]], top[q]]))
        held = {int(b): has_answer(block.body, example) for b, block in zip(row, store.take(row.tolist()))}
        beam[q] = [ok and held[int(b)] for b, ok in zip(ids[q], valid[q])]
        reader[q] = [held[int(b)] for b in top[q]]
    return beam, reader


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


def _optimizer(model: QAModel, cfg: QAConfig, total: int) -> tuple[torch.optim.Optimizer, ScheduledLR]:
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
    return optimizer, linear_schedule(optimizer, cfg.warmup_steps(total), total, decay_from=cfg.decay_from)


def dev_exact_match(answerer: Answerer, questions: list[QAExample], epoch: int) -> float:
    """Exact match on the dev questions, the model in eval mode for it (back in training mode after)."""
    answerer.model.eval()
    em = QAScore.from_dict(evaluate_qa(answerer, questions, recall_ks=())).exact_match
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
    timed: TimedSteps | None = None,
) -> Path:
    """Fine-tune; returns out/best, the model with the best dev exact match. `reader_spec` overrides the
    reader warm start of `model_spec` (the ORQA-style baseline: an ICT retriever with a BERT reader). `timed`:
    the deadline the steps end by and what sizes them (training/schedule.py: TimedSteps); None: the preset's steps. What it trained is
    recorded in steps.json."""
    cfg = preset.qa
    d = setup_distributed()
    device = default_device()
    dtype = preset.compute_dtype(device)
    torch.manual_seed(cfg.seed + d.rank)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model, index, config, sparse = qa_model_over(model_spec, index_dir, preset, reader_spec)
    store = index.corpus()
    model.to(device).train()
    k = min(cfg.top_k, len(index.block_ids))
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = cfg.total_steps(len(train))
    optimizer, scheduler = _optimizer(model, cfg, total)
    if d.main:
        run = {"recipe": "finetune_qa", "model": model_spec, "reader": reader_spec, "index": str(index_dir)}
        data = {"index_version": index.version, "train_questions": len(train), "dev_questions": len(dev)}
        record_run_config(out, run | qa_settings(preset, config) | data, resume, allow_config_change)
    step, position, state = resume_training(out, resume, model, optimizer, scheduler, d, "QA fine-tuning")
    best_em = state.get("best_em", -1.0)
    trained = DistributedDataParallel(model) if d.world_size > 1 else model
    dev_part = list(dev)[: cfg.dev_limit]
    schedule = scheduler.schedule  # its length, as a deadline settles it (training/schedule.py: TimedSchedule)
    timer = TimedSchedule(timed, schedule, warmup_of=cfg.warmup_steps, recurs={"checkpoint": cfg.checkpoint_every})
    metrics_log = MetricsLog(out, total, step, d, "QA", progress)
    batches = _prefetched(train, position, cfg, model, store, d, device)
    with batches, metrics_log:
        while step < schedule.total:
            timer.before_step(step)
            waited = time.perf_counter()
            position, questions = next(batches)
            batch = make_qa_batch(model, questions, index, store, k, cfg.beam, sparse).to(device)
            waited = time.perf_counter() - waited
            with autocast(dtype, device):
                loss, stats = trained(batch)
            loss.backward()
            optimizer_step(model, optimizer, scheduler)
            step += 1
            metrics = {"loss": loss.item(), **{m: v.item() for m, v in stats.items()}, "lr": scheduler.get_last_lr()[0]}
            metrics["batch_seconds"] = waited
            last = step == schedule.total
            end_of_epoch = step % steps_per_epoch == 0 or last  # epochs counted in steps
            if end_of_epoch and d.main:
                with timer.timing("scoring", steps_per_epoch):
                    answerer = _answerer(model, index, store, sparse, k, dtype, cfg)
                    em, best_em = _keep_if_best(answerer, dev_part, out, step, steps_per_epoch, best_em)
                metrics |= {"dev_em": em, "bm25_weight": model.fusion_weight}
            metrics_log.step(step, metrics, log_now=step % cfg.log_every == 0 or end_of_epoch, total=schedule.total)
            if step % cfg.checkpoint_every == 0 or end_of_epoch:
                with timer.timing("checkpoint", cfg.checkpoint_every):
                    save_checkpoint(
                        out, step, model, optimizer, scheduler, position, d, {"best_em": best_em}, final=last
                    )
    if d.main:
        log.info("best dev exact match %.2f: %s", best_em, json.loads((out / BEST / "dev.json").read_text()))
        _record_trained(out, cfg, total, schedule, timed)
    return out / BEST


def _record_trained(out: Path, cfg: QAConfig, total: int, schedule: LinearSchedule, timed: TimedSteps | None) -> None:
    """steps.json: the steps and warm-up planned and trained (the deadline may end them)."""
    planned = {"steps": total, "lr_warmup": cfg.warmup_steps(total), "decay_from": cfg.decay_from}
    lengths = {"steps": schedule.total, "lr_warmup": schedule.warmup, "decay_from": schedule.decay_from}
    record_steps(out, planned, lengths, timed)


def qa_model_over(
    model_spec: str, index_dir: Path, preset: Preset, reader_spec: str | None = None
) -> tuple[QAModel, MipsIndex, RetrieverConfig, BM25Searcher | None]:
    """The model to fine-tune, the index it searches (refused where another document tower built it), the
    retriever settings (pooling etc.) of that index's model, and for hybrid retrieval the BM25 index of its corpus
    (built once, kept for every epoch)."""
    cfg = preset.qa
    if cfg.retriever not in ("dense", "hybrid"):
        raise ValueError(f"QA fine-tuning retrieves with 'dense' or 'hybrid', not {cfg.retriever!r}")
    index = MipsIndex(index_dir)
    config = index.retriever_config(preset.retriever)
    model = QAModel.load(model_spec, config, cfg.span_hidden, cfg.max_span_width, reader_spec, cfg.span_head)
    index.check_doc_tower(model.retriever.doc_fingerprint())
    return model, index, config, BM25Searcher(index.corpus()) if cfg.retriever == "hybrid" else None


def _prefetched(
    train: Sequence[QAExample],
    position: DataPosition,
    cfg: QAConfig,
    model: QAModel,
    store: BlockStore,
    d: Dist,
    device: torch.device,
) -> Prefetched[tuple[DataPosition, QAQuestions]]:
    """The question batches from `position` on, built ahead of the step, with the blocks holding each answer looked
    up in an answer-token index of the corpus (above ANSWER_INDEX_MAX_BLOCKS: tested block by block)."""
    answers = AnswerBlocks(store.column("body")) if len(store) <= ANSWER_INDEX_MAX_BLOCKS else None
    tokenizer, max_tokens = model.retriever.tokenizer, model.retriever.config.query_max_tokens
    return Prefetched(qa_batches(train, position, cfg, tokenizer, max_tokens, answers, d), prefetch_depth(device))


def _keep_if_best(
    answerer: Answerer, dev: list[QAExample], out: Path, step: int, steps_per_epoch: int, best_em: float
) -> tuple[float, float]:
    """Exact match on the held-out `dev` questions after an epoch; the model goes to out/best when it is the best
    so far. Returns (this epoch's EM, the best)."""
    epoch = math.ceil(step / steps_per_epoch)
    em = dev_exact_match(answerer, dev, epoch)
    if em > best_em:
        assert isinstance(answerer.model, QAModel)
        best = {"exact_match": em, "epoch": epoch, "step": step, "questions": len(dev), "time": time.time()}
        save_best(answerer.model, out / BEST, best)
    return em, max(em, best_em)


def _answerer(
    model: QAModel,
    index: MipsIndex,
    store: BlockStore,
    sparse: BM25Searcher | None,
    k: int,
    dtype: torch.dtype,
    cfg: QAConfig,
) -> Answerer:
    """The model as it stands, answering as `ask` and `serve` will (the held-out scoring after an epoch)."""
    searcher = qa_searcher(model, index, store, sparse)
    return Answerer(model, searcher, k, store.config.max_block_tokens, dtype=dtype, selection=cfg.answer_selection)
