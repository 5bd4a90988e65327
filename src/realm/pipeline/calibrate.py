"""Measure this machine before planning: a few timed steps of each trainer and timed slices of tagging, embedding
and evaluation, run by the recipes themselves on a sample of the run's own corpus and questions, in the precision
the run trains in. The plan (pipeline/plan.py) sizes every stage from these figures; the preset's `StageCosts`
constants stay only the fallback where the run's data is too small to calibrate on.

A trainer's step time is read from its metrics log (one row a step, each with its wall time, taken after the
step's loss is read back, so a GPU's queue is drained): the mean over the timed steps after `UNTIMED_STEPS`
(allocation, kernel selection); on a GPU, whose steps take tens of milliseconds, TIMED_STEPS_CUDA of them. The last QA step also scores the dev sample and saves the best model, so it is not timed either.
Evaluation is timed after a first untimed batch. A trainer's start (model loads, a hybrid run's BM25 index, the
first step's allocations) is timed from its call to its first step, less one step.
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
from realm.data.sentences import SentenceSet, build_sentences, cached_sentences, tag_salient_spans
from realm.eval.answerer import load_answerers
from realm.eval.mlm import masked_span_accuracy
from realm.eval.qa import evaluate_qa
from realm.index.build import build_from_retriever
from realm.index.mips import MipsIndex
from realm.index.search import open_searcher, search_all
from realm.models.retriever import Retriever
from realm.pipeline.work import SYSTEMS, held_out_scoring
from realm.recipes.finetune_qa import BEST, train_qa
from realm.recipes.ict import train_ict
from realm.recipes.pretrain import train_pretrain
from realm.recipes.reading import reading_summary, train_reading
from realm.training.metrics import read_metrics

log = logging.getLogger(__name__)

SAMPLE_BLOCKS = 384  # corpus blocks the trainers, the tagger and the embedder run on
SAMPLE_QUESTIONS = 32  # dev questions scored to cost evaluation
UNTIMED_STEPS = 2
TIMED_STEPS = 6  # on a CPU: 6-40 s of steps
TIMED_STEPS_CUDA = 40  # a 60 ms step: 2.4 s timed, so a step is known to a few percent
NEVER = 10**9  # no checkpoint inside the timed steps
SCORED_SAMPLE = 24  # held-out sentences of the sample scored to cost the held-out scoring
# Not timed here: the report and the process end. The process start, the corpus and the warm start are measured
# stages, counted before planning.
FINAL_SECONDS = 40.0


def timed_steps() -> int:
    """How many steps of each trainer are timed on this machine's device."""
    return TIMED_STEPS_CUDA if default_device().type == "cuda" else TIMED_STEPS


def calibration_settings(preset: Preset) -> dict:
    """What the measurements depend on (the calibration stage's settings): the preset but its constant costs, the
    precision it computes in here, and the sample."""

    return {
        "preset": {k: v for k, v in preset.to_dict().items() if k not in ("costs", "fp32_costs")},
        "dtype": str(preset.compute_dtype(default_device())),
        "sample": [SAMPLE_BLOCKS, SAMPLE_QUESTIONS, UNTIMED_STEPS, timed_steps(), SCORED_SAMPLE],
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


def startup_seconds(trainer: Path, called: float, step: float) -> float:
    """Seconds from a trainer's call (wall time `called`) to its first logged step, less that step (`step` s)."""
    return max(0.0, read_metrics(trainer)[0]["time"] - called - step)


def calibrate(
    corpus: Path,
    warm_start: Path,
    folder: Path,
    preset: Preset,
    qa: tuple[Sequence[QAExample], Sequence[QAExample], Path] | None = None,
) -> dict:
    """The preset's stage costs as measured here (`costs`, a StageCosts dict) and the raw figures (`measured`).
    `qa`: training and dev questions, and the warm start's index of the whole corpus. A QA step and a question are timed
    there, not on the sample: what they read grows with the corpus (the BM25 and dense beam of 100 blocks each, labelled
    for answers; the reader's top 5, longer the more blocks retrieval chooses from: 24% more time a step than on a
    sample of 384 blocks:
    docs/log/2026-11-25-benchmarks-the-plan-sized-on-this-machine-calibration-then-pace-issue-31.md). Raises ValueError
    where the data is too small for a trainer's batch."""

    for entry in folder.iterdir():  # an interrupted calibration starts over: it is short
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    whole = BlockStore(corpus)
    store = sample_corpus(whole, folder / "corpus", SAMPLE_BLOCKS)
    measured: dict[str, float] = {"blocks": len(store), "corpus_blocks": len(whole)}
    if preset.ict.steps:  # 0: the run has no ICT stage
        measured |= _time_ict(store, warm_start, folder / "ict", preset)
    # A corpus tagged before (elsewhere: a GPU image has no spaCy) lends the sample its spans: its tagging costs ~0.
    tagged = whole if cached_sentences(whole) else None
    if tagged is None:
        tag_salient_spans([], progress=False)  # the tagger's import, outside the timing
    measured["tag_blocks_per_second"] = len(store) / _timed(lambda: build_sentences(store, False, tagged))
    retriever = Retriever.load(str(warm_start / "retriever"), preset.retriever)
    index = folder / "realm" / "index"
    embedding = _timed(
        lambda: build_from_retriever(retriever, store, index, preset.embed, preset.index, 0, time.time())
    )
    measured["embed_blocks_per_second"] = len(store) / embedding
    measured |= _time_pretrain(store, warm_start, folder / "realm", preset)
    measured |= _time_scoring(store, folder / "realm", preset)
    if qa is not None:
        measured |= _time_qa(*qa, warm_start, folder / "qa", preset)
        if preset.reading.total_steps(len(qa[0])):
            measured |= _time_reading(qa[0], qa[2], warm_start, folder / "read", preset)
    for heavy in ("ict", "realm", "qa", "read"):
        for part in ("checkpoints", "retriever", "reader", "index"):
            shutil.rmtree(folder / heavy / part, ignore_errors=True)
    dtype = calibration_settings(preset)["dtype"].removeprefix("torch.")
    return {"costs": asdict(measured_costs(preset, measured, dtype)), "measured": measured}


def _time_ict(store: BlockStore, warm_start: Path, out: Path, preset: Preset) -> dict[str, float]:
    """Seconds an ICT step, and its start."""

    steps = UNTIMED_STEPS + timed_steps()
    ict = dataclasses.replace(preset.ict, steps=steps, warmup_steps=1, checkpoint_every=NEVER, log_every=1)
    called = time.time()
    train_ict(store.folder, out, str(warm_start / "retriever"), dataclasses.replace(preset, ict=ict), progress=False)
    step = step_seconds(out, UNTIMED_STEPS, steps)
    return {"ict_step": step, "ict_startup": startup_seconds(out, called, step)}


def _time_pretrain(store: BlockStore, warm_start: Path, out: Path, preset: Preset) -> dict[str, float]:
    """Seconds a REALM step on the null document (the warm-up) and, with candidates, a retrieval step (over the
    index the caller built in out/index)."""

    retrieval = preset.pretrain.num_candidates > 1
    steps = UNTIMED_STEPS + timed_steps()
    # the holder warm-up reads one block where another document holds the span, which the sample rarely has: its
    # cost is the context warm-up's (one block for every sentence), an upper bound
    reading = "context" if preset.pretrain.reader_warmup == "holder" else preset.pretrain.reader_warmup
    pretrain = dataclasses.replace(
        preset.pretrain,
        reader_warmup=reading,
        steps=2 * steps if retrieval else steps,
        null_warmup_steps=steps if retrieval else 0,
        retriever_frozen_steps=steps if retrieval else 0,
        refresh_every=0,  # a retrieval step without the index builder: its share is costed by the preset's ratio
        warmup_steps=1,
        checkpoint_every=NEVER,
        log_every=1,
    )
    timed = dataclasses.replace(preset, pretrain=pretrain)
    called = time.time()
    train_pretrain(store.folder, out, str(warm_start / "retriever"), str(warm_start / "reader"), timed, progress=False)
    measured = {"null_pretrain_step": step_seconds(out, UNTIMED_STEPS, steps)}
    measured["pretrain_startup"] = startup_seconds(out, called, measured["null_pretrain_step"])
    if retrieval:
        measured["retrieval_pretrain_step"] = step_seconds(out, steps + UNTIMED_STEPS, 2 * steps)
    return measured


def _time_scoring(store: BlockStore, realm_run: Path, preset: Preset) -> dict[str, float]:
    """Seconds a held-out sentence is scored with and without retrieval, each of its salient spans in turn, by the
    model the timed pretraining saved, over its index (none: the sample holds too few held-out sentences)."""

    model, held_out, store, index, finder = held_out_scoring(store.folder, realm_run, preset)
    share = {"held_out_sentences_per_block": len(held_out) / len(store)}  # with a maskable salient span
    if len(held_out) < 4:
        return share
    k, tokens, masks = preset.pretrain.num_candidates, preset.retriever.query_max_tokens, preset.pretrain.max_masks
    sample = held_out.sample(min(SCORED_SAMPLE, len(held_out) - 2))  # after two untimed ones

    def score(sentences: SentenceSet) -> None:
        masked_span_accuracy(model, sentences, store, index, k, tokens, masks, finder=finder, every_span=True)

    score(held_out.sample(2, seed=1))
    return share | {"scored_sentence": _timed(lambda: score(sample)) / len(sample)}


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
    steps = UNTIMED_STEPS + timed_steps()
    picked = np.random.default_rng(0).choice(len(qa_train), size=(steps + 1) * batch)
    train = [qa_train[i] for i in picked]  # one epoch of steps + 1 steps: the last scores the dev sample
    dev = list(qa_dev)[:SAMPLE_QUESTIONS]
    tuned = dataclasses.replace(
        preset,
        qa=dataclasses.replace(preset.qa, steps=None, epochs=1, dev_limit=1, checkpoint_every=NEVER, log_every=1),
    )
    called = time.time()
    best = train_qa(str(warm_start), qa_index, train, dev, out, tuned, progress=False)
    step = step_seconds(out, UNTIMED_STEPS, steps)
    measured = {"qa_step": step, "qa_startup": startup_seconds(out, called, step)}
    # first what dev scoring in fine-tuning reads with, alone; then the evaluation's other systems, sharing its reads;
    # each after an untimed batch (a first search and read allocate, load and select kernels)
    first = preset.qa.retriever
    answerers = load_answerers(str(best), qa_index, tuned, [first, *(s for s in SYSTEMS if s != first)])
    untimed = list(qa_train[: min(8, len(qa_train))])
    for answerer in answerers.values():
        evaluate_qa(answerer, untimed, (1, 5, 20))
    seconds = [
        _timed(lambda answerer=answerer: evaluate_qa(answerer, dev, (1, 5, 20))) for answerer in answerers.values()
    ]
    measured["qa_question"] = seconds[0] / len(dev)
    measured["qa_systems_question"] = sum(seconds) / len(dev)
    index = MipsIndex(qa_index)
    retriever = Retriever.load(str(best / "retriever"), index.retriever_config(preset.retriever))
    searcher = open_searcher(index, "dense", retriever)
    questions = [e.question for e in dev]
    search_all(searcher, questions[:4], 5)
    measured["recall_question"] = _timed(lambda: search_all(searcher, questions, 20)) / len(dev)
    shutil.rmtree(out / BEST)
    return measured


def _time_reading(
    qa_train: Sequence[QAExample], qa_index: Path, warm_start: Path, out: Path, preset: Preset
) -> dict[str, float]:
    """Seconds a reading step, a training question's blocks found (retrieval and labels), and the stage's start, over
    the whole corpus's index (recipes/reading.py)."""
    batch = preset.reading.batch_size
    steps = UNTIMED_STEPS + timed_steps()
    picked = np.random.default_rng(1).choice(len(qa_train), size=min(len(qa_train), 4 * batch), replace=False)
    train = [qa_train[i] for i in picked]
    reading = dataclasses.replace(preset.reading, steps=steps, checkpoint_every=NEVER, log_every=1)
    called = time.time()
    train_reading(str(warm_start), qa_index, train, out, dataclasses.replace(preset, reading=reading), progress=False)
    step = step_seconds(out, UNTIMED_STEPS, steps)
    finding = reading_summary(out)["found"]["seconds"]
    return {
        "read_step": step,
        "read_question": finding / len(train),
        "read_startup": max(0.0, startup_seconds(out, called, step) - finding),
    }


def measured_costs(preset: Preset, measured: dict[str, float], dtype: str) -> StageCosts:
    """The preset's StageCosts with what was measured put in. A pretraining step of a kind not measured (the query
    tower alone, or both towers beside the index builder) keeps its ratio to the measured kind in the preset."""
    base = preset.costs
    measured_kind = "query_tower_pretrain_step" if preset.pretrain.doc_tower == "fixed" else "frozen_pretrain_step"
    retrieval_step = measured.get("retrieval_pretrain_step", getattr(base, measured_kind))
    ratio = retrieval_step / getattr(base, measured_kind)
    kinds = ("pretrain_step", "frozen_pretrain_step", "query_tower_pretrain_step")
    return dataclasses.replace(
        base,
        source=f"the costs measured on this machine in {dtype}",
        fixed_seconds=FINAL_SECONDS,
        **{kind: getattr(base, kind) * ratio for kind in kinds},
        **{k: v for k, v in measured.items() if k in {f.name for f in dataclasses.fields(StageCosts)}},
    )
