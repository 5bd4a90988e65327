"""The work of the pipeline's stages, as plain functions of their inputs (the stage engine decides when each runs):
the corpus, an index, QA fine-tuning, then what is measured: exact match and recall of the QA systems,
zero-shot recall of each retriever, worked examples (the paper's Table 3) and masked-span accuracy."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from realm.common.deadline import Deadline, TimeLimit
from realm.common.device import default_device
from realm.common.io import write_dir_atomic, write_json_atomic
from realm.common.tokenization import load_tokenizer, resolve_tokenizer_dir
from realm.config import Preset
from realm.data.blocks import BlockStore, build_corpus
from realm.data.qa_examples import QAExample, tuning_split
from realm.data.recoverable import SpanFinder
from realm.data.sentences import SentenceSet, sentences_path
from realm.eval.answerer import Answerer, load_answerer, load_answerers
from realm.eval.intervals import bootstrap_interval
from realm.eval.mlm import MaskedLMScore, masked_span_accuracy, worked_examples
from realm.eval.qa import (
    AnsweredQuestion,
    PairedScore,
    answer_questions,
    compare_predictions,
    evaluate_qa,
    summarise,
    write_predictions,
)
from realm.eval.retrieval import answer_in_corpus, first_answer_ranks, paired_recall, recall_from_ranks
from realm.index.build import build_from_retriever
from realm.index.mips import MipsIndex
from realm.index.search import open_searcher, search_all
from realm.models.mlm_reader import Reader
from realm.models.realm import RealmModel
from realm.models.retriever import Retriever
from realm.pipeline.records import (
    SYSTEMS,
    Coverage,
    DevQuestions,
    EvalRecord,
    ExamplesRecord,
    Outcomes,
    QAStart,
    RealmVsStart,
)
from realm.pipeline.stages import last_metrics
from realm.recipes.finetune_qa import ANSWER_INDEX_MAX_BLOCKS, train_qa
from realm.recipes.model_card import write_model_card
from realm.training.schedule import TimedSteps, read_steps

RECALL_KS = (1, 5, 20)
EXAMPLE_POOL = 100  # held-out sentences searched for the worked examples
# held-out sentences with a salient span are scored (a seeded sample of them where the plan sizes one), each of its
# spans in turn (~2.8 a sentence): the gain's interval over 984 sentences is +-0.25 points against +-0.45 with one
# span each (docs/log/2026-11-26-results-retrieval-steps-on-a-gpu-how-far-more-of-them-go-fourth-part.md)
SCORING: dict[str, Any] = {"every_span": True, "sample_seed": 0}
DEV_SAMPLE_SEED = 0
EVAL_CHUNK = 64  # dev questions every system answers before the clock is read again


def dev_order(questions: Sequence[QAExample]) -> list[QAExample]:
    """The dev questions in the order evaluation answers them: shuffled with DEV_SAMPLE_SEED, the same on every run of
    the same file, so that the first n of them, however many the clock lets it answer, are a seeded sample."""
    return [questions[i] for i in _dev_rows(len(questions))]


def dev_sample(questions: Sequence[QAExample], size: int | None) -> list[QAExample]:
    """`size` of the dev questions (None, or as many as there are: all): the first of `dev_order`, in file order."""
    if size is None or size >= len(questions):
        return list(questions)
    return [questions[i] for i in sorted(_dev_rows(len(questions))[:size])]


def _dev_rows(count: int) -> list[int]:
    return np.random.default_rng(DEV_SAMPLE_SEED).permutation(count).tolist()


def build_corpus_folder(
    inputs: Sequence[str], folder: Path, tokenizer_spec: str, preset: Preset, progress: bool
) -> dict:

    tokenizer = load_tokenizer(resolve_tokenizer_dir(tokenizer_spec))
    meta = build_corpus(list(inputs), folder, tokenizer, preset.corpus, progress=progress)
    return {
        "blocks": meta.num_blocks,
        "documents": meta.num_documents,
        "skipped": meta.skipped_records,
        "fingerprint": meta.fingerprint,
    }


def run_indexes(run_dir: Path) -> list[Path]:
    """The index folders of a run's stages: a build whose document tower built one of them copies its embeddings
    (with a fixed document tower, the ICT, REALM and most ablation indexes are one embedding)."""
    return sorted(run_dir.glob("*/index"))


def build_index_folder(retriever_folder: Path, run_dir: Path, index_dir: Path, preset: Preset, progress: bool) -> dict:
    """An index of the retriever's document tower over the run's corpus, copied from one of the run's indexes where
    the same document tower built it."""

    retriever = Retriever.load(str(retriever_folder), preset.retriever)
    store = BlockStore(run_dir / "corpus")
    meta = build_from_retriever(
        retriever, store, index_dir, preset.embed, preset.index, 0, time.time(), progress, reuse=run_indexes(run_dir)
    )
    reused = meta.reused_from and os.path.relpath(meta.reused_from, run_dir.resolve())  # records hold no machine paths
    return {"vectors": meta.num_vectors, "embed_seconds": meta.embed_seconds, "reused_from": reused}


def finetune(
    model_folder: Path,
    index_folder: Path,
    reader: Path | None,
    train: Sequence[QAExample],
    held_out: Sequence[QAExample],
    preset: Preset,
    folder: Path,
    resume: bool,
    progress: bool,
    evaluated: Sequence[QAExample] | None,
    timed: TimedSteps | None = None,
) -> dict:
    """Fine-tune on `train`, keeping the checkpoint with the best EM on the `held_out` training questions (after
    each epoch) and the better query tower on them (keep_query_tower); score the best model on `evaluated` (the
    dev questions a run reports; None: not here). The reported questions choose nothing."""

    best = train_qa(
        str(model_folder),
        index_folder,
        train,
        held_out,
        folder,
        preset,
        resume=resume,
        progress=progress,
        reader_spec=str(reader) if reader else None,
        timed=timed,
    )
    result = {"held_out": json.loads((best / "dev.json").read_text()), "train": last_metrics(folder)}
    result["steps_trained"] = read_steps(folder)
    result["query_tower"] = keep_query_tower(best, model_folder / "retriever", index_folder, held_out, preset)
    if evaluated is not None:
        answerer = load_answerer(str(best), index_folder, preset)
        result["dense"] = evaluate_qa(answerer, evaluated, RECALL_KS, folder / "predictions_dense.jsonl")
    return result


QUERY_TOWER_CHOICE = "query_tower.json"  # in the fine-tuned model's folder: which query tower it kept, and why


def keep_query_tower(
    best: Path, start: Path, index_folder: Path, held_out: Sequence[QAExample], preset: Preset
) -> dict:
    """Never hand back a worse retriever silently: zero-shot recall@5 of the fine-tuned query tower in `best` and
    of its `start` on training questions fine-tuning held out; the fine-tuned tower stays only when it is higher,
    otherwise the start's retriever goes back into `best` (a tie keeps the tower whose recall is known from
    before). The choice is written into `best` before the swap, so a run killed between the two redoes the swap."""
    record = best / QUERY_TOWER_CHOICE
    if record.is_file():
        choice = json.loads(record.read_text())
    else:
        recall = {
            label: zero_shot_recall(index_folder, retriever, held_out, (5,), preset)["recall@5"]
            for label, retriever in (("start", start), ("fine-tuned", best / "retriever"))
        }
        kept = "fine-tuned" if recall["fine-tuned"] > recall["start"] else "start"
        choice = {"kept": kept, "recall@5": recall, "questions": len(held_out)}
        write_json_atomic(record, choice)
    if choice["kept"] == "start":
        write_dir_atomic(best / "retriever", lambda tmp: shutil.copytree(start, tmp, dirs_exist_ok=True))
    return choice


SELECTION_QUESTIONS = 500  # of the tuning split's training questions, those that choose retrievers (never dev ones)
SELECTION_SEED = 0


def split_training_questions(questions: Sequence[QAExample]) -> tuple[list[QAExample], list[QAExample]]:
    """(what QA fine-tunes on, what chooses the retriever fine-tuning starts from and the query tower it ends
    with): the tuning split's articles are held out of fine-tuning (`tuning_split`), and a seeded sample of at
    most SELECTION_QUESTIONS of their questions, in file order, makes the choices."""
    train, tuning = tuning_split(questions)
    if len(tuning) > SELECTION_QUESTIONS:
        rows = np.random.default_rng(SELECTION_SEED).choice(len(tuning), size=SELECTION_QUESTIONS, replace=False)
        tuning = [tuning[i] for i in sorted(rows.tolist())]
    return train, tuning


def zero_shot_ranks(
    index_dir: Path, retriever_folder: Path, examples: Sequence[QAExample], depth: int, preset: Preset
) -> list[int | None]:
    """Per question, the rank of the first answer-bearing block in a retriever's top `depth` over the index its
    document tower built (None: none there)."""

    index = MipsIndex(index_dir)
    retriever = Retriever.load(str(retriever_folder), index.retriever_config(preset.retriever))
    hits = search_all(open_searcher(index, "dense", retriever), [e.question for e in examples], depth)
    return first_answer_ranks(examples, hits)


def zero_shot_recall(
    index_dir: Path, retriever_folder: Path, examples: Sequence[QAExample], ks: Sequence[int], preset: Preset
) -> dict[str, float]:
    """recall@k (percent, rounded to 0.01) of a retriever over the index its document tower built."""
    ranks = zero_shot_ranks(index_dir, retriever_folder, examples, max(ks), preset)
    return {k: round(v, 2) for k, v in recall_from_ranks(ranks, ks).items()}


def realm_against_its_start(ranks: dict[str, list[int | None]]) -> RealmVsStart | None:
    """Zero-shot recall of REALM's retriever minus its start's (the retriever before it in stage order: ICT's, or
    the off-the-shelf one), paired over the same dev questions; None when the run has no REALM row."""
    labels = list(ranks)
    if "REALM" not in labels or labels.index("REALM") == 0:
        return None
    start = labels[labels.index("REALM") - 1]
    return RealmVsStart.from_dict({"start": start, **paired_recall(ranks["REALM"], ranks[start], RECALL_KS[1:])})


def answer_coverage(corpus: Path, dev: Sequence[QAExample]) -> Coverage | None:
    """The share of the dev questions whose answer some block of the corpus holds, with its interval; None above
    the answer index's size (recipes/finetune_qa.py: ANSWER_INDEX_MAX_BLOCKS)."""
    store = BlockStore(corpus)
    if len(store) > ANSWER_INDEX_MAX_BLOCKS:
        return None
    found = [100.0 * hit for hit in answer_in_corpus(store.column("body"), dev)]
    low, high = bootstrap_interval(found)
    return Coverage(round(sum(found) / len(found), 2), (round(low, 2), round(high, 2)), len(found))


def choose_qa_start(
    retrievers: dict[str, tuple[Path, Path]],
    questions: Sequence[QAExample],
    preset: Preset,
    reader: str,
    fixed: str | None = None,
) -> dict:
    """The retriever QA fine-tunes from: the highest zero-shot recall@5 of `retrievers` (label -> (its index
    folder, the retriever folder), in stage order; a tie goes to the later stage) on the training `questions`
    fine-tuning holds out (split_training_questions); the dev questions stay for the report. `fixed`: that label
    whatever the recall (still measured). `reader`: the label of the reader start, recorded beside it."""
    recall = {
        label: zero_shot_recall(*folders, questions, (5,), preset)["recall@5"] for label, folders in retrievers.items()
    }
    best = fixed or max(reversed(list(recall)), key=recall.__getitem__)  # reversed: a tie goes to the later stage
    articles = len({e.article for e in questions}) if all(e.article for e in questions) else None
    return QAStart(best, reader, fixed is not None, recall, len(questions), articles).to_dict()


def evaluate_systems(
    best: Path,
    corpus: Path,
    index_folder: Path,
    zero_shot: dict[str, tuple[Path, Path]],
    dev: Sequence[QAExample],
    evaluated: Sequence[QAExample],
    preset: Preset,
    folder: Path,
    deadline: Deadline | None = None,
    least: int = 0,
) -> dict:
    """EM, recall@k and outcomes of the fine-tuned model `best` with each retriever (dense over `index_folder`,
    BM25, hybrid) on the dev questions `evaluated` (`dev`'s own examples), answered in their order until `deadline`
    (None: all of them; at least `least` whatever the clock), the paired EM differences between them;
    recall@k of each zero-shot retriever (label -> (its index folder, the retriever folder)) on all of `dev`,
    REALM's paired against its start's, and the share of `dev` whose answer the `corpus` holds. What does not
    depend on the sample comes first, so that the clock sizes the sample last."""

    ranks = {
        label: zero_shot_ranks(index_dir, retriever_folder, dev, max(RECALL_KS), preset)
        for label, (index_dir, retriever_folder) in zero_shot.items()
    }
    write_json_atomic(folder / "zero_shot_ranks.json", ranks)  # per dev question, in file order
    coverage = answer_coverage(corpus, dev)
    answerers = load_answerers(str(best), index_folder, preset, SYSTEMS)
    limit = deadline.limit(least) if deadline is not None else None  # its pace timed from here
    answered, seconds = answer_until(answerers, evaluated, limit)
    questions = DevQuestions(
        len(answered["dense"]),
        len(dev),
        DEV_SAMPLE_SEED,
        len(evaluated) if limit is not None else None,
        limit.to_dict() if limit is not None else None,
    )
    position = {id(e): i for i, e in enumerate(dev)}
    # in dev file order: the same questions as dev_sample of that many
    systems = scored_in_file_order(answered, answerers, seconds, position, lambda kind: f"predictions_{kind}", folder)
    paired = {
        f"{a} - {b}": PairedScore.from_dict(
            compare_predictions(folder / f"predictions_{a}.jsonl", folder / f"predictions_{b}.jsonl")
        )
        for a, b in (("dense", "bm25"), ("hybrid", "bm25"), ("hybrid", "dense"))
    }
    recall = {
        label: {k: round(v, 2) for k, v in zip(RECALL_KS, recall_from_ranks(first, RECALL_KS).values(), strict=True)}
        for label, first in ranks.items()
    }
    record = EvalRecord(
        systems,
        questions,
        compact_outcomes(answered, position),
        paired,
        recall,
        realm_against_its_start(ranks),
        coverage,
    )
    write_model_card(best, best.parent, qa_figures(record))
    return record.to_dict()


def compact_outcomes(answered: dict[str, list[AnsweredQuestion]], position: dict[int, int]) -> Outcomes:
    """Which dev questions were answered (their rows in the dev file) and, per system, whether each was an exact
    match ("1") or not ("0"), in the same order: what `realm results --check` pairs two runs on."""
    first = next(iter(answered.values()))
    rows = [position[id(a.example)] for a in first]
    marks = {}
    for kind, answers in answered.items():
        assert [position[id(a.example)] for a in answers] == rows  # every system the same questions
        marks[kind] = "".join("1" if a.outcome == "exact_match" else "0" for a in answers)
    return Outcomes(rows, marks)


def answer_until(
    answerers: dict[str, Answerer], questions: Sequence[QAExample], limit: TimeLimit | None
) -> tuple[dict[str, list[AnsweredQuestion]], dict[str, float]]:
    """`questions` answered by each system (kind -> answerer), in their order, EVAL_CHUNK at a time (every system
    answers a chunk before the next: a block two systems retrieve is read once, and each system answers the same
    questions), until `limit` fits no more (None: all); with the seconds each system took."""
    answered: dict[str, list[AnsweredQuestion]] = {kind: [] for kind in answerers}
    seconds = dict.fromkeys(answerers, 0.0)
    done = 0
    while done < len(questions):
        more = min(EVAL_CHUNK, len(questions) - done)
        if limit is not None and not (more := limit.fits(done, more)):
            break
        for kind, answerer in answerers.items():
            started = time.monotonic()
            answered[kind] += answer_questions(answerer, questions[done : done + more], max(RECALL_KS))
            seconds[kind] += time.monotonic() - started
        done += more
    return answered, seconds


def scored_in_file_order(
    answered: dict, answerers: dict, seconds: dict, position: dict, file_name: Callable, folder: Path
):
    """Each system's answers (`answer_until`) sorted into dev file order (`position`: a question's row), written to
    `folder`/<file_name(system)>.jsonl, and summarised (ORQA's exact match): system -> QAScore."""
    for name, answers in answered.items():
        answers.sort(key=lambda a: position[id(a.example)])
        write_predictions(folder / f"{file_name(name)}.jsonl", answers)
    return {n: summarise(a, RECALL_KS, answerers[n].k, "orqa", seconds[n]) for n, a in answered.items()}


def arms_exact_match(
    fine_tuned: dict[str, tuple[Path, Path]],
    dev: Sequence[QAExample],
    offered: Sequence[QAExample],
    preset: Preset,
    folder: Path,
    deadline: Deadline | None = None,
    least: int = 0,
) -> dict:
    """The ablation arms' dense exact match, the run's last stage: each fine-tuned system (its QA stage -> (its best
    model, the index it retrieves from)) answers the dev questions `offered` (`dev`'s own examples: those the main
    evaluation answered, in its order) in lockstep until `deadline` (None: all; at least `least`), so that every arm
    answers the same questions and a run that fell behind answers fewer of them rather than overrun its budget.
    Each arm's predictions go to `folder`/<stage>.jsonl, in dev file order."""
    answerers = {stage: load_answerer(str(best), index, preset) for stage, (best, index) in fine_tuned.items()}
    limit = deadline.limit(least) if deadline is not None else None  # its pace timed from here
    answered, seconds = answer_until(answerers, offered, limit)
    position = {id(e): i for i, e in enumerate(dev)}
    scored = scored_in_file_order(answered, answerers, seconds, position, lambda stage: stage, folder)
    dense = {stage: score.to_dict() for stage, score in scored.items()}
    until = limit.to_dict() if limit is not None else None
    questions = DevQuestions(len(next(iter(answered.values()))), len(dev), DEV_SAMPLE_SEED, len(offered), until)
    return {"questions": questions.to_dict(), "dense": dense}


def qa_figures(evaluation: EvalRecord) -> dict[str, str]:
    """The fine-tuned model's figures for its card: EM with its interval and recall@5, with each retriever."""
    figures = {}
    for kind in SYSTEMS:
        score = evaluation.systems[kind]
        low, high = score.interval or (float("nan"), float("nan"))
        figures[f"exact match, {kind} retrieval, top {score.reader_top_k} read"] = (
            f"{score.exact_match:.2f} [{low:.2f}, {high:.2f}] ({score.questions} dev questions, 95% interval)"
        )
        figures[f"recall@5, {kind} retrieval"] = f"{score.recall[5]:.2f}"
    return figures


def held_out_scoring(corpus: Path, realm_run: Path, preset: Preset) -> tuple:
    """What scoring a `train pretrain` output on held-out sentences of `corpus` reads: (model on its device,
    the held-out sentences with a maskable salient span, the corpus, the run's index, the span lookup)."""

    store = BlockStore(corpus)
    model = RealmModel(
        Retriever.load(str(realm_run / "retriever"), preset.retriever), Reader.load(str(realm_run / "reader"))
    ).to(default_device())
    tokens, masks = preset.retriever.query_max_tokens, preset.pretrain.max_masks
    held_out = SentenceSet(sentences_path(store), preset.pretrain.held_out_fraction, part="test")  # never tuned on
    held_out = held_out.with_salient_spans(model.retriever.tokenizer, tokens, masks)  # what can be masked
    return model, held_out, store, MipsIndex(realm_run / "index"), SpanFinder(store, model.retriever.tokenizer)


def score_held_out(
    model: RealmModel,
    held_out: SentenceSet,
    store: BlockStore,
    index: MipsIndex,
    finder: SpanFinder,
    preset: Preset,
    sentences: int,
    until: TimeLimit | None = None,
) -> MaskedLMScore:
    """Masked-span accuracy with retrieval and with the null document alone (candidate 0 of the same pass) on the
    first `sentences` held-out sentences in SCORING's seeded order (until `until` fits no more), with each
    sentence's gain kept, rounded, for a rerun or an ablation arm to pair with."""
    k, tokens, masks = preset.pretrain.num_candidates, preset.retriever.query_max_tokens, preset.pretrain.max_masks
    scored = masked_span_accuracy(  # its JSON form: MaskedLMScore's
        model,
        held_out.shuffled(SCORING["sample_seed"]),
        store,
        index,
        k,
        tokens,
        masks,
        limit=sentences,
        finder=finder,
        every_span=SCORING["every_span"],
        until=until,
    )
    return MaskedLMScore.from_dict(scored | {"per_sentence_gain": [round(g, 4) for g in scored["per_sentence_gain"]]})


def arm_measures(
    corpus: Path,
    realm_run: Path,
    index_dir: Path,
    dev: Sequence[QAExample],
    preset: Preset,
    sentences: int,
    folder: Path,
) -> dict:
    """An ablation arm's Table 2 columns, each to be paired with the main run's: its retriever's zero-shot ranks on
    every dev question over the index its document tower built (`index_dir`; written to `folder`), and its
    masked-LM gain on the first `sentences` held-out sentences in the order the main run scored them."""
    ranks = zero_shot_ranks(index_dir, realm_run / "retriever", dev, max(RECALL_KS), preset)
    write_json_atomic(folder / "zero_shot_ranks.json", {"REALM": ranks})  # per dev question, in file order
    model, held_out, store, index, finder = held_out_scoring(corpus, realm_run, preset)
    scored = score_held_out(model, held_out, store, index, finder, preset, sentences)
    recall = {key: round(value, 2) for key, value in recall_from_ranks(ranks, RECALL_KS).items()}
    return {"zero_shot": recall, "with_retrieval": scored.to_dict(), "scored_sentences": scored.sentences}


def pretraining_examples(
    corpus: Path, realm_run: Path, preset: Preset, sentences: int, deadline: Deadline | None = None, least: int = 0
) -> dict:
    """Worked examples and masked-span accuracy of a `train pretrain` output on held-out sentences of `corpus`:
    at most `sentences` of them, in an order drawn with SCORING's seed, until `deadline` (None: all `sentences`;
    at least `least` whatever the clock)."""

    model, held_out, store, index, finder = held_out_scoring(corpus, realm_run, preset)
    if not len(held_out):
        raise ValueError(
            f"{corpus}: no held-out test sentence has a salient span to mask ({held_out.tagged} in the test half of "
            f"the {preset.pretrain.held_out_fraction:.0%} of documents held out): hold out more (held_out_fraction)"
        )
    k, tokens, masks = preset.pretrain.num_candidates, preset.retriever.query_max_tokens, preset.pretrain.max_masks
    examples = worked_examples(model, held_out, store, index, k, tokens, masks, pool=EXAMPLE_POOL, finder=finder)
    limit = deadline.limit(least) if deadline is not None else None  # its pace timed from here
    scored = score_held_out(model, held_out, store, index, finder, preset, sentences, limit)
    write_model_card(realm_run, realm_run, pretraining_figures(scored, k))
    # held_out: with a maskable salient span; "test": the half of the held-out documents scored (data/sentences.py)
    return ExamplesRecord(
        scored, scored.sentences, len(held_out), held_out.tagged, "test", EXAMPLE_POOL, examples
    ).to_dict()


def pretraining_figures(scored: MaskedLMScore, num_candidates: int) -> dict[str, str]:
    """The REALM model's figures for its card: held-out masked-token accuracy with and without retrieval."""
    low, high = scored.interval
    where = f"{scored.spans} salient spans of {scored.sentences} held-out sentences"
    return {
        "masked-token accuracy, null document only": f"{scored.null_token_accuracy:.2f} ({where})",
        f"masked-token accuracy, null document and {num_candidates - 1} retrieved blocks": f"{scored.token_accuracy:.2f}",
        "retrieval gain, paired": f"{scored.retrieval_gain:+.2f} points [{low:+.2f}, {high:+.2f}] (95% interval)",
    }
