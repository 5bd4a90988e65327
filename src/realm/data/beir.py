"""BEIR-format retrieval sets (Thakur et al. 2021): a folder with `corpus.jsonl`, `queries.jsonl` and
`qrels/<split>.tsv`, as BEIR's GenericDataLoader reads it.

    corpus.jsonl    {"_id": str, "title": str, "text": str, ...}   the documents (`realm corpus build DIR`, sources.py)
    queries.jsonl   {"_id": str, "text": str, ...}
    qrels/test.tsv  a header line, then query-id <TAB> corpus-id <TAB> score   (graded; 0: judged not relevant)

As in BEIR, the queries evaluated are those with at least one qrels line in the split. Any file may be gzipped
(`corpus.jsonl.gz`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from realm.data.sources import CorpusError, numbered_lines, plain_or_gzipped


@dataclass(frozen=True)
class BeirQueries:
    """The judged queries of one split, in the order of queries.jsonl, and their relevance judgements."""

    ids: list[str]
    texts: list[str]
    qrels: dict[str, dict[str, int]]  # query id -> corpus id -> graded relevance


def _lines(path: Path):
    for lineno, line, problem in numbered_lines(path):
        if line is None:
            raise CorpusError(f"{path}:{lineno}: {problem}")
        if line.strip():
            yield lineno, line


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for lineno, line in _lines(path):
        fields = line.rstrip("\r\n").split("\t")
        if lineno == 1 and fields[-1].strip().lower() == "score":  # BEIR's header: query-id corpus-id score
            continue
        if len(fields) != 3 or not fields[2].strip().lstrip("-").isdigit():
            raise CorpusError(
                f"{path}:{lineno}: expected query-id<TAB>corpus-id<TAB>integer score, got {line.strip()!r}"
            )
        qrels.setdefault(fields[0], {})[fields[1]] = int(fields[2])
    if not qrels:
        raise CorpusError(f"{path}: no relevance judgements")
    return qrels


def load_beir_queries(folder: str | Path, split: str = "test") -> BeirQueries:
    """The queries judged in `qrels/<split>.tsv`; a judged query missing from queries.jsonl is an error."""
    folder = Path(folder)
    queries_file, qrels_file = (
        plain_or_gzipped(folder, "queries.jsonl"),
        plain_or_gzipped(folder / "qrels", f"{split}.tsv"),
    )
    if not folder.is_dir() or queries_file is None or qrels_file is None:
        raise CorpusError(f"{folder}: not a BEIR folder with queries.jsonl and qrels/{split}.tsv")
    qrels = read_qrels(qrels_file)
    texts: dict[str, str] = {}
    for lineno, line in _lines(queries_file):
        try:
            record = json.loads(line)
            query_id, text = str(record["_id"]), record["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CorpusError(f"{queries_file}:{lineno}: expected a JSON object with _id and text ({err})") from err
        if not isinstance(text, str) or not text.strip():
            raise CorpusError(f"{queries_file}:{lineno}: query {query_id!r} has no text")
        if query_id in qrels:
            texts[query_id] = text
    missing = sorted(set(qrels) - set(texts))
    if missing:
        raise CorpusError(f"{qrels_file}: {len(missing)} judged queries are not in {queries_file}, e.g. {missing[0]!r}")
    return BeirQueries(list(texts), list(texts.values()), {query_id: qrels[query_id] for query_id in texts})
