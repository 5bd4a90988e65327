"""Open-QA pairs and answer matching: the spec's answer normalisation, exact match, answer-in-text.

Plain answers are compared after normalisation (lowercase, no punctuation, no articles, whitespace
collapsed). `*.regex.jsonl` answers are regular expressions (CuratedTrec), scored as ORQA's
`regex_match_score`: compiled with IGNORECASE | UNICODE | MULTILINE and matched at the *start* of the raw
prediction (`re.match`, so "Atlantic Ocean" matches `Atlantic`); a pattern that does not compile is reported
and never matches. Recall (does a block hold the answer) searches the NFD text anywhere, as DrQA does.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from realm.data.sources import open_text

log = logging.getLogger(__name__)


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


@dataclass(frozen=True)
class QAExample:
    question: str
    answers: tuple[str, ...]
    regex: bool = False  # answers are regular expressions


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFD", text).lower()
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


@lru_cache(maxsize=65536)
def _compile(pattern: str) -> re.Pattern | None:
    """Compiled answer regex, or None for a broken one (it then never matches, as in DrQA/ORQA)."""
    try:
        return re.compile(pattern, flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except re.error:
        return None


@lru_cache(maxsize=32768)
def _padded_normal_form(text: str) -> str:
    """Normalised block text, cached: training checks the same blocks against many questions."""
    return f" {normalize_answer(text)} "


def has_answer(text: str, example: QAExample) -> bool:
    """Does `text` contain a reference answer (as whole normalised tokens, or matching a regex)?"""
    if example.regex:
        raw = unicodedata.normalize("NFD", text)
        return any((rx := _compile(pattern)) is not None and rx.search(raw) for pattern in example.answers)
    padded = _padded_normal_form(text)
    return any(f" {answer} " in padded for answer in map(normalize_answer, example.answers) if answer)


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
                if not isinstance(question, str) or not question.strip() or not answers \
                        or not all(isinstance(a, str) for a in answers):
                    raise ValueError("need a non-empty 'question' string and a list of 'answer' strings")
                for pattern in answers if regex else ():
                    if _compile(pattern) is None:
                        log.warning("%s:%d: answer regex %r does not compile; it will never match", path, lineno, pattern)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: bad QA record: {err!r}") from err
            examples.append(QAExample(question.strip(), tuple(answers), regex))
    if not examples:
        raise ValueError(f"{path}: no QA examples")
    return examples
