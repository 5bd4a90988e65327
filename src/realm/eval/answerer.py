"""Questions in, answers with their evidence out: retrieve the top-k blocks, read their spans, marginalise.

    p(y | x) = sum over blocks z and spans s of z reading as y of p(z, s | x)     # models/orqa.py

The answer (`selection`): `marginal`, the string with the highest p(y | x), summed over the spans that read as it
among each block's top SPANS_PER_BLOCK spans; or `best_span`, ORQA's rule, the text of the single most probable
(block, span), argmax of f(x, z) + S(s). Either way the score is p(answer | x) as `marginal` sums it, and each
block's evidence says how much of it came from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from realm.data.qa_examples import QAExample, normalize_answer
from realm.index.mips import MipsIndex
from realm.index.search import Searcher, SearchHit, open_searcher, retrieval_logits
from realm.models.orqa import QAModel, joint_log_probs, marginal_answer_log_likelihood
from realm.models.span_reader import BlockSpans, matching_spans

SPANS_PER_BLOCK = 32  # spans per block considered as answer strings at prediction time


@dataclass
class Evidence:
    block_id: int
    doc_id: str
    title: str
    text: str
    retrieval_prob: float  # p(z | x) among the top k, from the retrieval scores alone
    answer_prob: float  # sum of p(z, s | x) over the spans s of z that read as the answer
    answer_span: tuple[int, int] | None  # character offsets of the best such span in `text`


@dataclass
class Answer:
    question: str
    answer: str
    score: float  # p(answer | x), marginalised over the blocks and their matching spans
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def compose_answer(
    question: str,
    hits: Sequence[SearchHit],
    blocks: Sequence[BlockSpans],
    block_logits: torch.Tensor,
    log_joint: torch.Tensor,
    selection: str = "marginal",
) -> Answer:
    """The answer string by `selection` (module doc), with its evidence. block_logits (K,) the retrieval logits;
    log_joint (K, S) log p(z, s | x)."""
    pz = torch.softmax(block_logits.float(), 0).tolist()
    totals: dict[str, float] = {}  # normalised answer -> p(y | x)
    shown: dict[str, str] = {}  # normalised answer -> its text as first read
    per_block: list[dict[str, tuple[float, tuple[int, int]]]] = []  # normalised answer -> (sum p(z,s|x), best span)
    for z, (hit, spans) in enumerate(zip(hits, blocks)):
        found: dict[str, tuple[float, tuple[int, int]]] = {}
        count = min(SPANS_PER_BLOCK, len(spans.spans))
        if count:
            top = torch.topk(log_joint[z, : len(spans.spans)], count)
            for lp, s in zip(top.values.tolist(), top.indices.tolist()):
                text = spans.text(hit.text, spans.spans[s])
                key = normalize_answer(text)
                if key:
                    mass, first = found.get(key, (0.0, spans.char_span(spans.spans[s])))
                    found[key] = (mass + float(np.exp(lp)), first)
                    shown.setdefault(key, text)
        for key, (mass, _) in found.items():
            totals[key] = totals.get(key, 0.0) + mass
        per_block.append(found)
    best = max(totals, key=lambda answer: totals[answer]) if totals else ""
    if selection == "best_span" and totals:  # ORQA: the single most probable (block, span)
        z, s = divmod(int(log_joint.flatten().argmax()), log_joint.size(1))
        best = normalize_answer(blocks[z].text(hits[z].text, blocks[z].spans[s])) or best
    evidence = []
    for z, hit in enumerate(hits):
        mass, span = per_block[z].get(best, (0.0, None))  # type: ignore[arg-type]  # (0, None): not in this block
        evidence.append(Evidence(hit.block_id, hit.doc_id, hit.title, hit.text, pz[z], mass, span))
    return Answer(question, shown.get(best, ""), totals.get(best, 0.0), evidence)


ReadRows = dict[tuple[str, int], tuple[torch.Tensor, BlockSpans]]  # (question, block id) -> S(s) of valid spans, spans


def padded_scores(rows: Sequence[tuple[torch.Tensor, BlockSpans]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One question's rows -> span scores and validity (K, S), S the most spans of a row."""
    width = max(1, max(len(scores) for scores, _ in rows))
    scores = torch.zeros(len(rows), width)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for z, (row, _) in enumerate(rows):
        scores[z, : len(row)] = row
        valid[z, : len(row)] = True
    return scores, valid


class Answerer:
    """Questions in, answers with evidence out: a searcher (dense REALM retrieval, or BM25 with a uniform
    p(z | x) since its scores are not retrieval logits) and the span reader, batched."""

    def __init__(
        self,
        model: QAModel,
        searcher: Searcher,
        k: int,
        max_block_tokens: int,
        batch_size: int = 8,
        dtype: torch.dtype = torch.float32,
        selection: str = "marginal",
        read_rows: ReadRows | None = None,
        retrieval_weight: float = 1.0,
    ):
        if selection not in ("marginal", "best_span"):
            raise ValueError(f"unknown answer selection {selection!r}: marginal or best_span")
        self.selection = selection
        self.model = model.eval()
        self.searcher = searcher
        self.k = k
        self.max_block_tokens = max_block_tokens
        self.batch_size = batch_size
        self.dtype = dtype
        self.read_rows = read_rows  # None: every row is read; else the rows read so far, kept (and shared)
        # a · f(x, z) + S(s) at answer time (1: ORQA's joint softmax, as trained; experiments/retrieval_weight.py)
        self.retrieval_weight = retrieval_weight

    @property
    def warning(self) -> str | None:
        """What a user must know about these answers: a reader that was never fine-tuned answers with noise."""
        if self.model.reader.fine_tuned:
            return None
        return (
            "the reader was never fine-tuned for QA (its span head is fresh: a `realm train pretrain` output or "
            "MiniLM as it comes), so its answers are noise; fine-tune it with `realm train qa --model MODEL ...`"
        )

    def ask(self, questions: Sequence[str]) -> list[Answer]:
        answers = []
        for start in range(0, len(questions), self.batch_size):
            part = list(questions[start : start + self.batch_size])
            answers += self.read(part, self.searcher.batch_search(part, self.k))
        return answers

    def _rows(
        self, questions: Sequence[str], hits: Sequence[Sequence[SearchHit]]
    ) -> list[list[tuple[torch.Tensor, BlockSpans]]]:
        """S(s) of each (question, block)'s valid spans, and the block's spans, per question, hits' order. A row in
        `read_rows` is not read again; S(s) depends on the question and the block alone."""
        bodies = {(q, h.block_id): h.text for q, row in zip(questions, hits) for h in row}  # in hits' order
        rows: ReadRows = self.read_rows if self.read_rows is not None else {}
        missing = [key for key in bodies if key not in rows]
        if missing:
            batch, blocks = self.model.reader_inputs(
                [q for q, _ in missing], [[bodies[key]] for key in missing], self.max_block_tokens
            )
            device = next(self.model.parameters()).device
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16):
                scores = self.model.span_scores(batch.to(device)).float().cpu()  # (N, S)
            for n, (key, (spans,)) in enumerate(zip(missing, blocks)):
                rows[key] = (scores[n, : len(spans.spans)].clone(), spans)
        return [[rows[(q, h.block_id)] for h in row] for q, row in zip(questions, hits)]

    @torch.inference_mode()
    def read(self, questions: Sequence[str], hits: Sequence[Sequence[SearchHit]]) -> list[Answer]:
        """Answers for questions whose blocks are already retrieved (hits: best first, SearchHit.score = f(x, z))."""
        answers: list[Answer | None] = [Answer(q, "", 0.0) if not row else None for q, row in zip(questions, hits)]
        asked = [b for b, row in enumerate(hits) if row]
        for b, rows in zip(asked, self._rows([questions[b] for b in asked], [hits[b] for b in asked])):
            scores, valid = padded_scores(rows)
            block_logits = retrieval_logits(hits[b], self.searcher.scores_are_retrieval_logits)
            weighted = self.retrieval_weight * block_logits
            log_joint = joint_log_probs(weighted[None], scores[None], valid[None])
            blocks = [spans for _, spans in rows]
            answers[b] = compose_answer(questions[b], hits[b], blocks, block_logits, log_joint[0], self.selection)
        return [answer for answer in answers if answer is not None]  # every question has one by now

    @torch.inference_mode()
    def reference_probability(self, example: QAExample) -> float:
        """p(y | x) of the reference answers: 0 when no retrieved block has a span that reads as one."""
        hits = self.searcher.search(example.question, self.k)
        if not hits:
            return 0.0
        (rows,) = self._rows([example.question], [hits])
        scores, valid = padded_scores(rows)  # (K, S)
        match = torch.zeros_like(valid)
        for z, (hit, (_, spans)) in enumerate(zip(hits, rows)):
            match[z, : len(spans.spans)] = torch.tensor(matching_spans(hit.text, spans, example), dtype=torch.bool)
        if not match.any():
            return 0.0
        log_joint = joint_log_probs(
            retrieval_logits(hits, self.searcher.scores_are_retrieval_logits)[None], scores[None], valid[None]
        )
        return marginal_answer_log_likelihood(log_joint, match[None]).exp().item()


def load_answerer(
    model_spec: str,
    index_dir: str | Path,
    preset,
    retriever: str = "dense",
    k: int | None = None,
    corpus: str | Path | None = None,
    version: int | None = None,
) -> Answerer:
    """Model + index version (default: CURRENT) -> an Answerer. `retriever="bm25"` keeps the reader and swaps
    in BM25 over the same blocks; `"hybrid"` fuses both (index/search.py)."""
    return load_answerers(model_spec, index_dir, preset, (retriever,), k, corpus, version)[retriever]


def load_answerers(
    model_spec: str,
    index_dir: str | Path,
    preset,
    retrievers: Sequence[str],
    k: int | None = None,
    corpus: str | Path | None = None,
    version: int | None = None,
) -> dict[str, Answerer]:
    """One Answerer for each of `retrievers`, over one reader and one version's blocks. With more than one they
    share the rows read (ReadRows): a (question, block) that two retrievers both return is read once."""
    from realm.common.device import default_device

    index = MipsIndex(index_dir, version)
    config = index.retriever_config(preset.retriever)  # pooling etc. of the index's model
    model = QAModel.load(model_spec, config, preset.qa.span_hidden, preset.qa.max_span_width)
    store = index.corpus(corpus)  # the version's live blocks, read once for the searchers and the reader's length
    device = default_device()
    model = model.to(device)
    read_rows: ReadRows | None = {} if len(retrievers) > 1 else None
    return {
        retriever: Answerer(
            model,
            open_searcher(index, retriever, model.retriever, model.fusion_weight, store),
            k or preset.qa.top_k,
            store.config.max_block_tokens,
            dtype=preset.compute_dtype(device),
            selection=preset.qa.answer_selection,
            read_rows=read_rows,
        )
        for retriever in retrievers
    }
