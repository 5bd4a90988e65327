"""The reading stage: the span reader trained on answer-bearing blocks before ORQA's fine-tuning (a cpu preset
setting; ORQA and REALM fine-tune from the warm start directly).

ORQA's fine-tuning reads the top k = 5 retrieved blocks of every question whether or not a block holds its answer;
on a CPU budget that buys less than one pass over the training questions. A reading step reads, for each question,
one block that holds its answer and `negatives` retrieved blocks that do not, all with the reader ORQA uses:

    log p(s | x) = log_softmax over every span s of the question's blocks of S(s)   # ORQA's joint softmax, f(x, z) = 0
    loss         = -log sum over the answer spans s of p(s | x)

so the same minutes buy several passes, and the negatives teach the one softmax ORQA's answer-time ranking uses to
put a block without the answer below one with it. The block holding the answer:

- the gold paragraph, where the QA file gives it with the answer's character offset (SQuAD's `context` and
  `answer_start`): a block-sized window of it around the answer, the title's wordpieces left out of the budget as a
  block of that article would; the spans labelled are those at the answer's offsets (exact positions, not strings);
- elsewhere (NQ, WebQuestions, CuratedTrec, a user's file) the best-ranked block the fixed retriever returns among
  its top `depth` that holds an answer, found once before training (DPR's positive), its spans labelled by matching
  the answer text.

The negatives are the best-ranked of those `depth` blocks that hold no answer. A question none of whose retrieved
blocks holds an answer, or whose answer no span of at most `max_span_width` wordpieces reads, is skipped and counted
(reading.json), as is an offset that does not match its context (that answer then found by its text).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from realm.common.device import autocast, default_device
from realm.common.io import write_atomic, write_json_atomic
from realm.config import Preset, ReadingConfig, record_run_config
from realm.data.blocks import BlockStore
from realm.data.qa_examples import AnswerBlocks, QAExample, has_answer
from realm.index.mips import MipsIndex
from realm.index.search import BM25Searcher, hybrid_top
from realm.models.orqa import QAModel, joint_log_probs, marginal_answer_log_likelihood
from realm.models.span_reader import BlockSpans, ReaderBatch, block_spans, matching_spans
from realm.recipes.finetune_qa import ANSWER_INDEX_MAX_BLOCKS, qa_model_over
from realm.training.checkpoints import resume_training, save_checkpoint
from realm.training.data import DataOrder, DataPosition, Prefetched, prefetch_depth
from realm.training.distributed import Dist, setup_distributed
from realm.training.metrics import MetricsLog
from realm.training.optim import bert_optimizer, optimizer_step
from realm.training.schedule import LinearSchedule, TimedSchedule, TimedSteps, linear_schedule, record_steps

log = logging.getLogger(__name__)

EVIDENCE = "evidence.jsonl"  # the blocks each question reads, found once (a resumed stage reads them back)
SUMMARY = "reading.json"  # what was found and skipped, and what it cost
SEARCH_BATCH = 256
LISTED_LINES = 20  # the lines of a QA file named in the summary, for each kind of problem


@dataclass(frozen=True)
class ReadingExample:
    """A training question with the blocks it reads: the answer-bearing one first, then the negatives."""

    question: str
    bodies: tuple[str, ...]  # (1 + negatives,) block bodies
    answer_chars: tuple[tuple[int, int], ...]  # the answer's (start, end) in bodies[0]; empty: match the text
    source: str  # "context" (the gold paragraph) or "retrieval"
    example_index: int  # in the training questions (for its answers when matching text)


# -- labels ---------------------------------------------------------------------------------------
def offset_labels(spans: BlockSpans, answer_chars: Sequence[tuple[int, int]]) -> list[bool]:
    """The candidate spans (whole words, at most the reader's width) that begin and end exactly at an answer's
    character offsets. An answer cut by the block's end, or whose ends fall inside a word, labels none."""
    starts = {begin: i for i, (begin, _) in enumerate(spans.char_offsets)}
    ends = {end: i for i, (_, end) in enumerate(spans.char_offsets)}
    wanted = {(starts[s], ends[e]) for s, e in answer_chars if s in starts and e in ends}
    return [span in wanted for span in spans.spans]


def context_window(
    tokenizer: PreTrainedTokenizerBase, context: str, answer: tuple[int, int], budget: int, rng: np.random.Generator
) -> tuple[int, int]:
    """(start, end) characters of a window of at most `budget` wordpieces of `context` that holds `answer` (whole
    words, starting after whitespace), placed at random around it; the whole context where it fits."""
    encoding = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    offsets, words = encoding["offset_mapping"], encoding.word_ids()
    if len(offsets) <= budget:
        return 0, len(context)
    first = next((i for i, (_, e) in enumerate(offsets) if e > answer[0]), len(offsets) - 1)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < answer[1]), first)
    word_starts = [  # after whitespace: a window does not begin at a word's punctuation
        i for i in range(len(offsets)) if i == 0 or (words[i] != words[i - 1] and context[offsets[i][0] - 1].isspace())
    ]
    fitting = [i for i in word_starts if i <= first and i + budget > last and i + budget <= len(offsets)]
    if not fitting:  # an answer longer than the window, or one at the end: the window that ends the context
        fitting = [max(i for i in word_starts if i <= max(0, min(first, len(offsets) - budget)))]
    begin = fitting[int(rng.integers(len(fitting)))]
    stop = begin + budget
    while stop < len(offsets) and stop > begin + 1 and words[stop] == words[stop - 1]:
        stop -= 1  # a window ends at a word's end: a cut word would be a span the block does not have
    return offsets[begin][0], offsets[stop - 1][1]


# -- finding the blocks ---------------------------------------------------------------------------
@dataclass
class Found:
    """What finding the blocks came to, for reading.json."""

    questions: int = 0
    from_context: int = 0
    from_retrieval: int = 0
    no_answer_block: int = 0  # none of the top `depth` retrieved blocks holds an answer: skipped
    no_answer_span: int = 0  # the block holds the answer, but no candidate span reads as it: skipped
    offsets_not_matching: int = 0  # answers whose answer_start does not match the context (found by text)
    offsets_inside_words: int = 0  # an offset inside a word or cut by the window: the example labelled by text
    short_of_negatives: int = 0  # fewer blocks without the answer than `negatives` among the top `depth`
    lines: dict[str, list[str]] = field(default_factory=dict)  # the QA file's lines of each problem (the first)
    seconds: float = 0.0  # finding the blocks, less indexing the corpus's answer tokens (a cost of the corpus)
    indexing_seconds: float = 0.0

    def note(self, kind: str, example: QAExample) -> None:
        """Count a problem of `kind` (a field), naming the question's file and line."""
        setattr(self, kind, getattr(self, kind) + 1)
        listed = self.lines.setdefault(kind, [])
        if example.where and len(listed) < LISTED_LINES:
            listed.append(example.where)


def retrieved_blocks(
    model: QAModel, questions: list[str], index: MipsIndex, sparse: BM25Searcher | None, depth: int
) -> np.ndarray:
    """Block ids (Q, depth), best first: what the reader's retrieval returns (hybrid: its pool ranked) with the
    model's fixed query tower."""
    rows = []
    for start in range(0, len(questions), SEARCH_BATCH):
        part = questions[start : start + SEARCH_BATCH]
        vectors = model.retriever.embed_queries(part).numpy()
        if sparse is None:
            rows.append(index.search(vectors, depth)[1])
        else:
            rows.append(hybrid_top(index, sparse, part, vectors, model.fusion_weight, depth)[1])
    return np.concatenate(rows) if rows else np.zeros((0, depth), dtype=np.int64)


def find_evidence(
    model: QAModel,
    train: Sequence[QAExample],
    index: MipsIndex,
    store: BlockStore,
    sparse: BM25Searcher | None,
    cfg: ReadingConfig,
) -> tuple[list[ReadingExample], Found]:
    """The blocks each training question reads (module doc), and the count of what was found and skipped."""
    indexing = time.perf_counter()
    bodies = store.column("body")
    answers = AnswerBlocks(bodies) if len(store) <= ANSWER_INDEX_MAX_BLOCKS else None
    began = time.perf_counter()
    found = Found(questions=len(train), indexing_seconds=began - indexing)
    ids = retrieved_blocks(model, [e.question for e in train], index, sparse, cfg.depth)
    tokenizer, width = model.reader.tokenizer, model.reader.max_span_width
    max_tokens = store.config.max_block_tokens
    examples = []
    for i, example in enumerate(train):
        row = [int(b) for b in ids[i] if b >= 0]
        holding = answers.holding(example) if answers is not None else None
        holds = [bool(np.isin(b, holding)) if holding is not None else has_answer(bodies[b], example) for b in row]
        negatives = [bodies[b] for b, h in zip(row, holds) if not h][: cfg.negatives]
        if len(negatives) < cfg.negatives:
            found.short_of_negatives += 1
            negatives += [""] * (cfg.negatives - len(negatives))  # a row with no spans: nothing to read
        if example.answer_starts is not None and None in example.answer_starts:
            found.note("offsets_not_matching", example)
        positive = _gold_window(example, i, tokenizer, max_tokens, width, cfg.seed, found)
        source = "context"
        if positive is None:
            source = "retrieval"
            body = next((bodies[b] for b, h in zip(row, holds) if h), None)
            if body is None:
                found.note("no_answer_block", example)
                continue
            spans = block_spans(tokenizer, body, max_tokens, width)
            if not any(matching_spans(body, spans, example, True)):
                found.note("no_answer_span", example)
                continue
            positive = (body, ())
        body, chars = positive
        examples.append(ReadingExample(example.question, (body, *negatives), chars, source, i))
        setattr(found, f"from_{source}", getattr(found, f"from_{source}") + 1)
    found.seconds = time.perf_counter() - began
    return examples, found


def _gold_window(
    example: QAExample,
    index: int,
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    width: int,
    seed: int,
    found: Found,
) -> tuple[str, tuple[tuple[int, int], ...]] | None:
    """The gold paragraph's block-sized window around the answer and the answer's offsets in it, where the example
    has a context and a matching offset and a candidate span is labelled (by its offsets, else by its text)."""
    chars = example.answer_chars
    if example.context is None or not chars:
        return None
    title = len(tokenizer(example.article or "", add_special_tokens=False)["input_ids"]) if example.article else 0
    budget = max(8, max_tokens - 3 - title)  # what a block of this article leaves its body (data/blocks.py)
    rng = np.random.default_rng([seed, index])
    begin, end = context_window(tokenizer, example.context, chars[0], budget, rng)
    body = example.context[begin:end]
    inside = tuple((s - begin, e - begin) for s, e in chars if s >= begin and e <= end)
    spans = block_spans(tokenizer, body, max_tokens, width)
    if inside and any(offset_labels(spans, inside)):
        return body, inside
    found.note("offsets_inside_words", example)
    if any(matching_spans(body, spans, example, True)):
        return body, ()
    return None


def write_evidence(path: Path, examples: Sequence[ReadingExample]) -> None:
    lines = "".join(json.dumps(asdict(e), ensure_ascii=False) + "\n" for e in examples)
    write_atomic(path, lambda tmp: tmp.write_text(lines, encoding="utf-8"))


def read_evidence(path: Path) -> list[ReadingExample]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [
        ReadingExample(
            r["question"],
            tuple(r["bodies"]),
            tuple((int(s), int(e)) for s, e in r["answer_chars"]),
            r["source"],
            r["example_index"],
        )
        for r in rows
    ]


# -- batches --------------------------------------------------------------------------------------
@dataclass
class ReadingBatch:
    reader: ReaderBatch  # B * R rows: each question's answer-bearing block, then its negatives
    span_match: torch.Tensor  # (B * R, S) bool: the answer's spans (in the first block of each question only)
    blocks_per_question: int

    def to(self, device: torch.device) -> ReadingBatch:
        return ReadingBatch(self.reader.to(device), self.span_match.to(device), self.blocks_per_question)


def reading_batch(
    model: QAModel, examples: Sequence[ReadingExample], train: Sequence[QAExample], max_block_tokens: int
) -> ReadingBatch:
    """The reader's inputs for a batch of questions and their blocks, with the answer spans labelled."""
    reader, blocks = model.reader_inputs([e.question for e in examples], [e.bodies for e in examples], max_block_tokens)
    match = torch.zeros_like(reader.span_valid)
    per_question = len(examples[0].bodies)
    for q, (example, spans) in enumerate(zip(examples, blocks)):
        body = example.bodies[0]
        if example.answer_chars:
            labels = offset_labels(spans[0], example.answer_chars)
        else:
            labels = matching_spans(body, spans[0], train[example.example_index], True)
        match[q * per_question, : len(labels)] = torch.tensor(labels, dtype=torch.bool)
    return ReadingBatch(reader, match, per_question)


def reading_loss(
    span_scores: torch.Tensor, span_valid: torch.Tensor, span_match: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """span_scores, span_valid, span_match (B, R, S) -> the mean of -log sum over answer spans of the softmax over
    every span of the question's blocks (ORQA's joint softmax with f(x, z) = 0), and the share the argmax answers."""
    log_joint = joint_log_probs(span_scores.new_zeros(span_scores.shape[:2]), span_scores, span_valid)  # (B, R, S)
    loss = -marginal_answer_log_likelihood(log_joint, span_match).mean()
    with torch.no_grad():
        best = log_joint.flatten(1).argmax(-1, keepdim=True)
        em = span_match.flatten(1).gather(1, best).float().mean()
    return loss, em


def _batches(
    examples: Sequence[ReadingExample],
    train: Sequence[QAExample],
    start: DataPosition,
    cfg: ReadingConfig,
    model: QAModel,
    max_block_tokens: int,
    d: Dist,
) -> Iterator[tuple[DataPosition, ReadingBatch]]:
    for position, _, local in DataOrder(len(examples), cfg.seed).batches(start, cfg.batch_size, d):
        yield position, reading_batch(model, [examples[i] for i in local], train, max_block_tokens)


# -- the recipe -----------------------------------------------------------------------------------
def reading_settings(preset: Preset) -> dict:
    """Every setting the reading stage reads: its config.json, and its stage's fingerprint in the pipeline."""
    return {"reading": asdict(preset.reading), "qa": asdict(preset.qa), "compute_dtype": preset.embed.compute_dtype}


def train_reading(
    model_spec: str,
    index_dir: Path,
    train: Sequence[QAExample],
    out: Path,
    preset: Preset,
    resume: bool = False,
    progress: bool = True,
    reader_spec: str | None = None,
    timed: TimedSteps | None = None,
) -> Path:
    """Train the span reader of `model_spec` (or `reader_spec`) on the blocks its retriever finds over `index_dir`;
    returns out/reader, a reader `train_qa` starts from. `timed`: the deadline the steps end by and what sizes
    them (training/schedule.py: TimedSteps); None: the preset's. Raises ValueError where no training question has an answer-bearing block."""
    cfg = preset.reading
    d = setup_distributed()
    device = default_device()
    dtype = preset.compute_dtype(device)
    torch.manual_seed(cfg.seed + d.rank)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model, index, _, sparse = qa_model_over(model_spec, index_dir, preset, reader_spec)
    store = index.corpus()
    examples, found = _evidence(out, resume, model, train, index, store, sparse, cfg, d)
    reader = model.reader.to(device).train()
    total = cfg.total_steps(len(examples))
    optimizer = bert_optimizer(reader, cfg.lr, prefix_lrs={"span_head.": cfg.lr * cfg.head_lr_multiplier})
    scheduler = linear_schedule(optimizer, cfg.warmup_steps(total), total, decay_from=cfg.decay_from)
    if d.main:
        run = {"recipe": "reading", "model": model_spec, "reader": reader_spec, "index": str(index_dir)}
        data = {"index_version": index.version, "train_questions": len(train), "read_questions": len(examples)}
        record_run_config(out, run | reading_settings(preset) | data, resume)
    step, position, _ = resume_training(out, resume, reader, optimizer, scheduler, d, "reading")
    trained = torch.nn.parallel.DistributedDataParallel(reader) if d.world_size > 1 else reader
    schedule = scheduler.schedule
    timer = TimedSchedule(timed, schedule, warmup_of=cfg.warmup_steps, recurs={"checkpoint": cfg.checkpoint_every})
    metrics_log = MetricsLog(out, total, step, d, "reading", progress)
    max_tokens = store.config.max_block_tokens
    batches = Prefetched(_batches(examples, train, position, cfg, model, max_tokens, d), prefetch_depth(device))
    with batches, metrics_log:
        while step < schedule.total:
            timer.before_step(step)
            waited = time.perf_counter()
            position, batch = next(batches)
            batch = batch.to(device)
            waited = time.perf_counter() - waited
            with autocast(dtype, device):
                scores = trained(
                    **batch.reader.inputs,
                    starts=batch.reader.starts,
                    ends=batch.reader.ends,
                    span_valid=batch.reader.span_valid,
                )  # (B * R, S)
            shape = (-1, batch.blocks_per_question, scores.size(-1))  # (B, R, S)
            loss, em = reading_loss(
                scores.view(shape), batch.reader.span_valid.view(shape), batch.span_match.view(shape)
            )
            loss.backward()
            optimizer_step(reader, optimizer, scheduler)
            step += 1
            last = step == schedule.total
            metrics = {"loss": loss.item(), "train_em": em.item(), "lr": float(scheduler.get_last_lr()[0])}
            metrics_log.step(
                step,
                metrics | {"batch_seconds": waited},
                log_now=step % cfg.log_every == 0 or last,
                total=schedule.total,
            )
            if step % cfg.checkpoint_every == 0 or last:
                with timer.timing("checkpoint", cfg.checkpoint_every):
                    save_checkpoint(out, step, reader, optimizer, scheduler, position, d, final=last)
    if d.main:
        _finish(out, cfg, total, scheduler.schedule, timed, found, len(examples))
        model.reader.save(out / "reader")
    return out / "reader"


def _evidence(
    out: Path,
    resume: bool,
    model: QAModel,
    train: Sequence[QAExample],
    index: MipsIndex,
    store: BlockStore,
    sparse: BM25Searcher | None,
    cfg: ReadingConfig,
    d: Dist,
) -> tuple[list[ReadingExample], dict]:
    """The blocks each question reads, found once (a resumed stage reads them back: out/evidence.jsonl) and what
    finding them came to; ValueError where no question has an answer-bearing block."""
    evidence = out / EVIDENCE
    if resume and evidence.is_file() and (out / SUMMARY).is_file():
        return read_evidence(evidence), json.loads((out / SUMMARY).read_text())["found"]
    examples, found = find_evidence(model, train, index, store, sparse, cfg)
    if not examples:
        raise ValueError(
            f"none of the {len(train)} training questions has an answer-bearing block among the top {cfg.depth} "
            "retrieved (nor a paragraph with the answer's offset): the reader has nothing to read"
        )
    if d.main:
        write_evidence(evidence, examples)
        write_json_atomic(out / SUMMARY, {"found": asdict(found)})
    return examples, asdict(found)


def _finish(
    out: Path,
    cfg: ReadingConfig,
    total: int,
    schedule: LinearSchedule,
    timed: TimedSteps | None,
    found: dict,
    questions: int,
) -> None:
    """steps.json (the steps planned and trained) and reading.json (what was found, read, and how many passes)."""
    planned = {"steps": total, "lr_warmup": cfg.warmup_steps(total), "decay_from": cfg.decay_from}
    lengths = {"steps": schedule.total, "lr_warmup": schedule.warmup, "decay_from": schedule.decay_from}
    record_steps(out, planned, lengths, timed)
    summary = {"found": found, "read_questions": questions, "negatives": cfg.negatives, "steps": schedule.total}
    write_json_atomic(out / SUMMARY, summary | {"passes": schedule.total * cfg.batch_size / questions})


def reading_summary(out: Path) -> dict:
    """A finished reading stage's reading.json: what it found and skipped, the questions it read, its passes."""
    return json.loads((Path(out) / SUMMARY).read_text())
