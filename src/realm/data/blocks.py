"""The knowledge corpus Z: documents split into blocks of at most N wordpieces, stored as Arrow.

A block counts `[CLS] title [SEP] body [SEP]` against its budget (paper: 288). Bodies are packed from
whole sentences where possible; a sentence longer than the budget is cut at word boundaries. Cuts only
fall between tokens and every character of a document's text lands in exactly one block, so no text is
ever dropped (only the whitespace at a cut).

On disk a corpus is a folder with `blocks-<fingerprint>.arrow` (Arrow IPC, memory-mapped on read so a
13M-block corpus costs no RAM) and `meta.json`, which is written last and names the blocks file: a
reader sees the old corpus or the new one, never a mix.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from realm.common.io import (
    NoSpaceError,
    clean_partials,
    free_bytes,
    is_disk_full,
    partial_name,
    write_json_atomic,
)
from realm.common.tokenization import tokenizer_fingerprint
from realm.config import CorpusConfig
from realm.data.sources import BadRecords, Columns, CorpusError, Document, read_all

FORMAT_VERSION = 1
META = "meta.json"
BLOCKS_FILE = re.compile(r"blocks-[0-9a-f]+\.arrow")
SCHEMA = pa.schema(
    [
        ("block_id", pa.int64()),
        ("doc_id", pa.string()),
        ("position", pa.int32()),  # index of the block within its document
        ("title", pa.string()),
        ("body", pa.string()),
        ("token_count", pa.int32()),  # wordpieces of [CLS] title [SEP] body [SEP]
    ]
)

# A sentence ends at . ! or ? (plus closing quotes/brackets) followed by whitespace.
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*\s+")


@dataclass(frozen=True)
class Block:
    doc_id: str
    position: int
    title: str
    body: str
    token_count: int


def sentence_starts(text: str) -> list[int]:
    """Character offsets where sentences begin (always includes 0)."""
    return [0] + [m.end() for m in _SENTENCE_END.finditer(text) if m.end() < len(text)]


class BlockSplitter:
    """Splits documents into blocks that respect `max_block_tokens` (title included)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: CorpusConfig):
        if config.max_block_tokens < config.max_title_tokens + 8:
            raise ValueError("max_block_tokens must leave room for a body after the title")
        self.tokenizer = tokenizer
        self.config = config

    def title_tokens(self, title: str) -> int:
        """Wordpieces the title takes in a block (a very long title is cut to max_title_tokens)."""
        n = len(self.tokenizer(title, add_special_tokens=False)["input_ids"]) if title else 0
        return min(n, self.config.max_title_tokens)

    def block_tokens(self, title: str, body: str) -> int:
        body_n = len(self.tokenizer(body, add_special_tokens=False)["input_ids"])
        return 3 + self.title_tokens(title) + body_n

    def split(self, doc: Document) -> list[Block]:
        budget = self.config.max_block_tokens - 3 - self.title_tokens(doc.title)
        enc = self.tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)
        offsets: list[tuple[int, int]] = enc["offset_mapping"]
        if not offsets:  # text with no wordpieces at all (e.g. only control characters)
            raise CorpusError(f"document {doc.id!r}: text has no tokens")
        word_ids = enc.word_ids()
        token_starts = [start for start, _ in offsets]
        starts = sentence_starts(doc.text)
        sentence_of = [bisect.bisect_right(starts, s) - 1 for s in token_starts]

        cuts = self._cut_points(sentence_of, word_ids, budget)  # token indices where blocks begin
        blocks: list[Block] = []
        for position, (t0, t1) in enumerate(zip(cuts, cuts[1:] + [len(offsets)])):
            # Character span runs to the next block's first token, so nothing between tokens is lost.
            c0 = 0 if t0 == 0 else token_starts[t0]
            c1 = len(doc.text) if t1 == len(offsets) else token_starts[t1]
            body = doc.text[c0:c1].strip()
            blocks.append(Block(doc.id, position, doc.title, body, self.block_tokens(doc.title, body)))
        self._shrink_overlong(blocks, doc)
        return blocks

    @staticmethod
    def _cut_points(sentence_of: Sequence[int], word_ids: Sequence[int | None], budget: int) -> list[int]:
        """Greedy packing: start a new block at a sentence start if the sentence does not fit,
        and inside an over-long sentence at the last word start that fits."""
        n = len(sentence_of)
        cuts = [0]
        start = 0
        while True:
            if n - start <= budget:
                return cuts
            limit = start + budget  # first token that does not fit
            # Latest sentence start in (start, limit]
            cut = next((t for t in range(limit, start, -1) if sentence_of[t] != sentence_of[t - 1]), None)
            if cut is None:  # one sentence longer than the budget: cut at a word start
                cut = next((t for t in range(limit, start, -1) if word_ids[t] != word_ids[t - 1]), limit)
            cuts.append(cut)
            start = cut

    def _shrink_overlong(self, blocks: list[Block], doc: Document) -> None:
        """Re-tokenising a block that was cut mid-word can add a wordpiece; such blocks are rare
        (a single 'word' longer than the budget) and are re-split by characters."""
        for i, block in enumerate(blocks):
            if block.token_count <= self.config.max_block_tokens:
                continue
            body, pieces = block.body, []
            while body:
                size = len(body)
                while self.block_tokens(doc.title, body[:size]) > self.config.max_block_tokens:
                    size = max(1, size * 9 // 10)
                pieces.append(body[:size].strip())
                body = body[size:].strip()
            blocks[i : i + 1] = [Block(doc.id, 0, doc.title, p, self.block_tokens(doc.title, p)) for p in pieces if p]
        for position, block in enumerate(blocks):
            if block.position != position:
                blocks[position] = Block(block.doc_id, position, block.title, block.body, block.token_count)


@dataclass(frozen=True)
class CorpusMeta:
    format_version: int
    fingerprint: str
    blocks_file: str
    num_blocks: int
    num_documents: int
    skipped_records: int
    max_block_tokens: int
    max_title_tokens: int
    tokenizer_fingerprint: str
    sources: list[str]
    build_seconds: float


class Fingerprint:
    """Running sha256 over block contents: equal fingerprints mean identical corpora."""

    def __init__(self, config: CorpusConfig, tokenizer_fp: str):
        self._hash = hashlib.sha256(json.dumps([asdict(config), tokenizer_fp]).encode())

    def update(self, block: Block) -> None:
        self._hash.update("\x1f".join((block.doc_id, block.title, block.body)).encode() + b"\x1e")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:16]


def _batches(blocks: Iterator[Block], size: int) -> Iterator[list[Block]]:
    batch: list[Block] = []
    for block in blocks:
        batch.append(block)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def split_documents(
    docs: Iterable[Document], splitter: BlockSplitter, skip_bad: bool, bad: BadRecords
) -> Iterator[list[Block]]:
    """The blocks of each document in turn; a document that cannot be split is a bad record."""
    for doc in docs:
        try:
            blocks = splitter.split(doc)
        except CorpusError as err:
            if not skip_bad:
                raise
            bad.add(doc.id, str(err))
            continue
        yield blocks


def write_blocks(path: Path, blocks: Iterable[Block], first_id: int = 0) -> int:
    """Stream blocks into an Arrow IPC file at `path` with ids first_id, first_id + 1, ...; returns how many."""
    count = 0
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        for batch in _batches(iter(blocks), 4096):
            columns = {name: [getattr(b, name) for b in batch] for name in SCHEMA.names if name != "block_id"}
            columns["block_id"] = list(range(first_id + count, first_id + count + len(batch)))
            writer.write_batch(pa.record_batch(columns, schema=SCHEMA))
            count += len(batch)
    return count


def read_blocks(path: Path) -> pa.Table:
    """A blocks file, memory-mapped: a 13M-block corpus costs no RAM."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def build_corpus(
    inputs: list[str],
    out_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    config: CorpusConfig,
    skip_bad: bool = False,
    progress: bool = True,
    columns: Columns = Columns(),
) -> CorpusMeta:
    """Read, split and store; the new corpus replaces any old one at `out_dir` only once complete."""
    started = time.monotonic()
    out_dir = Path(out_dir)
    if out_dir.is_file():
        raise FileExistsError(f"{out_dir} is a file; --out must name a folder for the corpus")
    clean_partials(out_dir)  # a build killed mid-write leaves these: the re-run starts over
    # A build killed between its blocks file and its meta.json leaves an uncommitted blocks file: still ours.
    if out_dir.exists() and not (out_dir / META).exists():
        if any(not BLOCKS_FILE.fullmatch(entry.name) for entry in out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} exists and is not a corpus folder; refusing to write into it")
    out_dir.mkdir(parents=True, exist_ok=True)
    splitter = BlockSplitter(tokenizer, config)
    bad = BadRecords()
    fingerprint = Fingerprint(config, tokenizer_fingerprint(tokenizer))
    num_docs = 0

    def all_blocks() -> Iterator[Block]:
        nonlocal num_docs
        docs = tqdm(read_all(inputs, skip_bad, bad, columns), desc="splitting", unit="doc", disable=not progress)
        for blocks in split_documents(docs, splitter, skip_bad, bad):
            num_docs += 1
            for block in blocks:
                fingerprint.update(block)
                yield block

    partial = out_dir / partial_name("blocks.arrow")
    try:
        num_blocks = write_blocks(partial, all_blocks())
        if num_blocks == 0:
            raise CorpusError(f"no documents in {inputs} (skipped {bad.count} bad records)")
        digest = fingerprint.hexdigest()
        blocks_file = f"blocks-{digest}.arrow"
        os.replace(partial, out_dir / blocks_file)
    except OSError as err:  # the blocks' size is known only once split (streamed): a full disk is found, not foreseen
        if not is_disk_full(err):
            raise
        written = partial.stat().st_size if partial.exists() else 0
        partial.unlink(missing_ok=True)
        raise NoSpaceError(
            f"{out_dir}: the disk filled after {written:,} bytes of blocks (the corpus needs more); "
            f"{free_bytes(out_dir):,} bytes are free there; any corpus already in the folder is unchanged"
        ) from err
    finally:
        partial.unlink(missing_ok=True)

    meta = CorpusMeta(
        format_version=FORMAT_VERSION,
        fingerprint=digest,
        blocks_file=blocks_file,
        num_blocks=num_blocks,
        num_documents=num_docs,
        skipped_records=bad.count,
        max_block_tokens=config.max_block_tokens,
        max_title_tokens=config.max_title_tokens,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        sources=list(inputs),
        build_seconds=round(time.monotonic() - started, 1),
    )
    write_json_atomic(out_dir / META, asdict(meta))  # the commit point
    for entry in out_dir.iterdir():  # the replaced corpus, and any a killed build left uncommitted
        if BLOCKS_FILE.fullmatch(entry.name) and entry.name != blocks_file:
            entry.unlink(missing_ok=True)
    return meta


def _read_meta(folder: Path) -> CorpusMeta:
    try:
        raw = json.loads((folder / META).read_text())
        meta = CorpusMeta(**raw)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{folder}: not a corpus folder (no {META}); build one with `realm corpus build`"
        ) from None
    except (json.JSONDecodeError, TypeError) as err:
        raise CorpusError(f"{folder / META}: unreadable corpus metadata: {err}") from err
    if meta.format_version != FORMAT_VERSION:
        raise CorpusError(f"{folder}: corpus format {meta.format_version}, this version reads {FORMAT_VERSION}")
    return meta


class BlockStore:
    """Read-only, memory-mapped view of a built corpus; block ids are row numbers."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.meta = _read_meta(self.folder)
        self.table: pa.Table = read_blocks(self.folder / self.meta.blocks_file)
        if self.table.num_rows != self.meta.num_blocks:
            raise CorpusError(
                f"{self.folder}: {self.table.num_rows} blocks on disk, metadata says {self.meta.num_blocks}"
            )

    @property
    def fingerprint(self) -> str:
        return self.meta.fingerprint

    @property
    def config(self) -> CorpusConfig:
        return CorpusConfig(max_block_tokens=self.meta.max_block_tokens, max_title_tokens=self.meta.max_title_tokens)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def live_ids(self) -> np.ndarray:
        """Sorted ids of the blocks that make up the knowledge: all of them (an index version may drop some)."""
        return np.arange(len(self), dtype=np.int64)

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()

    def take(self, block_ids: Iterable[int]) -> list[Block]:
        rows = self.table.take(pa.array(list(block_ids), type=pa.int64())).to_pylist()
        return [Block(r["doc_id"], r["position"], r["title"], r["body"], r["token_count"]) for r in rows]

    def slice(self, start: int, stop: int) -> tuple[list[str], list[str]]:
        """(titles, bodies) of rows [start, stop)."""
        part = self.table.slice(start, stop - start)
        return part.column("title").to_pylist(), part.column("body").to_pylist()
