"""Open-QA pairs and answer matching: exact match, and whether a text holds an answer.

Exact match is ORQA's `eval_utils` (rule "orqa", the default: REALM's open-QA figures are scored with it): NFD,
lowercase, delete `string.punctuation` (ASCII punctuation only), delete the articles a/an/the, collapse whitespace,
compare. Rule "squad" is the official SQuAD script, the same without the NFD step (an NFC and an NFD "Frédéric"
then differ). `*.regex.jsonl` answers are regular expressions
(CuratedTrec), scored as ORQA's `regex_match_score`: compiled with IGNORECASE | UNICODE | MULTILINE and matched
at the *start* of the raw prediction (`re.match`, so "Atlantic Ocean" matches `Atlantic`); a pattern that does
not compile is reported and never matches.

Whether a text holds an answer (recall@k, the reader's span labels, ORQA's early-update beam) is DrQA's
`has_answer`, which ORQA uses: text and answer are NFD-normalised and tokenised the same way, a token being a
run of letters, digits and marks or any other single non-space character, so punctuation is a token of its own;
a match is a run of whole lowercased tokens ("Chopin's" holds "Chopin", "1997–98" holds "1997", "New York-based"
holds "New York"). Articles and punctuation in the answer count, as in DrQA. A regex answer is searched anywhere
in the NFD text with the NFD pattern (DrQA normalises both), so "Niña" matches however either is composed.

A question may name the article it was written about (`"title"`); `tuning_split` holds out whole articles, so no
setting is chosen on questions about an article that training saw.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import string
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial, reduce
from pathlib import Path
from typing import Literal

import numpy as np
import regex

from realm.common.io import write_atomic
from realm.data.question_sets import question_file
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
    article: str | None = None  # the title of the article the question was written about, where the file names it
    # the gold paragraph and each answer's character offset in it, where the file gives them (SQuAD's `context` and
    # `answer_start`): the reading stage reads them (recipes/reading.py). None: an offset that does not match
    context: str | None = None
    answer_starts: tuple[int | None, ...] | None = None
    where: str | None = field(default=None, compare=False)  # "file:line" it was read from

    @property
    def answer_chars(self) -> list[tuple[int, int]]:
        """(start, end) of each answer in `context` whose offset matches it."""
        starts = self.answer_starts or ()
        return [(s, s + len(a)) for a, s in zip(self.answers, starts) if s is not None]


EXACT_MATCH_RULES: dict[str, Literal["NFD"] | None] = {
    "orqa": "NFD",
    "squad": None,
}  # the Unicode normal form each rule applies first
TUNING_SHARE = 5  # the tuning split holds out whole articles with at most one in this many training questions
TUNING_SEED = 0  # the article order of the tuning split: the same on every run of the same data


def normalize_answer(text: str, rule: str = "orqa") -> str:
    """The exact-match normaliser of `rule` (EXACT_MATCH_RULES): its Unicode form, lowercase, no ASCII punctuation,
    no articles, whitespace collapsed."""
    if form := EXACT_MATCH_RULES[rule]:
        text = unicodedata.normalize(form, text)
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


# a backslash escaping a non-ASCII character (CuratedTrec writes "Ni\\ña"): NFD would leave it escaping the base
# letter ("\\n" + a combining tilde: a newline), so it goes first; an escaped backslash before it stays
_ESCAPED_NON_ASCII = re.compile(r"(?<!\\)((?:\\\\)*)\\([^\x00-\x7f])")


def _nfd_regexes(example: QAExample) -> list[re.Pattern]:
    """The example's answer patterns, NFD-normalised as the text they search is (DrQA normalises the pattern too),
    those that compile. An escaped non-ASCII letter is that letter in Python's `re`, so unescaping it first keeps
    the pattern's meaning."""
    patterns = (unicodedata.normalize("NFD", _ESCAPED_NON_ASCII.sub(r"\1\2", p)) for p in example.answers)
    return [rx for p in patterns if (rx := _compile(p)) is not None]


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
        return any(rx.search(raw) for rx in _nfd_regexes(example))
    tokens = _text_tokens(text)
    return any(run and _contains_run(tokens, run) for run in map(answer_tokens, example.answers))


class AnswerBlocks:
    """Which blocks hold a question's answer (`has_answer`), looked up in an index of each block's answer tokens
    instead of tested one retrieved block at a time: the same labels, at a cost that does not grow with the
    retrieval beam (ORQA's early update labels 5,000 blocks a question). The blocks holding every token of an
    answer are tested with `has_answer`'s own run match. Regex answers have no tokens to look up: `holding` is None
    for them and each block is tested."""

    def __init__(self, bodies: Sequence[str]):
        vocabulary: dict[str, int] = {}
        tokens, blocks = [], []  # one (token, block) pair for each distinct token of a block
        for block, body in enumerate(bodies):
            distinct = {vocabulary.setdefault(token, len(vocabulary)) for token in _text_tokens(body)}
            tokens.append(np.fromiter(distinct, dtype=np.int32, count=len(distinct)))
            blocks.append(np.full(len(distinct), block, dtype=np.int32))
        token_of = np.concatenate(tokens) if tokens else np.empty(0, dtype=np.int32)
        order = np.argsort(token_of, kind="stable")  # blocks stay sorted within a token
        self.blocks = np.concatenate(blocks)[order] if blocks else np.empty(0, dtype=np.int32)
        self.starts = np.searchsorted(token_of[order], np.arange(len(vocabulary) + 1))  # token t: starts[t]:starts[t+1]
        self.vocabulary, self.bodies = vocabulary, bodies

    def _postings(self, token: str) -> np.ndarray | None:
        t = self.vocabulary.get(token)
        return None if t is None else self.blocks[self.starts[t] : self.starts[t + 1]]

    def holding(self, example: QAExample) -> np.ndarray | None:
        """The sorted ids of the blocks whose body holds an answer of `example`; None for regex answers."""
        if example.regex:
            return None
        found: set[int] = set()
        for run in {answer_tokens(answer) for answer in example.answers}:
            postings = [p for token in set(run) if (p := self._postings(token)) is not None]
            if not run or len(postings) < len(set(run)):  # empty, or a token no block has
                continue
            candidates = reduce(np.intersect1d, sorted(postings, key=len))
            found.update(b for b in candidates.tolist() if _contains_run(_text_tokens(self.bodies[b]), run))
        return np.array(sorted(found), dtype=np.int64)


def span_matcher(example: QAExample) -> Callable[[str], bool]:
    """`is_answer_span` for one example, its answers normalised once (a block's many spans are each checked)."""
    if example.regex:
        patterns = _nfd_regexes(example)
        return lambda text: any(rx.fullmatch(unicodedata.normalize("NFD", text).strip()) for rx in patterns)
    answers = {normalize_answer(answer) for answer in example.answers}
    return lambda text: normalize_answer(text) in answers


def is_exact_match(prediction: str, example: QAExample, rule: str = "orqa") -> bool:
    """Exact match after `rule`'s normalisation; regex answers: ORQA's `regex_match_score`, a match at the start
    of the raw prediction."""
    if example.regex:
        return any((rx := _compile(pattern)) is not None and rx.match(prediction) for pattern in example.answers)
    prediction = normalize_answer(prediction, rule)
    return any(prediction == normalize_answer(answer, rule) for answer in example.answers)


def is_answer_span(text: str, example: QAExample) -> bool:
    """Training label of a span: exact match, but a regex answer must match the whole span. Stricter than the
    scoring's prefix match, so the reader learns where an answer ends ("1685", not "1685, and died")."""
    return span_matcher(example)(text)


def load_qa(path: str | Path, articles: dict[str, str] | None = None) -> list[QAExample]:
    """`{"question": str, "answer": [str, ...]}` per line, optionally `"title"`: the question's article;
    `*.regex.jsonl` marks regex answers. `path`: a file, or a named question set (question_sets.py: written on
    first use). `articles`: question -> article title for a file that names none (`sources.squad_question_titles`)."""
    given = str(path)  # a record names a line by it: a named set's name, not this machine's cache path
    path = question_file(path)
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
                article = record.get("title")
                if article is not None and not isinstance(article, str):
                    raise ValueError(f"'title' must be a string, got {type(article).__name__}")
                context, starts = _context_and_starts(record, answers, regex)
                for pattern in answers if regex else ():
                    if _compile(pattern) is None:
                        log.warning(
                            "%s:%d: answer regex %r does not compile; it will never match", path, lineno, pattern
                        )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: bad QA record: {err!r}") from err
            question = question.strip()
            article = article or (articles or {}).get(question)
            where = f"{given}:{lineno}"
            if starts is not None and None in starts:
                log.warning("%s: an answer_start does not match its context; that answer is found by its text", where)
            examples.append(QAExample(question, tuple(answers), regex, article, context, starts, where))
    if not examples:
        raise ValueError(f"{path}: no QA examples")
    return examples


def _context_and_starts(
    record: dict, answers: list[str], regex: bool
) -> tuple[str | None, tuple[int | None, ...] | None]:
    """A record's optional `context` and `answer_start` (one offset per answer, SQuAD's): ValueError where they are
    malformed; an offset whose text is not its answer's becomes None (counted by the reading stage)."""
    context, starts = record.get("context"), record.get("answer_start")
    if context is None:
        if starts is not None:
            raise ValueError("'answer_start' needs a 'context'")
        return None, None
    if not isinstance(context, str):
        raise ValueError(f"'context' must be a string, got {type(context).__name__}")
    if starts is None or regex:
        return context, None
    if isinstance(starts, int):
        starts = [starts]
    if not isinstance(starts, list) or len(starts) != len(answers) or not all(type(s) is int for s in starts):
        raise ValueError("'answer_start' must be a list of integers, one for each answer")
    return context, tuple(s if s >= 0 and context[s : s + len(a)] == a else None for a, s in zip(answers, starts))


def tuning_split(examples: Sequence[QAExample]) -> tuple[list[QAExample], list[QAExample]]:
    """(what trains, the tuning split), each in file order: whole articles, taken in the order of a seeded hash of
    their title while they fit in a TUNING_SHARE-th of the questions. A question whose file names no article is
    an article of its own. Settings are chosen on the tuning split, never on the sets a run reports."""
    held = held_out_articles(examples, len(examples) // TUNING_SHARE)
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def held_out_articles(examples: Sequence[QAExample], room: int) -> set[int]:
    """The indices of whole articles, taken in the order of a seeded hash of their title while they fit in `room`
    questions; a question whose file names no article is an article of its own."""
    articles: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        articles.setdefault(example.article or f"question: {example.question}", []).append(i)
    order = sorted(articles, key=lambda a: hashlib.sha256(f"{TUNING_SEED}:{a}".encode()).hexdigest())
    held: set[int] = set()
    for article in order:
        if len(articles[article]) <= room:
            held.update(articles[article])
            room -= len(articles[article])
    return held


def split_qa_file(path: str | Path, dev_fraction: float, out_dir: str | Path) -> tuple[Path, Path, int, int]:
    """Split a QA file into train and dev parts, lines copied as they are: dev holds `dev_fraction` of the questions
    (as near as whole articles allow), whole articles where the questions name theirs (`title`), else single
    questions, chosen by a hash of each (so the split never depends on line order). Writes out_dir/train.jsonl and
    out_dir/dev.jsonl (`.regex.jsonl` for regex answers); returns the two paths and their sizes."""
    if not 0 < dev_fraction < 1:
        raise ValueError(f"--dev-fraction must be between 0 and 1, not {dev_fraction}")
    path, out_dir = Path(path), Path(out_dir)
    examples = load_qa(path)  # validates every line first, naming the bad one
    suffix = ".regex.jsonl" if examples[0].regex else ".jsonl"
    with open_text(path) as lines:
        rows = [line.rstrip("\n") + "\n" for line in lines if line.strip()]
    dev = held_out_articles(examples, round(dev_fraction * len(examples)))
    parts = {
        "train": [r for i, r in enumerate(rows) if i not in dev],
        "dev": [r for i, r in enumerate(rows) if i in dev],
    }
    written = []
    for name, rows in parts.items():
        if not rows:
            raise ValueError(f"{path}: the {name} part would be empty; choose another --dev-fraction")
        target = out_dir / f"{name}{suffix}"
        write_atomic(target, partial(Path.write_text, data="".join(rows)))
        written.append(target)
    return written[0], written[1], len(parts["train"]), len(parts["dev"])
