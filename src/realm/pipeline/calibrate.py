"""Measure this machine before planning: a few timed steps of each trainer and timed slices of tagging, embedding
and evaluation, run by the recipes themselves on a sample of the run's own corpus and questions, in the precision
the run trains in. The plan (pipeline/plan.py) sizes every stage from these figures; the preset's `StageCosts`
constants stay only the fallback where the run's data is too small to calibrate on.

A trainer's step time is read from its metrics log (one row a step, each with its wall time): the mean over
`TIMED_STEPS` steps after `UNTIMED_STEPS` (allocation, kernel selection). The last QA step also scores the dev
sample and saves the best model, so it is not timed either.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from realm.common.device import default_device
from realm.common.io import write_json_atomic
from realm.config import Preset, StageCosts
from realm.data.blocks import META, BlockStore, Fingerprint, write_blocks
from realm.data.qa_examples import QAExample
from realm.data.sentences import build_sentences, tag_salient_spans
from realm.eval.answerer import load_answerers
from realm.eval.qa import evaluate_qa
from realm.index.build import build_from_retriever
from realm.models.retriever import Retriever
from realm.pipeline.work import SYSTEMS
from realm.recipes.finetune_qa import BEST, train_qa
from realm.recipes.ict import train_ict
from realm.recipes.pretrain import train_pretrain
from realm.training import read_metrics

log = logging.getLogger(__name__)

SAMPLE_BLOCKS = 384  # corpus blocks the trainers, the tagger and the embedder run on
SAMPLE_QUESTIONS = 32  # dev questions scored to cost evaluation
UNTIMED_STEPS = 2
TIMED_STEPS = 6
NEVER = 10**9  # no checkpoint inside the timed steps
# Not timed here: what follows training. The report scores every salient span of up to 1,000 held-out sentences,
# about 0.22 a corpus block, each in about 1/20 of a retrieval step's time (README run, fp32: 2,787 spans of 12,911
# blocks in 6.75 min with 2.62 s steps); the rest (model loads, the worked examples' pool, the report) is
# FINAL_SECONDS. The process start, the corpus and the warm start are measured stages, counted before planning.
FINAL_SECONDS = 40.0
SCORED_SPANS_PER_BLOCK, SCORED_SPANS_MAX, SPAN_IN_RETRIEVAL_STEPS = 0.22, 2_850, 0.05


def calibration_settings(preset: Preset) -> dict:
    """What the measurements depend on (the calibration stage's settings): the preset but its constant costs, the
    precision it computes in here, and the sample."""

    return {
        "preset": {k: v for k, v in preset.to_dict().items() if k not in ("costs", "fp32_costs")},
        "dtype": str(preset.compute_dtype(default_device())),
        "sample": [SAMPLE_BLOCKS, SAMPLE_QUESTIONS, UNTIMED_STEPS, TIMED_STEPS],
    }


def sample_corpus(store: BlockStore, folder: Path, blocks: int, seed: int = 0) -> BlockStore:
    """A corpus folder of `blocks` blocks drawn evenly at random from `store` (so lengths are typical), in order."""
    ids = np.sort(np.random.default_rng(seed).choice(len(store), size=min(blocks, len(store)), replace=False))
    chosen = store.take(ids.tolist())
    fingerprint = Fingerprint(store.config, store.meta.tokenizer_fingerprint)
    for block in chosen:
        fingerprint.update(block)
    digest = fingerprint.hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    write_blocks(folder / f"blocks-{digest}.arrow", chosen)
    meta = dataclasses.replace(
        store.meta,
        fingerprint=digest,
        blocks_file=f"blocks-{digest}.arrow",
        num_blocks=len(chosen),
        num_documents=len({b.doc_id for b in chosen}),
    )
    write_json_atomic(folder / META, asdict(meta))
    return BlockStore(folder)


def step_seconds(trainer: Path, first: int, last: int) -> float:
    """Mean seconds of the steps first+1 .. last of a trainer that logged every step."""
    times = {row["step"]: row["time"] for row in read_metrics(trainer)}
    return (times[last] - times[first]) / (last - first)


def _timed(work) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def calibrate(
    corpus: Path,
    warm_start: Path,
    folder: Path,
    preset: Preset,
    qa: tuple[Sequence[QAExample], Sequence[QAExample], Path] | None = None,
) -> dict:
    """The preset's stage costs as measured here (`costs`, a StageCosts dict) and the raw figures (`measured`).
    `qa`: training and dev questions, and the warm start's index of the whole corpus. A QA step and a question
    are timed there, not on the sample: what they read grows with the corpus (the BM25 and dense beam of 100 blocks
    each, labelled for answers; the reader's top 5, longer the more blocks retrieval chooses from: 24% more time a
    step than on a sample of 384 blocks, docs/benchmarks.md). Raises ValueError where the data is too small for a
    trainer's batch."""

    for entry in folder.iterdir():  # an interrupted calibration starts over: it is short
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    store = sample_corpus(BlockStore(corpus), folder / "corpus", SAMPLE_BLOCKS)
    measured: dict[str, float] = {"blocks": len(store), "corpus_blocks": len(BlockStore(corpus))}
    if preset.ict.steps:  # 0: the run has no ICT stage
        measured["ict_step"] = _time_ict(store, warm_start, folder / "ict", preset)
    tag_salient_spans([], progress=False)  # the tagger's import, outside the timing
    measured["tag_blocks_per_second"] = len(store) / _timed(lambda: build_sentences(store, progress=False))
    retriever = Retriever.load(str(warm_start / "retriever"), preset.retriever)
    index = folder / "realm" / "index"
    embedding = _timed(
        lambda: build_from_retriever(retriever, store, index, preset.embed, preset.index, 0, time.time())
    )
    measured["embed_blocks_per_second"] = len(store) / embedding
    measured |= _time_pretrain(store, warm_start, folder / "realm", preset)
    if qa is not None:
        measured |= _time_qa(*qa, warm_start, folder / "qa", preset)
    for heavy in ("ict", "realm", "qa"):
        for part in ("checkpoints", "retriever", "reader", "index"):
            shutil.rmtree(folder / heavy / part, ignore_errors=True)
    dtype = calibration_settings(preset)["dtype"].removeprefix("torch.")
    return {"costs": asdict(measured_costs(preset, measured, dtype)), "measured": measured}


STEPS = UNTIMED_STEPS + TIMED_STEPS  # each timed trainer's steps


def _time_ict(store: BlockStore, warm_start: Path, out: Path, preset: Preset) -> float:
    """Seconds an ICT step."""

    ict = dataclasses.replace(preset.ict, steps=STEPS, warmup_steps=1, checkpoint_every=NEVER, log_every=1)
    train_ict(store.folder, out, str(warm_start / "retriever"), dataclasses.replace(preset, ict=ict), progress=False)
    return step_seconds(out, UNTIMED_STEPS, STEPS)


def _time_pretrain(store: BlockStore, warm_start: Path, out: Path, preset: Preset) -> dict[str, float]:
    """Seconds a REALM step on the null document (the warm-up) and, with candidates, a retrieval step (over the
    index the caller built in out/index)."""

    retrieval = preset.pretrain.num_candidates > 1
    # the holder warm-up reads one block where another document holds the span, which the sample rarely has: its
    # cost is the context warm-up's (one block for every sentence), an upper bound
    reading = "context" if preset.pretrain.reader_warmup == "holder" else preset.pretrain.reader_warmup
    pretrain = dataclasses.replace(
        preset.pretrain,
        reader_warmup=reading,
        steps=2 * STEPS if retrieval else STEPS,
        null_warmup_steps=STEPS if retrieval else 0,
        retriever_frozen_steps=STEPS if retrieval else 0,
        refresh_every=0,  # a retrieval step without the index builder: its share is costed by the preset's ratio
        warmup_steps=1,
        checkpoint_every=NEVER,
        log_every=1,
    )
    timed = dataclasses.replace(preset, pretrain=pretrain)
    train_pretrain(store.folder, out, str(warm_start / "retriever"), str(warm_start / "reader"), timed, progress=False)
    measured = {"null_pretrain_step": step_seconds(out, UNTIMED_STEPS, STEPS)}
    if retrieval:
        measured["retrieval_pretrain_step"] = step_seconds(out, STEPS + UNTIMED_STEPS, 2 * STEPS)
    return measured


def _time_qa(
    qa_train: Sequence[QAExample],
    qa_dev: Sequence[QAExample],
    qa_index: Path,
    warm_start: Path,
    out: Path,
    preset: Preset,
) -> dict[str, float]:
    """Seconds a QA fine-tuning step and a dev question (retrieval and reading) over the whole corpus's index."""

    batch = preset.qa.batch_size
    if len(qa_train) < batch:
        raise ValueError(f"{len(qa_train)} training questions: fewer than one batch of {batch}")
    picked = np.random.default_rng(0).choice(len(qa_train), size=(STEPS + 1) * batch)
    train = [qa_train[i] for i in picked]  # one epoch of steps + 1 steps: the last scores the dev sample
    dev = list(qa_dev)[:SAMPLE_QUESTIONS]
    tuned = dataclasses.replace(
        preset,
        qa=dataclasses.replace(preset.qa, steps=None, epochs=1, dev_limit=1, checkpoint_every=NEVER, log_every=1),
    )
    best = train_qa(str(warm_start), qa_index, train, dev, out, tuned, progress=False)
    measured = {"qa_step": step_seconds(out, UNTIMED_STEPS, STEPS)}
    # first what dev scoring in fine-tuning reads with, alone; then the evaluation's other systems, sharing its reads
    first = preset.qa.retriever
    answerers = load_answerers(str(best), qa_index, tuned, [first, *(s for s in SYSTEMS if s != first)])
    seconds = [
        _timed(lambda answerer=answerer: evaluate_qa(answerer, dev, (1, 5, 20))) for answerer in answerers.values()
    ]
    measured["qa_question"] = seconds[0] / len(dev)
    measured["qa_systems_question"] = sum(seconds) / len(dev)
    shutil.rmtree(out / BEST)
    return measured


def measured_costs(preset: Preset, measured: dict[str, float], dtype: str) -> StageCosts:
    """The preset's StageCosts with what was measured put in. A pretraining step of a kind not measured (the query
    tower alone, or both towers beside the index builder) keeps its ratio to the measured kind in the preset."""
    base = preset.costs
    measured_kind = "query_tower_pretrain_step" if preset.pretrain.doc_tower == "fixed" else "frozen_pretrain_step"
    retrieval_step = measured.get("retrieval_pretrain_step", getattr(base, measured_kind))
    ratio = retrieval_step / getattr(base, measured_kind)
    spans = min(SCORED_SPANS_MAX, SCORED_SPANS_PER_BLOCK * measured.get("corpus_blocks", SCORED_SPANS_MAX))
    kinds = ("pretrain_step", "frozen_pretrain_step", "query_tower_pretrain_step")
    return dataclasses.replace(
        base,
        source=f"the costs measured on this machine in {dtype}",
        fixed_seconds=FINAL_SECONDS + spans * SPAN_IN_RETRIEVAL_STEPS * retrieval_step,
        **{kind: getattr(base, kind) * ratio for kind in kinds},
        **{k: v for k, v in measured.items() if k in {f.name for f in dataclasses.fields(StageCosts)}},
    )
