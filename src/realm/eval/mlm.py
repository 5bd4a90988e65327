"""Masked-span accuracy of a (retriever, reader) pair on held-out sentences: how much retrieval helps the LM.

Each sentence gets one salient span masked (seeded, so every model sees the same masks), or, for a tighter
paired interval, each of its salient spans in turn. With an index,
candidates are retrieved as in training (trivial ones dropped, null document first) and the prediction
is the argmax of the marginal sum_z p(z | x) p(y_j | z, x); without one, the null document alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import islice

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from realm.common.deadline import TimeLimit
from realm.data.blocks import BlockStore
from realm.data.recoverable import SpanFinder
from realm.data.sentences import MaskedQuery, SentenceSet, mask_each_salient_span
from realm.eval.intervals import bootstrap_interval
from realm.index.mips import MipsIndex
from realm.index.search import retrieve
from realm.models.realm import RealmBatch, RealmModel, make_batch, pad_queries
from realm.training.data import example_rng

EVAL_SEED = 12345
# a masked span is retrieved (a candidate holds it), else recoverable (another document holds it), else neither
RECOVERABILITY = ("retrieved", "recoverable_not_retrieved", "not_recoverable")


def masked_queries(
    sentences: SentenceSet,
    tokenizer: PreTrainedTokenizerBase,
    query_max_tokens: int,
    max_masks: int,
    limit: int | None,
    every_span: bool,
) -> Iterator[tuple[int, MaskedQuery]]:
    """(sentence index, query) for the first `limit` sentences: one query per maskable salient span with
    `every_span`, else one of them drawn with a seeded generator (as `mask_sentence` draws it). A sentence without a
    maskable salient span has no query (pass sentences `with_salient_spans` so that `limit` counts used ones)."""
    for i in range(min(limit or len(sentences), len(sentences))):
        queries = mask_each_salient_span(sentences.texts[i], sentences.spans[i], tokenizer, query_max_tokens, max_masks)
        if queries and not every_span:
            queries = [queries[example_rng(EVAL_SEED, 0, i).integers(len(queries))]]
        for query in queries:
            yield i, query


@torch.no_grad()
def scored_batches(
    model: RealmModel,
    sentences: SentenceSet,
    store: BlockStore,
    index: MipsIndex | None,
    num_candidates: int,
    query_max_tokens: int,
    max_masks: int,
    limit: int | None,
    batch_size: int,
    every_span: bool = False,
    until: TimeLimit | None = None,
) -> Iterator[tuple[list[int], list[MaskedQuery], RealmBatch, dict[str, torch.Tensor]]]:
    """The model's statistics on the masked queries of the first `limit` sentences, in batches, with each
    query's sentence index; with `until`, no batch begins whose sentences the pace so far does not fit (a
    sentence's spans may then be scored in part)."""
    model.eval()
    device = next(model.parameters()).device  # the GPU when the caller put the model there
    tokenizer = model.retriever.tokenizer
    block_doc_ids = np.array(store.column("doc_id"), dtype=object)
    items = masked_queries(sentences, tokenizer, query_max_tokens, max_masks, limit, every_span)
    seen: set[int] = set()  # sentences scored (in part)
    try:
        while chunk := list(islice(items, batch_size)):
            rows = [i for i, _ in chunk]
            more = len(set(rows) - seen)
            if until is not None and until.fits(len(seen), more) < more:
                break
            seen.update(rows)
            queries = [query for _, query in chunk]
            retrieved = np.empty((len(queries), 0), dtype=np.int64)
            if index is not None and num_candidates > 1:
                query, *_ = pad_queries(queries, tokenizer.pad_token_id)
                query = {k: v.to(device) for k, v in query.items()}
                retrieved = retrieve(
                    model, index, query, block_doc_ids, [sentences.doc_ids[i] for i in rows], num_candidates - 1
                )
            batch = make_batch(queries, retrieved, store, tokenizer, store.config).to(device)
            _, stats = model(batch)
            yield rows, queries, batch, stats
    finally:
        model.train()


def sentence_points(rows: Sequence[int], differences: Sequence[float], tokens: int) -> np.ndarray:
    """Per span its sentence index and a difference in correct tokens (e.g. with retrieval minus without); `tokens`
    masked in all. Returns (S,) per sentence, over its spans, in points of the mean tokens a sentence: their mean is
    the accuracy difference, and resampling them keeps a sentence's spans together (they share its words)."""
    _, sentence_of = np.unique(np.asarray(rows), return_inverse=True)
    summed = np.bincount(sentence_of, weights=np.asarray(differences, dtype=np.float64))  # (S,)
    return 100 * summed / (tokens / len(summed))


@dataclass(frozen=True)
class SpanGroupGain:
    """The retrieval gain over the masked spans of one of RECOVERABILITY (points, 95% bootstrap over spans)."""

    spans: int
    retrieval_gain: float
    interval: tuple[float, float]

    def to_dict(self) -> dict:
        return {"spans": self.spans, "retrieval_gain": self.retrieval_gain, "retrieval_gain_95ci": list(self.interval)}

    @classmethod
    def from_dict(cls, data: dict) -> SpanGroupGain:
        low, high = data["retrieval_gain_95ci"]
        return cls(data["spans"], data["retrieval_gain"], (low, high))


@dataclass(frozen=True)
class MaskedLMScore:
    """Masked-token accuracy on held-out sentences with retrieval and with the null document alone, and the paired
    gain, in the one JSON form `masked_span_accuracy` writes (`to_dict`) and a record's readers read (`from_dict`;
    what a record written before a field lacks is None or empty). Accuracies and gains in points."""

    retrieval_gain: float  # token accuracy with retrieval minus with the null document alone, the same masks
    interval: tuple[float, float]  # its 95% bootstrap interval over sentences
    sentences: int
    spans: int | None = None
    token_accuracy: float | None = None
    span_accuracy: float | None = None
    null_token_accuracy: float | None = None
    null_span_accuracy: float | None = None
    p_null: float | None = None
    utility: float | None = None  # nats per mask
    per_sentence_gain: list[float] | None = None  # in sentence order: runs scored alike compare paired
    recoverable_share: float | None = None  # percent of the spans another document holds
    retrieved_share: float | None = None  # percent of the spans a candidate holds
    by_recoverability: dict[str, SpanGroupGain] = field(default_factory=dict)

    def to_dict(self) -> dict:
        data: dict = {}
        if self.by_recoverability:
            data["recoverable_share"] = self.recoverable_share
            data["retrieved_share"] = self.retrieved_share
            data["by_recoverability"] = {name: g.to_dict() for name, g in self.by_recoverability.items()}
        for name in ("token_accuracy", "span_accuracy", "null_token_accuracy", "null_span_accuracy"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        data |= {"retrieval_gain": self.retrieval_gain, "retrieval_gain_95ci": list(self.interval)}
        for name in ("p_null", "utility", "spans"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        data["sentences"] = self.sentences
        if self.per_sentence_gain is not None:
            data["per_sentence_gain"] = list(self.per_sentence_gain)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> MaskedLMScore:
        low, high = data["retrieval_gain_95ci"]
        groups = data.get("by_recoverability", {})
        return cls(
            data["retrieval_gain"],
            (low, high),
            data["sentences"],
            data.get("spans"),
            data.get("token_accuracy"),
            data.get("span_accuracy"),
            data.get("null_token_accuracy"),
            data.get("null_span_accuracy"),
            data.get("p_null"),
            data.get("utility"),
            data.get("per_sentence_gain"),
            data.get("recoverable_share"),
            data.get("retrieved_share"),
            {name: SpanGroupGain.from_dict(g) for name, g in groups.items()},
        )


def masked_span_accuracy(
    model: RealmModel,
    sentences: SentenceSet,
    store: BlockStore,
    index: MipsIndex | None,
    num_candidates: int,
    query_max_tokens: int,
    max_masks: int = 10,
    limit: int | None = None,
    batch_size: int = 16,
    every_span: bool = False,
    finder: SpanFinder | None = None,
    until: TimeLimit | None = None,
) -> dict:
    """Token accuracy, whole-span accuracy, mean p(null) and mean retrieval utility over the masked spans, and
    the token accuracy of the null document alone on the same masks (the same forward pass: the null document
    is candidate 0) with the paired gain of retrieval and its 95% bootstrap interval over sentences (with
    `every_span`, a sentence's spans are resampled together: they share its words). With a `finder`, the
    shares of spans another document holds (recoverable) and a candidate holds (retrieved), and the gain split
    by them (`by_recoverability`: retrieval can only help where the span is recoverable). With `until`, the
    sentences are scored in their order until it fits no more (pass them in a seeded order: `shuffled`)."""
    tokens = correct_tokens = spans = correct_spans = null_correct_spans = 0
    p_null = utility = 0.0
    rows: list[int] = []
    gains: list[float] = []  # per span: correct tokens with retrieval minus with the null document alone
    masks: list[int] = []  # per span: its masked tokens
    groups: list[str] = []  # per span: which of RECOVERABILITY it falls in
    for batch_rows, queries, batch, stats in scored_batches(
        model,
        sentences,
        store,
        index,
        num_candidates,
        query_max_tokens,
        max_masks,
        limit,
        batch_size,
        every_span,
        until,
    ):
        hits = stats["correct"]  # (B, M) bool, False on padding
        valid = batch.mask_valid
        tokens += int(valid.sum())
        correct_tokens += int(hits.sum())
        spans += len(queries)
        correct_spans += int((hits | ~valid).all(dim=1).sum())
        null_correct_spans += int((stats["null_correct"] | ~valid).all(dim=1).sum())
        p_null += stats["p_null"].item() * len(queries)
        utility += stats["utility"].item() * len(queries)
        rows += batch_rows
        gains += (hits.sum(1) - stats["null_correct"].sum(1)).tolist()
        masks += valid.sum(1).tolist()
        if finder is not None:
            doc_ids = [sentences.doc_ids[i] for i in batch_rows]
            found = finder.label(batch.masked_texts(model.retriever.tokenizer), doc_ids, batch.candidate_ids[:, 1:])
            groups += [RECOVERABILITY[0] if hit else RECOVERABILITY[1 + (not rec)] for rec, hit in zip(*found)]
    per_sentence = sentence_points(rows, gains, tokens)
    low, high = bootstrap_interval(per_sentence)
    gain = float(per_sentence.mean())
    per_span = 100 * np.array(gains, dtype=np.float64) / np.maximum(1, masks)  # each span's difference, points
    by_recoverability: dict[str, SpanGroupGain] = {}
    shares: tuple[float | None, float | None] = (None, None)
    if groups:
        shares = (
            100 * (1 - groups.count(RECOVERABILITY[2]) / len(groups)),  # recoverable
            100 * groups.count(RECOVERABILITY[0]) / len(groups),  # retrieved
        )
        for group in RECOVERABILITY:
            values = per_span[[g == group for g in groups]]
            by_recoverability[group] = SpanGroupGain(
                len(values),
                float(values.mean()) if len(values) else 0.0,
                bootstrap_interval(values) if len(values) else (0.0, 0.0),
            )
    return MaskedLMScore(
        retrieval_gain=gain,
        interval=(low, high),
        sentences=len(per_sentence),
        spans=spans,
        token_accuracy=100 * correct_tokens / tokens,
        span_accuracy=100 * correct_spans / spans,
        null_token_accuracy=100 * correct_tokens / tokens - gain,
        null_span_accuracy=100 * null_correct_spans / spans,
        p_null=p_null / spans,
        utility=utility / spans,
        per_sentence_gain=per_sentence.tolist(),
        recoverable_share=shares[0],
        retrieved_share=shares[1],
        by_recoverability=by_recoverability,
    ).to_dict()


@dataclass(frozen=True)
class WorkedExample:
    """One row of the paper's Table 3: p(masked span) without retrieval, with the top block, and marginalised.
    Span probabilities are products over its masked wordpieces (each marginalised separately, as in training)."""

    masked_sentence: str
    answer: str
    top_block_title: str
    top_block_text: str
    p_top_block: float  # p(z_top | x) among the candidates
    p_without_retrieval: float  # prod_j p(y_j | null, x)
    p_with_top_block: float  # prod_j p(y_j | z_top, x)
    p_marginal: float  # prod_j sum_z p(z | x) p(y_j | z, x)
    top_block_holds_span: bool | None = None  # the span's words are in the top block's body (None: not looked up)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> WorkedExample:
        return cls(**data)


def probability_raise(log_p_null: float, log_p_top: float) -> float:
    """p(y | z_top, x) - p(y | null, x): how much likelier the top block makes the span. Not the log ratio, which
    ranks first the spans no model finds (1e-12 -> 1e-10 outranks 0.2 -> 0.6), whose blocks seldom hold them."""
    return math.exp(log_p_top) - math.exp(log_p_null)


def worked_examples(
    model: RealmModel,
    sentences: SentenceSet,
    store: BlockStore,
    index: MipsIndex,
    num_candidates: int,
    query_max_tokens: int,
    max_masks: int = 10,
    pool: int = 200,
    count: int = 3,
    batch_size: int = 16,
    finder: SpanFinder | None = None,
) -> list[WorkedExample]:
    """Of the first `pool` held-out sentences, the `count` where the top retrieved block raises p(answer)
    the most (`probability_raise`), so the block shown is the evidence that helped: the paper's Table 3 picks
    such examples too."""
    tokenizer = model.retriever.tokenizer
    scored: list[tuple[float, WorkedExample]] = []
    for _, queries, batch, stats in scored_batches(
        model, sentences, store, index, num_candidates, query_max_tokens, max_masks, pool, batch_size
    ):
        log_pz, token_lp, valid = stats["log_pz"], stats["token_log_probs"], batch.mask_valid.float()  # (B,K) (B,K,M)
        null = (token_lp[:, 0] * valid).sum(-1)  # (B,) log prod_j p(y_j | null, x)
        top = (token_lp[:, 1] * valid).sum(-1) if token_lp.size(1) > 1 else null
        marginal = (torch.logsumexp(log_pz.unsqueeze(-1) + token_lp, dim=1) * valid).sum(-1)
        top_ids = batch.candidate_ids[:, 1].tolist() if batch.candidate_ids.shape[1] > 1 else [-1] * len(queries)
        found = [i for i in top_ids if i >= 0]
        blocks = dict(zip(found, store.take(found)))  # one Arrow take per batch
        for b, query in enumerate(queries):
            block = blocks.get(top_ids[b])
            example = WorkedExample(
                masked_sentence=str(tokenizer.decode(query.input_ids[1:-1])),
                answer=str(tokenizer.decode(query.targets)),
                top_block_title=block.title if block else "",
                top_block_text=block.body if block else "",
                p_top_block=float(log_pz[b, 1].exp()) if block else 0.0,
                p_without_retrieval=float(null[b].exp()),
                p_with_top_block=float(top[b].exp()),
                p_marginal=float(marginal[b].exp()),
                top_block_holds_span=finder.retrieved(str(tokenizer.decode(query.targets)), [top_ids[b]])
                if finder
                else None,
            )
            scored.append((probability_raise(float(null[b]), float(top[b])), example))
    scored.sort(key=lambda pair: -pair[0])
    return [example for _, example in scored[:count]]
