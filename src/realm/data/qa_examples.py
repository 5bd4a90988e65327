"""Open-QA pairs and answer matching: exact match, and whether a text holds an answer.

Exact match is the official SQuAD script's: lowercase, delete `string.punctuation` (ASCII punctuation only),
delete the articles a/an/the, collapse whitespace, compare. `*.regex.jsonl` answers are regular expressions
(CuratedTrec), scored as ORQA's `regex_match_score`: compiled with IGNORECASE | UNICODE | MULTILINE and matched
at the *start* of the raw prediction (`re.match`, so "Atlantic Ocean" matches `Atlantic`); a pattern that does
not compile is reported and never matches.

Whether a text holds an answer (recall@k, the reader's span labels, ORQA's early-update beam) is DrQA's
`has_answer`, which ORQA uses: text and answer are NFD-normalised and tokenised the same way, a token being a
run of letters, digits and marks or any other single non-space character, so punctuation is a token of its own;
a match is a run of whole lowercased tokens ("Chopin's" holds "Chopin", "1997–98" holds "1997", "New York-based"
holds "New York"). Articles and punctuation in the answer count, as in DrQA. A regex answer is searched anywhere
in the NFD text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import string
import unicodedata
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import regex

from realm.common.io import write_atomic
from realm.data.sources import open_text

log = logging.getLogger(__name__)


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# DrQA's SimpleTokenizer: a run of letters, digits and combining marks, or one other non-space character
_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.UNICODE)


@dataclass(frozen=True)
class QAExample:
    question: str
    answers: tuple[str, ...]
    regex: bool = False  # answers are regular expressions


def normalize_answer(text: str) -> str:
    """The official SQuAD normaliser: lowercase, no ASCII punctuation, no articles, whitespace collapsed."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def answer_tokens(text: str) -> tuple[str, ...]:
    """DrQA's uncased tokens of the NFD text: word runs and single punctuation characters."""
    return tuple(token.lower() for token in _TOKEN.findall(unicodedata.normalize("NFD", text)))


@lru_cache(maxsize=65536)
def _compile(pattern: str) -> re.Pattern | None:
    """Compiled answer regex, or None for a broken one (it then never matches, as in DrQA/ORQA)."""
    try:
        return re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error:
        return None


@lru_cache(maxsize=32768)
def _text_tokens(text: str) -> tuple[str, ...]:
    """answer_tokens of a block, cached: training checks the same blocks against many questions."""
    return answer_tokens(text)


def _contains_run(tokens: tuple[str, ...], run: tuple[str, ...]) -> bool:
    n = len(run)
    return any(tokens[i : i + n] == run for i in range(len(tokens) - n + 1) if tokens[i] == run[0])


def has_answer(text: str, example: QAExample) -> bool:
    """Does `text` hold a reference answer: DrQA's `has_answer` (a run of whole tokens, module doc), or for regex
    answers a match anywhere in the NFD text?"""
    if example.regex:
        raw = unicodedata.normalize("NFD", text)
        return any((rx := _compile(pattern)) is not None and rx.search(raw) for pattern in example.answers)
    tokens = _text_tokens(text)
    return any(run and _contains_run(tokens, run) for run in map(answer_tokens, example.answers))


def is_exact_match(prediction: str, example: QAExample) -> bool:
    """Exact match after normalisation; regex answers: ORQA's `regex_match_score`, a match at the start of the
    raw prediction."""
    if example.regex:
        return any((rx := _compile(pattern)) is not None and rx.match(prediction) for pattern in example.answers)
    prediction = normalize_answer(prediction)
    return any(prediction == normalize_answer(answer) for answer in example.answers)


def is_answer_span(text: str, example: QAExample) -> bool:
    """Training label of a span: exact match, but a regex answer must match the whole span. Stricter than the
    scoring's prefix match, so the reader learns where an answer ends ("1685", not "1685, and died")."""
    if example.regex:
        raw = unicodedata.normalize("NFD", text).strip()
        return any((rx := _compile(pattern)) is not None and rx.fullmatch(raw) for pattern in example.answers)
    return is_exact_match(text, example)


def load_qa(path: str | Path) -> list[QAExample]:
    """`{"question": str, "answer": [str, ...]}` per line; `*.regex.jsonl` marks regex answers."""
    path = Path(path)
    regex = path.name.endswith((".regex.jsonl", ".regex.jsonl.gz"))
    examples = []
    with open_text(path) as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                question, answers = record["question"], record["answer"]
                if isinstance(answers, str):
                    answers = [answers]
                if (
                    not isinstance(question, str)
                    or not question.strip()
                    or not answers
                    or not all(isinstance(a, str) for a in answers)
                ):
                    raise ValueError("need a non-empty 'question' string and a list of 'answer' strings")
                for pattern in answers if regex else ():
                    if _compile(pattern) is None:
                        log.warning(
                            "%s:%d: answer regex %r does not compile; it will never match", path, lineno, pattern
                        )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: bad QA record: {err!r}") from err
            examples.append(QAExample(question.strip(), tuple(answers), regex))
    if not examples:
        raise ValueError(f"{path}: no QA examples")
    return examples


def split_qa_file(path: str | Path, dev_fraction: float, out_dir: str | Path) -> tuple[Path, Path, int, int]:
    """Split a QA file into train and dev parts by a hash of each question (so the split never depends on line
    order and the same question always lands on the same side), lines copied as they are. Writes
    out_dir/train.jsonl and out_dir/dev.jsonl (`.regex.jsonl` for regex answers); returns the two paths and
    their sizes."""
    if not 0 < dev_fraction < 1:
        raise ValueError(f"--dev-fraction must be between 0 and 1, not {dev_fraction}")
    path, out_dir = Path(path), Path(out_dir)
    examples = load_qa(path)  # validates every line first, naming the bad one
    suffix = ".regex.jsonl" if examples[0].regex else ".jsonl"
    parts: dict[str, list[str]] = {"train": [], "dev": []}
    with open_text(path) as lines:
        for line in lines:
            if line.strip():
                question = json.loads(line)["question"].strip()
                bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 2**32
                parts["dev" if bucket < dev_fraction else "train"].append(line.rstrip("\n") + "\n")
    written = []
    for name, rows in parts.items():
        if not rows:
            raise ValueError(f"{path}: the {name} part would be empty; choose another --dev-fraction")
        target = out_dir / f"{name}{suffix}"
        write_atomic(target, partial(Path.write_text, data="".join(rows)))
        written.append(target)
    return written[0], written[1], len(parts["train"]), len(parts["dev"])
