"""The mechanism check (run by experiments/mechanism.py and tests/experiments/test_mechanism.py): does REALM's masked-LM loss alone teach the retriever where a masked span is?

A twin corpus of real text: each chosen sentence is a document twice, `<k>:a` and `<k>:b`. A salient span is masked
only when exactly one block of another document holds it (data/recoverable.py): its twin. The trivial-retrieval
rule drops the sentence's own document, so among the 2N - 1 other blocks the twin is the one that gives the span
back; the rest hold other real sentences. No retrieval label reaches the towers: their only gradient is the
marginal masked-LM loss of models/realm.py.

    reader phase (optional)  the reader learns to read a block: candidates (null, twin), towers frozen (the
                             stand-in for the paper's BERT reader, which reads its input from the first step)
    REALM phase              candidates: the null document, the twin and K-2 blocks of other documents drawn at
                             random (a top-k that holds the twin, in random order); the towers train, the reader
                             is held (`realm_trains_reader`), so what changes is the retriever

Measured before and after the REALM phase, on its training pairs and on held-out pairs (their sentences never
trained on; their blocks in the corpus): the twin's recall@1 over every other document's block (exact search with
the current towers), and masked-token accuracy of the marginal over the top K-1 against the null document alone.
A score detached from the loss, or a marginal that does not weigh each block's reading by p(z | x), leaves the
towers where they start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from realm.config import Preset
from realm.data.blocks import BlockStore, build_corpus
from realm.data.recoverable import SpanFinder
from realm.data.sentences import MaskedQuery, SentenceSet, build_sentences, mask_each_salient_span, sentences_path
from realm.data.sources import BadRecords, read_documents
from realm.eval.intervals import bootstrap_interval
from realm.models.inputs import encode_blocks, pad_batch
from realm.models.realm import RealmModel, make_batch, pad_queries
from realm.training.optim import bert_optimizer, optimizer_step
from realm.training.schedule import linear_schedule


@dataclass(frozen=True)
class MechanismConfig:
    reader_steps: int = 100  # the reader phase (0: none, the reader learns to read inside REALM's marginal)
    realm_steps: int = 200
    batch_size: int = 8
    num_candidates: int = 4  # the null document, the twin and 2 other blocks in training; the top 3 when measured
    lr: float = 1e-4  # the reader
    retriever_lr: float = 1e-4  # the towers
    head_lr_multiplier: float = 10.0  # the masked-LM head's, fresh in MiniLM (as the cpu preset)
    # the REALM phase trains the towers (and b_null); the reader too if set (as pretraining does), but then it can
    # learn the training spans by heart, and the null document catches up with retrieval
    realm_trains_reader: bool = False
    seed: int = 0


NULL_SCORE_LR = 0.05  # b_null's, as the cpu preset's
READER_PHASE_NULL_SCORE = -10.0  # b_null while the reader phase reads the twin: p(null) = sigmoid(-10)
# pairs in turn: trained on (by both phases), or held out (never trained on, their blocks in the corpus)
PARTS = ("held_out", "towers", "towers", "towers")


def lead_sentences(corpus: str, count: int, max_chars: int = 160) -> list[tuple[str, str]]:
    """(title, first sentence) of the first `count` documents of a corpus file whose first sentence is short."""
    out = []
    for doc in read_documents(corpus, skip_bad=True, bad=BadRecords()):
        text = doc.text.split(". ")[0].rstrip(".") + "."
        if len(text) <= max_chars:
            out.append((doc.title, text))
        if len(out) == count:
            break
    return out


def write_twin_corpus(sentences: list[tuple[str, str]], folder: Path, tokenizer, preset: Preset) -> BlockStore:
    """(title, sentence) pairs -> a corpus in `folder` with each sentence as two documents, tagged for salient spans."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [
        {"id": f"{k}:{twin}", "title": title, "text": text}
        for k, (title, text) in enumerate(sentences)
        for twin in "ab"
    ]
    (folder / "twins.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    build_corpus([str(folder / "twins.jsonl")], folder / "corpus", tokenizer, preset.corpus, progress=False)
    store = BlockStore(folder / "corpus")
    build_sentences(store, progress=False)
    return store


@dataclass
class TwinQueries:
    queries: list[MaskedQuery]
    doc_ids: list[str]  # each query's own document
    twins: np.ndarray  # (Q,) the block id of its twin
    part: np.ndarray  # (Q,) which of PARTS its pair is in


def twin_queries(store: BlockStore, tokenizer, preset: Preset) -> TwinQueries:
    """Every salient span that exactly one block of another document holds, its twin, masked in turn."""
    finder = SpanFinder(store, tokenizer)
    block_of = {doc: b for b, doc in enumerate(store.column("doc_id"))}
    sentences = SentenceSet(sentences_path(store), 0.0)
    queries, doc_ids, twins, parts = [], [], [], []
    for text, spans, doc in zip(sentences.texts, sentences.spans, sentences.doc_ids):
        pair, side = doc.rsplit(":", 1)
        twin = block_of[f"{pair}:{'b' if side == 'a' else 'a'}"]
        only_twin = [(s, e) for s, e in spans if {b for b in finder.holders(text[s:e]) if b != block_of[doc]} == {twin}]
        for query in mask_each_salient_span(
            text, only_twin, tokenizer, preset.retriever.query_max_tokens, preset.pretrain.max_masks
        ):
            queries.append(query)
            doc_ids.append(doc)
            twins.append(twin)
            parts.append(PARTS[int(pair) % len(PARTS)])
    return TwinQueries(queries, doc_ids, np.array(twins, dtype=np.int64), np.array(parts))


@torch.no_grad()
def measure(
    model: RealmModel, store: BlockStore, twins: TwinQueries, num_candidates: int, batch_size: int = 16
) -> dict:
    """Twin recall@1 over every block of another document, and the gain in masked-token accuracy of the marginal
    over the top `num_candidates` - 1 of them (and the null document) against the null document alone (paired, the
    same forward pass), with 95% bootstrap intervals over the masked spans, for the training and held-out pairs."""
    model.eval()
    tokenizer = model.retriever.tokenizer
    titles, bodies = store.slice(0, len(store))
    blocks = model.retriever.doc_tower(
        **pad_batch(*encode_blocks(tokenizer, titles, bodies, store.config), tokenizer.pad_token_id)
    )  # (N, D)
    doc_ids = np.array(store.column("doc_id"), dtype=object)
    found: list[bool] = []
    gains: list[float] = []
    for start in range(0, len(twins.queries), batch_size):
        queries = twins.queries[start : start + batch_size]
        q = model.retriever.query_tower(**pad_queries(queries, tokenizer.pad_token_id)[0])  # (B, D)
        scores = q.float() @ blocks.float().T  # (B, N) f(x, z)
        own = torch.from_numpy(doc_ids[None, :] == np.array(twins.doc_ids[start : start + batch_size])[:, None])
        ranked = scores.masked_fill(own, float("-inf")).argsort(1, descending=True).numpy()  # exact MIPS, trivial out
        found += (ranked[:, 0] == twins.twins[start : start + len(queries)]).tolist()
        batch = make_batch(queries, ranked[:, : num_candidates - 1], store, tokenizer, store.config)
        _, stats = model(batch)
        difference = stats["correct"].sum(1) - stats["null_correct"].sum(1)
        gains += (100.0 * difference / batch.mask_valid.sum(1)).tolist()
    model.train()
    result = {}
    for name in ("towers", "held_out"):
        chosen = twins.part == name
        if chosen.any():
            recall, gain = 100.0 * np.array(found, dtype=np.float64)[chosen], np.array(gains)[chosen]
            result[name] = {
                "spans": int(chosen.sum()),
                "twin_recall@1": float(recall.mean()),
                "twin_recall@1_95ci": list(bootstrap_interval(recall)),
                "retrieval_gain": float(gain.mean()),  # token accuracy points, each span's tokens averaged
                "retrieval_gain_95ci": list(bootstrap_interval(gain)),
            }
    return result


def _train(
    model: RealmModel, store: BlockStore, twins: TwinQueries, steps: int, cfg: MechanismConfig, reader_phase: bool
) -> list[float]:
    """`steps` of the masked-LM loss on the training pairs' spans; the loss of each step."""
    tokenizer = model.retriever.tokenizer
    lrs = {
        "reader.mlm.cls.": cfg.lr * cfg.head_lr_multiplier,
        "retriever.": cfg.retriever_lr,
        "null_score": NULL_SCORE_LR,
    }
    optimizer = bert_optimizer(model, cfg.lr, prefix_lrs=lrs)  # parameters that require a gradient
    scheduler = linear_schedule(optimizer, max(1, steps // 10), steps)
    rng = np.random.default_rng(cfg.seed + reader_phase)
    train = np.flatnonzero(twins.part == "towers")
    block_docs = np.array(store.column("doc_id"), dtype=object)  # read once, not per example
    losses = []
    for _ in range(steps):
        rows = rng.choice(train, min(cfg.batch_size, len(train)), replace=False)
        queries, doc_ids = [twins.queries[i] for i in rows], [twins.doc_ids[i] for i in rows]
        candidates = twins.twins[rows, None]  # (B, 1): the reader phase reads the twin
        if not reader_phase:  # (B, K-1): the twin among K-2 blocks of other documents drawn at random
            drawn = [
                rng.choice(
                    np.setdiff1d(np.flatnonzero(block_docs != doc), twins.twins[[i]]),
                    cfg.num_candidates - 2,
                    replace=False,
                )
                for doc, i in zip(doc_ids, rows)
            ]
            candidates = rng.permuted(np.concatenate([candidates, np.stack(drawn)], axis=1), axis=1)
        loss, _ = model(make_batch(queries, candidates, store, tokenizer, store.config))
        loss.backward()
        optimizer_step(model, optimizer, scheduler)
        losses.append(loss.item())
    return losses


def run_mechanism_check(
    model: RealmModel, store: BlockStore, twins: TwinQueries, cfg: MechanismConfig, doc_tower: str = "trained"
) -> dict:
    """The reader phase (towers frozen), then REALM's (`doc_tower` fixed: the query tower alone); measured before
    and after the REALM phase, with the mean loss of its first and last 10 steps."""
    torch.manual_seed(cfg.seed)
    learned_null = model.null_document == "learned_weight"
    if cfg.reader_steps:  # the reader reads the twin alone: p(null) ~ 0, so the null document learns no span
        model.retriever.requires_grad_(False)
        if learned_null:
            model.null_score.requires_grad_(False).fill_(READER_PHASE_NULL_SCORE)
        _train(model, store, twins, cfg.reader_steps, cfg, reader_phase=True)
        if learned_null:
            model.null_score.fill_(0.0).requires_grad_(True)
    model.retriever.requires_grad_(True)
    model.reader.requires_grad_(cfg.realm_trains_reader)
    if doc_tower == "fixed":
        model.retriever.doc_tower.requires_grad_(False)
    before = measure(model, store, twins, cfg.num_candidates)
    losses = _train(model, store, twins, cfg.realm_steps, cfg, reader_phase=False)
    after = measure(model, store, twins, cfg.num_candidates)
    return {
        "before": before,
        "after": after,
        "loss_first": float(np.mean(losses[:10])),
        "loss_last": float(np.mean(losses[-10:])),
    }
