"""Block splitting, corpus inputs and their failure modes, and the durable block store."""

from __future__ import annotations

import gzip
import json
import re
import zipfile
from pathlib import Path

import pytest
from conftest import DOCS, SHARED_DATA, TINY_CORPUS

from realm.config import CorpusConfig
from realm.data.blocks import BlockSplitter, BlockStore, build_corpus
from realm.data.sources import BadRecords, CorpusError, Document, read_documents


def _nonspace(text: str) -> str:
    return re.sub(r"\s+", "", text)


LONG_TEXT = (
    "Alpha beta gamma delta. " * 30
    + "This single sentence is deliberately very long and has no full stop for a long while " * 8
    + "and finally ends. Short one! Another question? Yes."
)


@pytest.mark.parametrize("max_tokens", [24, 48, 128])
def test_split_loses_no_text_respects_limit_keeps_title(tokenizer, max_tokens):
    config = CorpusConfig(max_block_tokens=max_tokens, max_title_tokens=8)
    doc = Document("d1", "A Title Of Some Length", LONG_TEXT)
    blocks = BlockSplitter(tokenizer, config).split(doc)
    assert len(blocks) > 1
    assert _nonspace("".join(b.body for b in blocks)) == _nonspace(doc.text)  # nothing dropped, nothing repeated
    for position, block in enumerate(blocks):
        assert block.title == doc.title and block.doc_id == "d1" and block.position == position
        # The stored count is the real length of [CLS] title [SEP] body [SEP] and respects the budget.
        real = len(tokenizer(block.title, block.body)["input_ids"])
        assert block.token_count == real <= max_tokens


def test_split_is_sentence_aligned_when_sentences_fit(tokenizer):
    config = CorpusConfig(max_block_tokens=24, max_title_tokens=8)
    doc = Document("d", "T", "One two three four five. Six seven eight nine ten. Eleven twelve thirteen. Fourteen.")
    blocks = BlockSplitter(tokenizer, config).split(doc)
    for block in blocks[:-1]:
        assert block.body.endswith(".")
    assert blocks[0].body.startswith("One")


def test_short_document_is_one_block(tokenizer):
    blocks = BlockSplitter(tokenizer, TINY_CORPUS).split(Document("d", "Moon", "The Moon orbits Earth."))
    assert [b.body for b in blocks] == ["The Moon orbits Earth."]


def test_huge_title_is_cut_for_the_budget_but_stored_whole(tokenizer):
    title = "word " * 100
    blocks = BlockSplitter(tokenizer, TINY_CORPUS).split(Document("d", title.strip(), "Body text here. " * 10))
    assert all(b.title == title.strip() for b in blocks)
    assert all(b.token_count <= TINY_CORPUS.max_block_tokens for b in blocks)


def test_unbreakable_word_longer_than_budget(tokenizer):
    text = "x" * 3000 + " tail."
    blocks = BlockSplitter(tokenizer, TINY_CORPUS).split(Document("d", "T", text))
    assert _nonspace("".join(b.body for b in blocks)) == _nonspace(text)
    assert all(b.token_count <= TINY_CORPUS.max_block_tokens for b in blocks)


def test_build_and_reopen(tmp_path, docs_file, tokenizer):
    meta = build_corpus([str(docs_file)], tmp_path / "c", tokenizer, TINY_CORPUS, progress=False)
    store = BlockStore(tmp_path / "c")
    assert len(store) == meta.num_blocks >= len(DOCS)
    assert meta.num_documents == len(DOCS)
    assert store.column("block_id") == list(range(len(store)))
    assert {b.doc_id for b in store.take(range(len(store)))} == {d["id"] for d in DOCS}
    # Rebuilding the same input gives the same fingerprint; other settings give another.
    again = build_corpus([str(docs_file)], tmp_path / "c", tokenizer, TINY_CORPUS, progress=False)
    assert again.fingerprint == meta.fingerprint
    other = build_corpus([str(docs_file)], tmp_path / "c", tokenizer, CorpusConfig(64, 8), progress=False)
    assert other.fingerprint != meta.fingerprint
    assert len(list((tmp_path / "c").glob("blocks-*.arrow"))) == 1  # the replaced blocks file is gone


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ('{"id": "x", "title": "T", "text": ', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"id": "x", "title": "T"}', "missing key"),
        ('{"id": "x", "title": "T", "text": "   "}', "empty text"),
        ('{"id": "x", "title": 3, "text": "body"}', "'title' must be a string"),
        ('{"id": "paris", "title": "T", "text": "duplicate id"}', "duplicate document id"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, tokenizer, bad_line, reason):
    good = [json.dumps(d) for d in DOCS]
    path = _write_lines(tmp_path / "in.jsonl", good[:2] + [bad_line] + good[2:])
    with pytest.raises(CorpusError, match=reason) as caught:
        build_corpus([str(path)], tmp_path / "c", tokenizer, TINY_CORPUS, progress=False)
    assert str(path) in str(caught.value)
    if reason != "duplicate document id":
        assert f"{path}:3:" in str(caught.value)
    assert not (tmp_path / "c" / "meta.json").exists()  # nothing half-built is left behind as a corpus
    # --skip-bad: the bad record is skipped and counted, the rest is kept.
    meta = build_corpus([str(path)], tmp_path / "c", tokenizer, TINY_CORPUS, skip_bad=True, progress=False)
    assert meta.skipped_records == 1 and meta.num_documents == len(DOCS)


def test_failed_rebuild_keeps_previous_corpus(tmp_path, docs_file, tokenizer):
    first = build_corpus([str(docs_file)], tmp_path / "c", tokenizer, TINY_CORPUS, progress=False)
    bad = _write_lines(tmp_path / "bad.jsonl", ['{"id": 1, "title": "T", "text": "fine"}', "{oops"])
    with pytest.raises(CorpusError):
        build_corpus([str(bad)], tmp_path / "c", tokenizer, TINY_CORPUS, progress=False)
    store = BlockStore(tmp_path / "c")
    assert store.fingerprint == first.fingerprint and len(store) == first.num_blocks
    assert not list((tmp_path / "c").glob("*.partial*"))


def test_gzip_input_and_unknown_inputs(tmp_path, tokenizer):
    path = tmp_path / "in.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps(DOCS[0]) + "\n\n" + json.dumps(DOCS[1]) + "\n")
    assert [d.id for d in read_documents(str(path), False, BadRecords())] == ["paris", "tokyo"]
    with pytest.raises(CorpusError, match="no such file"):
        list(read_documents(str(tmp_path / "missing.jsonl"), False, BadRecords()))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CorpusError, match="unknown input format"):
        list(read_documents(str(tmp_path / "notes.txt"), False, BadRecords()))
    (tmp_path / "binary.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(CorpusError, match="cannot be read"):
        list(read_documents(str(tmp_path / "binary.jsonl.gz"), False, BadRecords()))


def test_refuses_to_write_into_a_foreign_folder(tmp_path, docs_file, tokenizer):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError):
        build_corpus([str(docs_file)], tmp_path / "mine", tokenizer, TINY_CORPUS, progress=False)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_squad_zip_matches_shared_paragraphs():
    docs = list(read_documents(str(SHARED_DATA / "raw" / "squad-dev-v1.1.json.zip"), False, BadRecords()))
    with gzip.open(SHARED_DATA / "corpus" / "squad_dev_paragraphs.jsonl.gz", "rt") as handle:
        shared = [json.loads(line) for line in handle]
    assert len(docs) == len(shared) == 2067
    assert [(d.id, d.title, d.text) for d in docs[:50]] == [(s["id"], s["title"], s["text"]) for s in shared[:50]]


def test_squad_json_and_bad_squad(tmp_path):
    data = {
        "version": "1.1",
        "data": [{"title": "Some_Article", "paragraphs": [{"context": "Text one."}, {"context": ""}]}],
    }
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CorpusError, match="article 0 paragraph 1"):
        list(read_documents(str(path), False, BadRecords()))
    bad = BadRecords()
    docs = list(read_documents(str(path), True, bad))
    assert [(d.id, d.title) for d in docs] == [("squad:0:0", "Some Article")] and bad.count == 1
    archive = tmp_path / "two.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("a.json", "{}")
        z.writestr("b.json", "{}")
    with pytest.raises(CorpusError, match="exactly one"):
        list(read_documents(str(archive), False, BadRecords()))
