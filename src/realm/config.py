"""Dataclass configs and the presets, and the record of the config a run trained with (config.json).

`cpu` is sized so every stage finishes in minutes on a 2-core laptop; `gpu` is its recipe with larger batches for
one GPU; `paper` holds the settings of Guu et al. (2020) and the released TF code. Each default the cpu preset
departs from the paper with is a row of the README's "cpu preset vs the paper" table, with where it was measured.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from realm.common.io import write_json_atomic

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SERVE_BATCH_SIZE, SERVE_BATCH_WAIT_MS = 8, 5  # `realm serve`: questions read together at most; the first one's wait

Pooling = Literal["cls", "pooler", "mean"]
Backend = Literal["flat", "hnsw", "ivfpq"]


@dataclass(frozen=True)
class CorpusConfig:
    max_block_tokens: int = 288  # counts [CLS] title [SEP] body [SEP] (paper: 288 wordpieces)
    max_title_tokens: int = 32  # a longer title is cut, so a body always fits


@dataclass(frozen=True)
class EncoderShape:
    """BERT shape used when a tower is initialised at random (`--model random`)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    dropout: float = 0.1  # hidden and attention dropout of a randomly initialised BERT


@dataclass(frozen=True)
class RetrieverConfig:
    proj_dim: int = 128  # Embed_input / Embed_doc output size (paper: 128)
    pooling: Pooling = "pooler"  # pooler: BERT's pooled [CLS] (the paper); cls: the raw [CLS]; mean: MiniLM's (docs/guide.md, "Pooling")
    dropout: float = 0.1  # in training only
    dropout_position: Literal["embedding", "pooled"] = "embedding"  # after the LayerNorm (paper) or before the dense
    # REALM's null document (models/realm.py): scored, f(x, null) in one softmax with the blocks (the paper); or
    # learned_weight, p(null) = sigmoid(b_null) and the towers rank the retrieved blocks only
    null_document: Literal["scored", "learned_weight"] = "scored"
    query_max_tokens: int = 96  # pretraining query length (paper: 96)
    shape: EncoderShape = field(default_factory=EncoderShape)
    LEGACY: ClassVar[dict[str, str]] = {"dropout_position": "pooled", "null_document": "learned_weight"}  # older files

    @classmethod
    def from_dict(cls, data: dict) -> RetrieverConfig:
        """The inverse of dataclasses.asdict (as saved in checkpoints and builder configs)."""
        data = {**cls.LEGACY, **data}
        return cls(**{**data, "shape": EncoderShape(**data["shape"])}) if "shape" in data else cls(**data)


@dataclass(frozen=True)
class EmbedConfig:
    batch_size: int = 64
    # bf16 weights on CPUs with native bf16 matmul (AVX-512 BF16 / AMX) or on GPUs; fp32 elsewhere.
    compute_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    storage_dtype: Literal["fp16", "fp32"] = "fp16"
    shard_size: int = 50_000  # blocks per resumable shard


@dataclass(frozen=True)
class IndexConfig:
    backend: Backend = "flat"
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 256
    ivf_nlist: int = 0  # 0: chosen from the corpus size (4 * sqrt(n))
    ivf_nprobe: int = 32
    pq_m: int = 32  # sub-quantisers (bytes per vector); lowered to a divisor of the dim
    # ivfpq: fetch rerank x k candidates and rescore them exactly from the stored embeddings (0: do not)
    ivf_rerank: int = 4
    # flat: up to this many vectors, a faiss IndexFlatIP in RAM (fp32); beyond, exact search scans the
    # memory-mapped fp16 embeddings chunk by chunk (RAM: one chunk, not N x D x 4 bytes).
    flat_in_memory_rows: int = 2_000_000
    keep_versions: int = 2  # published versions kept on disk (older ones are deleted)


@dataclass(frozen=True)
class ICTConfig:
    """Inverse Cloze Task warm start of the retriever (ORQA)."""

    steps: int = 100_000
    batch_size: int = 4096  # in-batch negatives: every other context of the batch
    lr: float = 1e-4
    warmup_steps: int = 1000
    remove_sentence_prob: float = 0.9  # the query sentence is removed from its context 90% of the time
    checkpoint_every: int = 1000
    log_every: int = 10
    seed: int = 0
    decay_from: int = 0  # the decay starts no earlier than this step (a deadline's timed steps: training/schedule.py)


@dataclass(frozen=True)
class PretrainConfig:
    """REALM pretraining (paper: 200k steps, batch 512, lr 3e-5, 8 candidates incl. the null document)."""

    steps: int = 200_000
    batch_size: int = 512
    lr: float = 3e-5
    head_lr_multiplier: float = 1.0  # the reader's masked-LM head; >1 when it starts fresh (MiniLM has none)
    retriever_lr: float | None = None  # both towers; None: `lr`
    # fixed: only the query tower trains and the first index stays exact (ORQA's fine-tuning); the paper trains both
    doc_tower: Literal["trained", "fixed"] = "trained"
    retriever_frozen_steps: int = 0  # towers keep lr 0 this long, while a fresh head learns to read
    null_warmup_steps: int = 0  # the first N steps retrieve nothing: a cheap warm-up of a fresh masked-LM head
    # what the warm-up reads besides the null document: nothing, one block (recipes/warmup.py)
    reader_warmup: Literal["null", "copy", "context", "copy+context", "holder"] = "null"
    reader_warmup_window: int = 0  # copy/context: words of the own block kept each side of the sentence (0: all)
    # marginal: the paper's loss; marginal+candidates adds each candidate's own masked-LM loss, for the reader only
    # (models/realm.py: candidate_mlm_loss), so that it learns to ignore a block that does not hold the span
    reader_loss: Literal["marginal", "marginal+candidates"] = "marginal"
    # learned_weight's b_null (models/realm.py; starts at 0, p(null) 0.5): one scalar, Adam moves it ~this much a step
    null_score_lr: float = 0.05
    warmup_steps: int = 10_000
    # the reader's rate decays from the warm-up's end, and no earlier than this step (a deadline's timed steps)
    decay_from: int = 0
    num_candidates: int = 8  # including the null document, which is always first
    max_masks: int = 10
    masking: Literal["salient", "random-span", "uniform"] = "salient"
    salient_spans: Literal["any", "recoverable"] = "any"  # recoverable: only those another document holds
    # centre masked queries on their mean embedding, tracked with this momentum a step (against hubness); 0: never
    mask_center_momentum: float = 0.0
    refresh_every: int = 500  # a trained document tower: snapshot for the index builder every N steps; 0: stale index
    builder_nice: int = 0  # the builder process's niceness (0-19) on the trainer's machine
    # local: the trainer starts its builder beside it; external: `realm index refresh --config <out>/builder.json`
    builder: Literal["local", "external"] = "local"
    checkpoint_every: int = 1000
    log_every: int = 10
    held_out_fraction: float = 0.01  # sentences kept out of training for evaluation
    seed: int = 0

    @property
    def towers_start_step(self) -> int:
        """The first step the towers train (and the index refreshes): after the freeze and the null warm-up."""
        return max(self.retriever_frozen_steps, self.null_warmup_steps)


@dataclass(frozen=True)
class QAConfig:
    """Open-QA fine-tuning (ORQA settings: lr 1e-5, top-5 blocks to the reader, retrieval beam 5000, span
    hidden 256, spans of at most 10 wordpieces). Questions are cut to the retriever's query length."""

    epochs: float = 2.0  # passes over the training questions (a fraction: the steps of that share of a pass)
    batch_size: int = 16
    lr: float = 1e-5
    head_lr_multiplier: float = 1.0  # the span head starts fresh
    retriever_lr: float | None = None  # the query tower; None: `lr`
    top_k: int = 5  # blocks given to the reader
    # best_span: ORQA's argmax over (block, span); marginal: the string with the largest summed p(y | x) (answerer.py)
    answer_selection: Literal["marginal", "best_span"] = "best_span"
    beam: int = 5000  # blocks searched for the early-update retrieval loss (hybrid: from each retriever)
    retriever: str = "dense"  # dense | hybrid (dense + w · BM25 over the union of both top lists; w learned)
    fusion_lr: float = 1e-2  # learning rate of the hybrid's BM25 weight w (one scalar: Adam moves it ~lr a step)
    span_hidden: int = 256
    max_span_width: int = 10
    # a fresh reader's span head: orqa (ORQA/REALM's span MLP) or start_end (BERT's SQuAD head; span_reader.py)
    span_head: Literal["orqa", "start_end"] = "orqa"
    steps: int | None = None  # None: `epochs` passes over the training questions (a budget may set fewer)
    lr_warmup: int | None = None  # None: ORQA's rule from the steps (`warmup_steps`); a deadline settles it
    decay_from: int = 0  # the decay starts no earlier than this step (a deadline's timed steps: training/schedule.py)
    dev_limit: int | None = None  # held-out questions scored after each epoch to keep the best (None: all)
    checkpoint_every: int = 500
    log_every: int = 10
    seed: int = 0

    def total_steps(self, num_questions: int) -> int:
        """`steps` if set, else `epochs` passes over the training questions."""
        return self.steps or math.ceil(self.epochs * math.ceil(num_questions / self.batch_size))

    def warmup_steps(self, total_steps: int) -> int:
        """ORQA: min(10000, max(100, steps / 10)), unless `lr_warmup` names it (a deadline's run, replayed)."""
        return self.lr_warmup if self.lr_warmup is not None else min(10_000, max(100, total_steps // 10))


@dataclass(frozen=True)
class ReadingConfig:
    """The reading stage before open-QA fine-tuning (recipes/reading.py): the span reader trained on one block
    holding the answer and `negatives` retrieved blocks without it per question, so that the minutes of a budget buy
    several passes over the questions where ORQA's steps (five retrieved blocks a question) buy less than one. Not
    in ORQA or REALM: `epochs` 0 (the paper preset) runs none."""

    epochs: float = 0.0  # passes over the training questions that have an answer-bearing block (0: no stage)
    batch_size: int = 16  # questions a step
    negatives: int = 1  # retrieved blocks without an answer read beside the one with it
    depth: int = 20  # the retrieved blocks searched for the answer-bearing block and the negatives
    lr: float = 1e-4
    head_lr_multiplier: float = 10.0  # the span head starts fresh
    steps: int | None = None  # None: `epochs` passes (a budget sets the steps)
    lr_warmup: int | None = None  # None: a tenth of the steps; a deadline settles it
    decay_from: int = 0  # the decay starts no earlier than this step (a deadline's timed steps: training/schedule.py)
    checkpoint_every: int = 100
    log_every: int = 10
    seed: int = 0

    def total_steps(self, num_questions: int) -> int:
        """`steps` if set, else `epochs` passes over `num_questions` (0: no reading stage)."""
        if self.steps is not None:
            return self.steps
        return math.ceil(self.epochs * num_questions / self.batch_size) if self.epochs > 0 else 0

    def warmup_steps(self, total_steps: int) -> int:
        return self.lr_warmup if self.lr_warmup is not None else max(1, total_steps // 10)


@dataclass(frozen=True)
class StageCosts:
    """What a unit of work costs, so `realm pipeline --budget-minutes` can scale step counts to fit: measured on the
    machine before planning (pipeline/calibrate.py); these constants (the 2-core development machine, at 62bcf5a,
    rounded up: docs/log/2026-11-23-results-realm-pipeline-in-120-minutes-without-ablations.md) only where that cannot
    run."""

    source: str = "the preset's constants"  # or what measured them
    fixed_seconds: float = 60.0  # after the stages: the report, the process end
    embed_blocks_per_second: float = 105.0  # one index build, the process start included
    tag_blocks_per_second: float = 60.0  # spaCy sentence and entity tagging for salient spans
    ict_step: float = 1.9
    pretrain_step: float = 4.2  # a retrieval step; the index builder shares the cores
    frozen_pretrain_step: float = 2.9  # a retrieval step with no index builder
    # the query tower alone (--doc-tower fixed); bf16 not measured: the fp32 figure x the refreshing ratio 4.2 / 7.8
    query_tower_pretrain_step: float = 1.9
    null_pretrain_step: float = 0.5  # the null document alone (--null-warmup-steps): 0.47 s measured
    qa_step: float = 2.4
    # a reading step (16 questions, one block each: 16 reader rows, no query tower): 1,839 steps in 26.0 min here
    # (docs/log/2026-12-07-results-a-reading-stage-before-orqa-fine-tuning.md)
    read_step: float = 0.85
    # finding a training question's answer-bearing block (retrieval, answer lookup, the window): 57 s for 7,342 here
    read_question: float = 0.01
    read_startup: float = 15.0
    qa_question: float = 0.09  # evaluating one question with one retriever and the reader
    # one question with dense, BM25 and hybrid retrieval, which share the blocks read: here 3x one, an upper bound
    qa_systems_question: float = 0.27
    recall_question: float = 0.01  # zero-shot recall of one question: its query embedded and searched
    # one held-out sentence scored with and without retrieval, each of its salient spans in turn (~2.8): 7.75 min for
    # 1,000 and the worked examples' pool of 100 (d1c3134 on this machine class:
    # docs/log/2026-11-28-results-training-first-the-50-minute-qa-pipeline-on-a-bf16-cpu-and-in-fp32.md)
    scored_sentence: float = 0.45
    # a trainer's start: model loads, the BM25 index of a hybrid QA run, the first step's allocations
    ict_startup: float = 10.0
    pretrain_startup: float = 15.0
    qa_startup: float = 20.0


# The same 2-core EPYC class with AVX2 only (every stage in fp32), measured there, rounded up; the frozen-index step
# not measured: the bf16 frozen/refreshing ratio applied:
# docs/log/2026-11-23-benchmarks-stage-costs-without-bf16-the-plan-on-an-avx2-only-cpu.md
FP32_CPU_COSTS = StageCosts(
    source="the preset's fp32 constants (no bf16 matmul here)",
    embed_blocks_per_second=45.0,
    ict_step=2.5,
    pretrain_step=7.8,
    frozen_pretrain_step=5.4,
    query_tower_pretrain_step=3.4,
    null_pretrain_step=0.55,
    qa_step=4.0,
    read_step=1.45,  # not measured in fp32: the bf16 step x QA's fp32/bf16 ratio (4.0 / 2.4)
    read_question=0.02,
    qa_question=0.17,
    qa_systems_question=0.51,
    recall_question=0.02,
    # held-out scoring and worked examples: 16.7 min for 1,100:
    # docs/log/2026-11-28-results-training-first-the-50-minute-qa-pipeline-on-a-bf16-cpu-and-in-fp32.md
    scored_sentence=0.9,
)


# `--ablations` runs four REALM pretrainings and five fine-tunings where the bare command runs one of each. Below
# about 143 minutes (the plan's `reading_minutes` at the costs the a3b6601 record measured on a 2-core AVX-512 BF16
# Xeon) the plan cuts every REALM run's reader warm-up short of the 1,000 steps after which retrieval helped
# (pipeline/estimate.py: WARMUP_FINDING), and Table 2 would compare warm-ups (at 70 minutes: 397 warm-up steps of
# 436). Its default budget where the preset has one; an fp32 machine's plan says the budget its warm-up needs.
ABLATIONS_BUDGET_MINUTES = 150


@dataclass(frozen=True)
class Preset:
    name: str
    corpus: CorpusConfig
    retriever: RetrieverConfig
    embed: EmbedConfig
    index: IndexConfig
    ict: ICTConfig = field(default_factory=ICTConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    qa: QAConfig = field(default_factory=QAConfig)
    reading: ReadingConfig = field(default_factory=ReadingConfig)  # before QA; the default: none (ORQA's recipe)
    costs: StageCosts = field(default_factory=StageCosts)  # with bf16 matmul (the machine the preset is sized for)
    fp32_costs: StageCosts | None = None  # in fp32, without bf16 matmul (None: the same)
    pipeline_budget_minutes: float | None = None  # `realm pipeline` default; None: the preset's own step counts
    pipeline_ict: bool = True  # `realm pipeline` trains ICT before REALM (False: REALM starts from the warm start)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The one precision every stage computes in on `device`: trainers, embedding, answering (`--dtype`; kept in
        the embed section, which the index builder receives)."""
        from realm.common.device import resolve_compute_dtype

        return resolve_compute_dtype(self.embed.compute_dtype, device)


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        name="cpu",
        corpus=CorpusConfig(max_block_tokens=128, max_title_tokens=24),
        retriever=RetrieverConfig(
            pooling="mean",
            dropout_position="pooled",
            null_document="learned_weight",
            query_max_tokens=64,
            shape=EncoderShape(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
        ),
        embed=EmbedConfig(batch_size=64, compute_dtype="auto", shard_size=8192),
        index=IndexConfig(),
        ict=ICTConfig(steps=200, batch_size=32, lr=5e-5, warmup_steps=20, checkpoint_every=50, log_every=5),
        pretrain=PretrainConfig(
            # 1,000 warm-up steps (the reader starts to copy after 600-800), then 100 retrieval steps, in which the
            # query tower trains:
            # docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md
            steps=1100,
            batch_size=8,
            lr=1e-4,
            head_lr_multiplier=10.0,
            warmup_steps=20,
            # at 1e-5 the query tower fell below MiniLM's zero-shot recall (-0.60 on SQuAD); at 3e-6 it never did and
            # gained a little on three question sets, the held-out gain no lower:
            # docs/log/2026-11-27-results-the-query-tower-s-learning-rate-in-realm-pretraining-paired-from-one.md
            retriever_lr=3e-6,
            doc_tower="fixed",
            null_warmup_steps=1000,
            # the warm-up reads the sentence's own block, whole or without the sentence, and each candidate is also
            # scored alone, so that the reader learns to use a block:
            # docs/log/2026-11-26-results-a-reader-that-copies-the-copy-warm-ups-tenth-part-fp32.md
            reader_warmup="copy+context",
            # 24 words each side of the sentence: cheaper steps, as good a reader:
            # docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md
            reader_warmup_window=24,
            reader_loss="marginal+candidates",
            num_candidates=4,
            max_masks=10,
            mask_center_momentum=0.01,  # against hubness (docs/guide.md: "Masked queries are embedded apart")
            refresh_every=40,  # the ablations that train the document tower
            checkpoint_every=50,
            log_every=5,
            # 5% of the documents (~2,500 sentences): the trainer draws ~10,000 of the rest, and the held-out
            # masked-span gain needs the sample (at 1%, 284 sentences with a salient span: +-0.55 points)
            held_out_fraction=0.05,
        ),
        qa=QAConfig(
            # 0.6 of a pass after the reading stage's two: about the minutes one pass of QA alone took
            epochs=0.6,
            batch_size=8,
            # one epoch at 1e-4 from MiniLM reached 44.8 EM dense, 50.1 with BM25:
            # docs/log/2026-11-23-results-open-qa-fine-tuning-the-reader-s-normalisation-and-one-epoch-from.md
            lr=1e-4,
            head_lr_multiplier=10.0,
            retriever_lr=1e-5,
            beam=100,
            retriever="hybrid",
            answer_selection="marginal",
            # BERT's start/end head over ORQA's span MLP: after 8 minutes of reading on the tuning split +3.8 EM
            # [+1.0, +6.8] at lr 1e-4, +1.8 [-0.8, +4.4] at 2e-4 (one run each):
            # docs/log/2026-12-07-results-the-reader-s-ceiling-and-its-levers.md
            span_head="start_end",
            dev_limit=500,
            checkpoint_every=50,
            log_every=5,
        ),
        # the reader first reads one answer-bearing block a question, two passes (recipes/reading.py): at equal
        # minutes on the tuning split +2.0 [-1.4, +5.4] EM over ORQA's fine-tuning alone, +5.0 with the gold
        # paragraph alone; no negative (one: -0.6, at a step twice the cost); lr 2e-4 over 1e-4 +3.4 [+0.6, +6.4]
        # (4e-4: +4.8 open, -3.4 with the gold paragraph against 2e-4):
        # docs/log/2026-12-07-results-a-reading-stage-before-orqa-fine-tuning.md,
        # docs/log/2026-12-07-results-the-reader-s-ceiling-and-its-levers.md
        reading=ReadingConfig(epochs=2.0, batch_size=16, negatives=0, lr=2e-4, checkpoint_every=50, log_every=5),
        fp32_costs=FP32_CPU_COSTS,
        # buys 1,000 warm-up steps on a slow 2-core fp32 machine:
        # docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md
        pipeline_budget_minutes=70,
        # its minutes buy REALM steps:
        # docs/log/2026-11-26-results-the-readme-main-command-without-ict-ict-steps-0-fp32.md
        pipeline_ict=False,
    ),
    "paper": Preset(
        name="paper",
        corpus=CorpusConfig(max_block_tokens=288, max_title_tokens=32),
        retriever=RetrieverConfig(pooling="pooler", query_max_tokens=96, shape=EncoderShape()),
        embed=EmbedConfig(batch_size=128, compute_dtype="auto", shard_size=500_000),
        index=IndexConfig(),
    ),
}


def _gpu_sized(cpu: Preset, scale: int = 4) -> Preset:
    """The cpu preset's recipe with `scale` times the sentences, contexts and blocks a step, for one GPU: a cpu-sized
    step (8 sentences x 4 candidates) leaves an H200 idle whatever the host does
    (docs/log/2026-11-26-results-retrieval-steps-on-a-gpu-how-far-more-of-them-go-fourth-part.md). The same model,
    corpus and examples seen: steps divided by `scale`, learning rates multiplied by its square root (Adam's square-root
    rule, Malladi et al. 2022), and REALM reads the paper's 8 candidates. QA doubles its batch only: its warm-up is
    ORQA's at least 100 steps, which a shorter run would spend mostly warming up. Not yet measured against the cpu
    recipe on a GPU (`scripts/gpu_run.sh check` does)."""

    def root(lr: float, factor: float = scale) -> float:  # lr x sqrt(factor), to 3 significant digits
        return float(f"{lr * math.sqrt(factor):.3g}")

    pretrain, qa, reading = cpu.pretrain, cpu.qa, cpu.reading
    return dataclasses.replace(
        cpu,
        name="gpu",
        embed=dataclasses.replace(cpu.embed, batch_size=cpu.embed.batch_size * 8),
        ict=dataclasses.replace(cpu.ict, batch_size=cpu.ict.batch_size * scale, lr=root(cpu.ict.lr)),
        pretrain=dataclasses.replace(
            pretrain,
            steps=pretrain.steps // scale,
            batch_size=pretrain.batch_size * scale,
            num_candidates=8,
            lr=root(pretrain.lr),
            retriever_lr=root(pretrain.retriever_lr) if pretrain.retriever_lr else None,
            warmup_steps=max(1, pretrain.warmup_steps // scale),
            null_warmup_steps=pretrain.null_warmup_steps // scale,
            refresh_every=max(1, pretrain.refresh_every // scale),
            checkpoint_every=max(1, pretrain.checkpoint_every // scale),
        ),
        qa=dataclasses.replace(
            qa,
            batch_size=qa.batch_size * 2,
            lr=root(qa.lr, 2),
            retriever_lr=root(qa.retriever_lr, 2) if qa.retriever_lr else None,
        ),
        reading=dataclasses.replace(reading, batch_size=reading.batch_size * scale, lr=root(reading.lr)),
        # the cpu preset's budget: a GPU user's 70 minutes buy 70 minutes of GPU training (pipeline/plan.py)
    )


PRESETS["gpu"] = _gpu_sized(PRESETS["cpu"])


def default_preset() -> str:
    """`realm pipeline`'s preset when none is named: `gpu` where CUDA is, else `cpu`."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None


# -- the config a run trained with -------------------------------------------------------------
RUN_CONFIG = "config.json"


def _flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def parse_settings(pairs: list[str], config: type = PretrainConfig) -> dict[str, object]:
    """`key=value` -> {key: value}, each a field of the dataclass `config`; values read as JSON where they parse
    (the experiments' `--set`)."""
    fields = {f.name for f in dataclasses.fields(config)}
    changes: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--set {pair!r}: expected key=value with key one of {', '.join(sorted(fields))}")
        try:
            changes[key] = json.loads(text)
        except json.JSONDecodeError:
            changes[key] = text
    return changes


def read_run_config(folder: Path) -> dict | None:
    """The config.json that `record_run_config` wrote in folder ({"config", "command", "version", "time"}), or None."""
    path = Path(folder) / RUN_CONFIG
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def record_run_config(out_dir: Path, config: dict, resume: bool, allow_change: bool = False) -> None:
    """Write out_dir/config.json: the resolved config the run trains with, the command line and the package
    version. Resuming a run whose saved config differs is refused, naming the keys that differ, unless
    `allow_change`: a resumed run must not silently mix two settings."""
    from realm import __version__

    path = Path(out_dir) / RUN_CONFIG
    config = json.loads(json.dumps(config))  # what the file will hold (tuples as lists, paths as strings)
    if resume and path.exists():
        saved, new = _flatten(json.loads(path.read_text())["config"]), _flatten(config)
        changed = [key for key in sorted(saved.keys() | new.keys()) if saved.get(key) != new.get(key)]
        if changed and not allow_change:
            listed = ", ".join(f"{key} ({saved.get(key)!r} -> {new.get(key)!r})" for key in changed)
            raise ValueError(
                f"{path}: --resume with settings that differ from the saved run: {listed}; resume with "
                "the same settings, or pass --allow-config-change to continue with the new ones"
            )
        if changed:
            log.warning("resuming %s with changed settings: %s", out_dir, ", ".join(changed))
    write_json_atomic(path, {"config": config, "command": sys.argv, "version": __version__, "time": time.time()})
