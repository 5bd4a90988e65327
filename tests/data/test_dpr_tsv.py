"""DPR's passage TSV (psgs_w100.tsv: `id<TAB>text<TAB>title`) as a corpus input: read as DPR reads it (csv,
delimiter TAB, "" for a quote inside a quoted field), streamed line by line, bad lines named by file and line."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re

import pytest

from realm.config import CorpusConfig
from realm.data.blocks import build_corpus
from realm.data.sources import BadRecords, CorpusError, Document, SeenIds, read_documents

# Lines as DPR's psgs_w100.tsv holds them: the header, then passages whose text csv quoted (it holds a quote)
DPR_LINES = [
    "id\ttext\ttitle",
    '1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet, high priest, and the brother of Moses."\tAaron',
    "2\tGod in Judaism is conceived of as the sole creator of the universe.\tGod in Judaism",
    '3\t"The title ""Tab\tinside"" is kept whole inside quotes."\t"Quoted ""Title"""',
]


def _write(path, lines: list[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


@pytest.mark.parametrize("name", ["psgs.tsv", "psgs.tsv.gz"])
def test_passages_read_as_dpr_reads_them(tmp_path, name):
    path = tmp_path / name
    _write(path, DPR_LINES)
    docs = list(read_documents(str(path), False, BadRecords()))
    # DPR's own reading: csv.reader(delimiter="\t"), the header row skipped
    rows = [row for row in csv.reader(io.StringIO("\n".join(DPR_LINES)), delimiter="\t") if row[0] != "id"]
    assert docs == [Document(doc_id, title, text) for doc_id, text, title in rows]
    assert docs[0].text == 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses.'
    assert docs[2] == Document("3", 'Quoted "Title"', 'The title "Tab\tinside" is kept whole inside quotes.')


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("4\tonly two fields", "expected 3 tab-separated fields (id, text, title), got 2"),
        ('5\t"a quote left open\tTitle', "malformed TSV"),
        ("\tno id\tTitle", "'id' must be a non-empty string"),
        ("6\t \tTitle", "document '6' has empty text"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line_and_skip_bad_counts_it(tmp_path, line, why):
    path = tmp_path / "bad.tsv"
    _write(path, [*DPR_LINES[:3], line, DPR_LINES[1].replace("1", "7", 1)])
    with pytest.raises(CorpusError, match=rf"{re.escape(str(path))}:4: {re.escape(why)}"):
        list(read_documents(str(path), False, BadRecords()))
    bad = BadRecords()
    assert [d.id for d in read_documents(str(path), True, bad)] == ["1", "2", "7"] and bad.count == 1


def test_a_file_without_the_header_reads_too(tmp_path):
    path = tmp_path / "no_header.tsv"
    _write(path, DPR_LINES[1:])
    assert [d.id for d in read_documents(str(path), False, BadRecords())] == ["1", "2", "3"]


def test_a_tsv_corpus_equals_the_same_passages_as_jsonl(tmp_path, tokenizer):
    config = CorpusConfig(max_block_tokens=48, max_title_tokens=8)
    tsv, jsonl = tmp_path / "psgs.tsv", tmp_path / "psgs.jsonl"
    _write(tsv, DPR_LINES)
    docs = read_documents(str(tsv), False, BadRecords())
    jsonl.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    from_tsv = build_corpus([str(tsv)], tmp_path / "a", tokenizer, config, progress=False)
    from_jsonl = build_corpus([str(jsonl)], tmp_path / "b", tokenizer, config, progress=False)
    assert from_tsv.fingerprint == from_jsonl.fingerprint and from_tsv.num_blocks == from_jsonl.num_blocks >= 3


def test_numeric_ids_are_bits_and_the_rest_a_set():
    seen = SeenIds()
    assert seen.add("21015324") and seen.add("1") and seen.add("0") and seen.add("vital:3")
    assert not seen.add("21015324") and not seen.add("0") and not seen.add("vital:3")
    assert seen.add("01") and not seen.add("01")  # "01" is not the number 1: a different id, kept as a string
    assert seen.add("300000000") and not seen.add("300000000")  # beyond the bitmap's range: a string
    assert len(seen.bits) == 21015324 // 8 + 1 and seen.others == {"vital:3", "01", "300000000"}
