"""Open-QA question sets by name, as pyserini's users name topics: SQuAD-open from the SQuAD v1.1 dev file shipped
with the package, and the paper's benchmarks (NQ-open, WebQuestions, CuratedTrec) and their peers from the
Anserini jar inside the `pyserini==0.20.0` wheel (fetched once from PyPI; later releases download the topics at run
time and cannot serve offline). Each set is written once, atomically, as the JSONL `load_qa` reads, under
`$REALM_CACHE/question-sets/`; each jar file is pinned by its sha256 and its count of questions.

The paper's Table 1 (test EM, `PAPER_ROWS`) reports NQ-open, WebQuestions and CuratedTrec; a run that evaluates on
one of them puts those rows beside its own."""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from realm.common.io import write_atomic
from realm.data.sources import SQUAD_DEV_ZIP, cache_dir, download_wheel, load_squad_json

PYSERINI_WHEEL = "pyserini==0.20.0"
PYSERINI_JAR = "pyserini/resources/jars/anserini-0.20.0-fatjar.jar"
SHIPPED_FORMAT = "contexts"  # SQuAD-open training questions with their paragraph and answer offsets
SQUAD_DEV_SHA256 = "6cf38c56fc7341bab8a5132f205dd7198148a6be9073ccd8ef07d55ca73b09b7"
# SQuAD-open dev: the questions of these six articles of SQuAD v1.1 dev (1,496); training: the other 42 (9,074).
# The split every record of the project has used (docs/runs), first drawn by a hash of the article titles.
SQUAD_OPEN_DEV_ARTICLES = frozenset(
    {"American_Broadcasting_Company", "Geology", "Martin_Luther", "Prime_number", "Private_school", "Yuan_dynasty"}
)


class QuestionSetError(ValueError):
    """A named set that cannot be had: unknown name, registry unreachable, or a file that is not the pinned one."""


@dataclass(frozen=True)
class QuestionSet:
    name: str
    questions: int
    what: str
    member: str | None = None  # its file in the Anserini jar; None: built from the shipped SQuAD file
    sha256: str | None = None
    regex: bool = False  # answers are regular expressions (CuratedTrec)
    paper: str | None = None  # the column of the paper's Table 1 this set is

    @property
    def filename(self) -> str:
        if self.member is None:  # the shipped sets in the form that carries paragraphs: a name of its own, so that a
            return f"{self.name}.{SHIPPED_FORMAT}.jsonl"  # cache written without them is never read as if it had them
        return f"{self.name}.regex.jsonl" if self.regex else f"{self.name}.jsonl"


def _jar(name: str) -> str:
    return f"topics-and-qrels/topics.dpr.{name}.txt"


QUESTION_SETS = {
    s.name: s
    for s in (
        QuestionSet("squad-open-train", 9074, "SQuAD v1.1 dev questions of 42 articles (shipped): for fine-tuning"),
        QuestionSet("squad-open-dev", 1496, "SQuAD v1.1 dev questions of the 6 other articles (shipped)"),
        QuestionSet(
            "nq-dev",
            8757,
            "NQ-open dev (DPR's split)",
            _jar("nq.dev"),
            "95ab55300a28f079302502da5fe48b0e4ced4b25e111fa03d08cb1ba361834c1",
        ),
        QuestionSet(
            "nq-test",
            3610,
            "NQ-open test: the set REALM reports",
            _jar("nq.test"),
            "480cfe1d5b81bedd879ffe7c6a9ec294d317811e71c44daabfe242ca9d719d46",
            paper="NQ",
        ),
        QuestionSet(
            "wq-test",
            2032,
            "WebQuestions test",
            _jar("wq.test"),
            "b5048c733f94c2d7cfa7fc63e9ba00d70b48fd3d04f0d7de362558e12057a61b",
            paper="WQ",
        ),
        QuestionSet(
            "curatedtrec-test",
            694,
            "CuratedTrec test (answers are regular expressions)",
            _jar("curated.test"),
            "0545ad16b1ddc5379e3938a3bfd3237c02f0bfe05ef4a2a227957f65c963592b",
            regex=True,
            paper="CT",
        ),
        QuestionSet(
            "trivia-dev",
            8837,
            "TriviaQA dev (unfiltered, DPR's split)",
            _jar("trivia.dev"),
            "79e7ea851bb5ca6ebbfd6c760d032064d324166d46b8ffaf70e0fb733186ed2a",
        ),
        QuestionSet(
            "trivia-test",
            11313,
            "TriviaQA test (unfiltered, DPR's split)",
            _jar("trivia.test"),
            "041ed9ddd2977c7fe452d290cf60e1f7e0a803977b0f912e234d218261c10e57",
        ),
        QuestionSet(
            "squad-test",
            10570,
            "SQuAD-open test: all of SQuAD v1.1 dev, as DPR evaluates it",
            _jar("squad.test"),
            "380c71fadfe5230412b170d87e2373f3bb90027b6121afd21be92a60cf7b2af8",
        ),
    )
}

# `realm pipeline --qa-set NAME`: (what fine-tuning trains on, what is evaluated). The jar has no training split of
# WebQuestions or CuratedTrec: they fine-tune on NQ-open dev, the nearest questions a clone can have.
EXPERIMENTS = {
    "squad": ("squad-open-train", "squad-open-dev"),
    "nq": ("nq-dev", "nq-test"),
    "wq": ("nq-dev", "wq-test"),
    "curatedtrec": ("nq-dev", "curatedtrec-test"),
    "trivia": ("trivia-dev", "trivia-test"),
}

# The paper's Table 1: test EM on NQ-open / WebQuestions / CuratedTrec, with each system's size.
PAPER_ROWS = (
    ("BM25 + BERT (Lee et al., 2019)", {"NQ": 26.5, "WQ": 17.7, "CT": 21.3}, "110M", "Wikipedia (sparse retrieval)"),
    ("ORQA (Lee et al., 2019)", {"NQ": 33.3, "WQ": 36.4, "CT": 30.1}, "330M", "Wikipedia, 13M blocks"),
    ("REALM, pretrained on Wikipedia", {"NQ": 39.2, "WQ": 40.2, "CT": 46.8}, "330M", "Wikipedia, 13M blocks"),
    ("REALM, pretrained on CC-News", {"NQ": 40.4, "WQ": 40.7, "CT": 42.9}, "330M", "Wikipedia, 13M blocks"),
)


def question_set(name: str) -> QuestionSet:
    if name not in QUESTION_SETS:
        raise QuestionSetError(f"{name}: no such question set (named sets: {', '.join(QUESTION_SETS)})")
    return QUESTION_SETS[name]


def question_file(spec: str | Path) -> Path:
    """A QA file: the path given, or the named set's JSONL (written on first use)."""
    if str(spec) not in QUESTION_SETS:
        return Path(spec)
    chosen = question_set(str(spec))
    target = cache_dir() / "question-sets" / chosen.filename
    if not target.exists():
        if chosen.member is None:
            _write_squad_open()
        else:
            _write_from_pyserini()
    return target


def _write_squad_open() -> None:
    """SQuAD-open training and dev questions from the shipped file, each naming its article (so that held-out
    questions are whole articles); answers deduplicated in order, as the project's records have used them. The
    training questions also carry their paragraph (`context`) and each answer's character offset in it
    (`answer_start`, the first annotator's of each distinct answer): the reading stage reads the gold paragraph
    (recipes/reading.py). The dev questions carry neither: nothing that answers them may see their paragraph."""
    digest = hashlib.sha256(SQUAD_DEV_ZIP.read_bytes()).hexdigest()
    if digest != SQUAD_DEV_SHA256:
        raise QuestionSetError(f"{SQUAD_DEV_ZIP}: sha256 {digest}, expected {SQUAD_DEV_SHA256} (a damaged install)")
    rows: dict[str, list[str]] = {"squad-open-train": [], "squad-open-dev": []}
    for article in load_squad_json(SQUAD_DEV_ZIP)["data"]:
        part = "squad-open-dev" if article["title"] in SQUAD_OPEN_DEV_ARTICLES else "squad-open-train"
        title = article["title"].replace("_", " ").strip()
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                starts: dict[str, int] = {}
                for a in qa["answers"]:  # a stripped answer's offset moves past the whitespace it lost
                    starts.setdefault(a["text"].strip(), a["answer_start"] + len(a["text"]) - len(a["text"].lstrip()))
                record = {"question": qa["question"].strip(), "answer": list(starts), "title": title}
                if part == "squad-open-train":
                    record |= {"context": paragraph["context"], "answer_start": list(starts.values())}
                rows[part].append(json.dumps(record, ensure_ascii=False) + "\n")
    for name, lines in rows.items():
        _write_set(QUESTION_SETS[name], lines)


def _write_from_pyserini() -> None:
    """Every jar set at once (one 137 MB download): each file checked against its sha256 and its count."""
    folder = cache_dir() / "question-sets"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        with zipfile.ZipFile(download_wheel(PYSERINI_WHEEL, Path(tmp))) as wheel:
            write_jar_sets(wheel, PYSERINI_JAR)


def write_jar_sets(wheel: zipfile.ZipFile, jar_member: str, sets: tuple[QuestionSet, ...] | None = None) -> None:
    """Read each set's topics file out of the jar inside `wheel` (no Java) and write its JSONL."""
    chosen = sets or tuple(s for s in QUESTION_SETS.values() if s.member is not None)
    with zipfile.ZipFile(wheel.open(jar_member)) as jar:
        for s in chosen:
            assert s.member is not None
            raw = jar.read(s.member)
            digest = hashlib.sha256(raw).hexdigest()
            if digest != s.sha256:
                raise QuestionSetError(f"{PYSERINI_WHEEL}: {s.member} has sha256 {digest}, expected {s.sha256}")
            _write_set(s, topic_lines(raw.decode("utf-8"), f"{PYSERINI_WHEEL}:{s.member}"))


def topic_lines(text: str, where: str) -> list[str]:
    """A DPR topics file as JSONL lines: `question<TAB>['answer', ...]` (a CSV row; the answers a Python list
    literal, read with `ast.literal_eval`, never executed) or `{"question", "answer"}` JSON lines."""
    lines = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        try:
            if line.startswith("{"):
                record = json.loads(line)
                question, answers = record["question"], record["answer"]
            else:  # as DPR reads its qas files: csv with TAB, a quoted field's quotes doubled
                question, literal = next(csv.reader([line], delimiter="\t", strict=True))
                answers = ast.literal_eval(literal)
            if not isinstance(question, str) or not isinstance(answers, list) or not answers:
                raise ValueError("need a question and a non-empty list of answers")
            answers = list(dict.fromkeys(str(a) for a in answers))
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError, csv.Error) as err:
            raise QuestionSetError(f"{where}:{lineno}: not a question and its answers ({err})") from err
        lines.append(json.dumps({"question": question.strip(), "answer": answers}, ensure_ascii=False) + "\n")
    return lines


def _write_set(s: QuestionSet, lines: list[str]) -> None:
    if len(lines) != s.questions:
        raise QuestionSetError(f"{s.name}: {len(lines)} questions, expected {s.questions}")
    target = cache_dir() / "question-sets" / s.filename
    write_atomic(target, lambda tmp: tmp.write_text("".join(lines), encoding="utf-8"))
