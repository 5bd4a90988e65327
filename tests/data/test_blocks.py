"""Block splitting, corpus inputs and their failure modes, and the durable block store."""

from __future__ import annotations

import gzip
import json
import re
import zipfile
from pathlib import Path

import pytest
from conftest import DOCS, SQUAD_PARAGRAPHS_SHA256, TINY_CORPUS, dead_pid, documents_digest

from realm.config import CorpusConfig
from realm.data.blocks import META, BlockSplitter, BlockStore, build_corpus
from realm.data.sources import SQUAD_DEV_ZIP, BadRecords, Columns, CorpusError, Document, read_documents


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


def test_the_shipped_squad_zip_gives_the_paragraphs_every_record_used():
    """SQuAD v1.1 dev's 2,067 paragraphs, read from the zip shipped with the package: the project's dev corpus file
    `squad_dev_paragraphs.jsonl.gz`, which stripped the leading space six paragraphs have (ours keeps it)."""
    docs = list(read_documents(str(SQUAD_DEV_ZIP), False, BadRecords()))
    assert len(docs) == 2067 and docs[0].id == "squad:0:0" and docs[0].title == "Super Bowl 50"
    assert sum(d.text != d.text.strip() for d in docs) == 6
    assert documents_digest([[d.id, d.title, d.text.strip()] for d in docs]) == SQUAD_PARAGRAPHS_SHA256


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


def test_a_build_killed_before_its_first_commit_does_not_block_the_rerun(tmp_path, docs_file, tokenizer):
    """kill -9 during the first build leaves only unfinished files; the same command then builds the corpus."""
    out, dead = tmp_path / "c", dead_pid()
    out.mkdir()
    (out / f"blocks.arrow.partial-{dead}").write_bytes(b"half an Arrow file")
    (out / f".{META}.tmp-{dead}-x1y2.tmp").write_text("{")
    meta = build_corpus([str(docs_file)], out, tokenizer, TINY_CORPUS, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([META, f"blocks-{meta.fingerprint}.arrow"])
    # a live writer's unfinished file is its own: kept, and a folder holding only it is not taken over
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "blocks.arrow.partial-1").write_bytes(b"being written by pid 1")
    with pytest.raises(FileExistsError, match="not a corpus folder"):
        build_corpus([str(docs_file)], busy, tokenizer, TINY_CORPUS, progress=False)
    assert (busy / "blocks.arrow.partial-1").exists()
    # and leftovers beside a finished corpus go on the next build
    (out / f"blocks.arrow.partial-{dead}").write_bytes(b"half")
    build_corpus([str(docs_file)], out, tokenizer, TINY_CORPUS, progress=False)
    assert not (out / f"blocks.arrow.partial-{dead}").exists()


def test_a_build_killed_between_its_blocks_file_and_its_commit_does_not_block_the_rerun(tmp_path, docs_file, tokenizer):
    """kill -9 after the blocks file got its final name but before meta.json: the folder holds one uncommitted
    blocks file (the CI failure of 2026-11-22); the re-run takes it over and leaves exactly one corpus."""
    out = tmp_path / "c"
    out.mkdir()
    (out / "blocks-0123abcd.arrow").write_bytes(b"an uncommitted blocks file")
    meta = build_corpus([str(docs_file)], out, tokenizer, TINY_CORPUS, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([META, f"blocks-{meta.fingerprint}.arrow"])
    assert BlockStore(out).fingerprint == meta.fingerprint
    # beside a committed corpus, a stray blocks file from a killed rebuild goes on the next build too
    (out / "blocks-4567ef.arrow").write_bytes(b"left by a killed rebuild")
    build_corpus([str(docs_file)], out, tokenizer, TINY_CORPUS, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([META, f"blocks-{meta.fingerprint}.arrow"])


def test_corpus_out_must_be_a_folder(tmp_path, docs_file, tokenizer):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(FileExistsError, match="is a file"):
        build_corpus([str(docs_file)], tmp_path / "file", tokenizer, TINY_CORPUS, progress=False)


def _docs(n: int) -> bytes:
    return b"".join(
        json.dumps({"id": f"d{i}", "title": f"T{i}", "text": f"Document number {i} says something."}).encode() + b"\n"
        for i in range(n)
    )


def test_a_bad_byte_costs_one_line_and_is_named_by_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    lines = _docs(3).splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1].replace(b"something", b"caf\xe9") + lines[2])
    with pytest.raises(CorpusError, match=rf"{re.escape(str(path))}:2: not UTF-8 \(byte 0xe9 at column \d+\)"):
        list(read_documents(str(path), False, BadRecords()))
    bad = BadRecords()
    assert [d.id for d in read_documents(str(path), True, bad)] == ["d0", "d2"] and bad.count == 1


def test_a_byte_order_mark_opening_a_jsonl_file_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _docs(2))
    assert [d.id for d in read_documents(str(path), False, BadRecords())] == ["d0", "d1"]


def test_a_truncated_gzip_keeps_what_was_read_under_skip_bad_and_names_the_line_otherwise(tmp_path, caplog):
    whole = gzip.compress(_docs(2000))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorpusError, match=rf"{re.escape(str(path))}:\d+: the file ends early") as stopped:
        list(read_documents(str(path), False, BadRecords()))
    assert "--skip-bad" in str(stopped.value)
    bad = BadRecords()
    kept = list(read_documents(str(path), True, bad))
    assert 0 < len(kept) < 2000 and [d.id for d in kept] == [f"d{i}" for i in range(len(kept))]
    assert bad.count == 1 and f"keeping the {len(kept)} lines read" in caplog.text


def test_a_directory_as_input_says_so(tmp_path):
    with pytest.raises(CorpusError, match="is a directory"):
        list(read_documents(str(tmp_path), False, BadRecords()))


def _write_parquet(path: Path, rows: list[dict], row_group_size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def test_parquet_rows_stream_with_named_columns_and_bad_rows_named_by_number(tmp_path):
    rows = [{"page": i, "name": f"T{i}", "body": f"Document number {i} says something."} for i in range(10)]
    rows[6]["body"] = " "
    path = tmp_path / "wiki.parquet"
    _write_parquet(path, rows, row_group_size=4)  # three row groups: rows are numbered across them
    columns = Columns(id="page", title="name", text="body")
    with pytest.raises(CorpusError, match=rf"{re.escape(str(path))}:row 7: document 6 has empty text"):
        list(read_documents(str(path), False, BadRecords(), columns))
    bad = BadRecords()
    docs = list(read_documents(str(path), True, bad, columns))
    assert [d.id for d in docs] == [str(i) for i in range(10) if i != 6] and bad.count == 1
    assert docs[0] == Document("0", "T0", "Document number 0 says something.")
    with pytest.raises(
        CorpusError, match=r"no column\(s\) \['id', 'title', 'text'\]; it has \['page', 'name', 'body'\]"
    ):
        list(read_documents(str(path), False, BadRecords()))
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet\n")
    with pytest.raises(CorpusError, match=rf"{re.escape(str(fake))}: cannot be read as Parquet"):
        list(read_documents(str(fake), False, BadRecords()))


def test_a_parquet_corpus_equals_the_same_documents_as_jsonl(tmp_path, tokenizer):
    config = CorpusConfig(max_block_tokens=48, max_title_tokens=8)
    docs = [{"id": f"d{i}", "title": f"Title {i}", "text": LONG_TEXT if i % 2 else "Short text."} for i in range(6)]
    jsonl, parquet = tmp_path / "docs.jsonl", tmp_path / "docs.parquet"
    jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs))
    _write_parquet(parquet, docs, row_group_size=2)
    from_jsonl = build_corpus([str(jsonl)], tmp_path / "a", tokenizer, config, progress=False)
    from_parquet = build_corpus([str(parquet)], tmp_path / "b", tokenizer, config, progress=False)
    assert from_parquet.fingerprint == from_jsonl.fingerprint and from_parquet.num_blocks == from_jsonl.num_blocks
