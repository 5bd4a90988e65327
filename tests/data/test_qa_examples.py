"""Answer normalisation, answer matching (plain and regex), QA file loading, recall@k."""

from __future__ import annotations

import json
import re
import unicodedata

import pytest

from realm.data.qa_examples import (
    AnswerBlocks,
    QAExample,
    has_answer,
    is_answer_span,
    is_exact_match,
    load_qa,
    normalize_answer,
    tuning_split,
)
from realm.data.question_sets import question_file
from realm.data.sources import SQUAD_DEV_ZIP, squad_question_titles
from realm.eval.retrieval import recall_at_k
from realm.index.search import SearchHit


@pytest.mark.parametrize(
    "raw, normalised",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a  cat, an owl;  THE end. ", "cat owl end"),
        ("Café", "café"),  # the official script compares the strings as they are: no Unicode normalisation
        ("“Quoted” — dash", "“quoted” — dash"),  # only string.punctuation (ASCII) goes, as in the official script
        ("theatre", "theatre"),  # articles only as whole words
        ("24–10", "24–10"),
        ("U.S.-based", "usbased"),
    ],
)
def test_normalize_answer_is_the_official_squad_script(raw, normalised):
    assert normalize_answer(raw, "squad") == normalised


def test_the_default_exact_match_is_orqas_with_nfd_and_the_squad_rule_is_without():
    """ORQA's eval_utils.normalize_answer NFD-normalises first, the official SQuAD script does not: an NFC and an
    NFD "Frédéric" are one answer under the first rule and two under the second."""
    composed, decomposed = unicodedata.normalize("NFC", "Frédéric"), unicodedata.normalize("NFD", "Frédéric")
    assert composed != decomposed
    assert is_exact_match(composed, QAExample("q", (decomposed,)))  # rule "orqa", the default
    assert is_exact_match(composed, QAExample("q", (decomposed,)), "orqa")
    assert not is_exact_match(composed, QAExample("q", (decomposed,)), "squad")
    assert normalize_answer("The Café", "orqa") == unicodedata.normalize("NFD", "café")


@pytest.mark.parametrize(
    "text, answer",
    [
        ("Chopin's nocturnes", "Chopin"),
        ("the 1997–98 season", "1997"),
        ("a New York-based company", "New York"),
        ("he moved between Warsaw/Paris often", "Paris"),
        ("(Frédéric Chopin)", "Frédéric Chopin"),
        ("Frédéric Chopin", "Frédéric Chopin"),  # NFC text, NFD answer: both NFD-normalised
        ("Super Bowl 50, the 50th", "super bowl 50"),
    ],
)
def test_has_answer_finds_answers_next_to_punctuation_as_drqa_does(text, answer):
    """DrQA's has_answer (which ORQA uses): punctuation is a token of its own, a match a run of whole tokens. The
    normaliser-based check missed every one of these (cf41f60)."""
    assert has_answer(text, QAExample("q", (answer,)))
    assert has_answer(text, QAExample("q", (unicodedata.normalize("NFD", answer),)))


@pytest.mark.parametrize(
    "text, answer",
    [("Chopinesque", "Chopin"), ("Parisian cafés", "Paris"), ("Denver is a city", "Denver Broncos")],
)
def test_has_answer_needs_whole_tokens(text, answer):
    assert not has_answer(text, QAExample("q", (answer,)))


def test_has_answer_matches_whole_normalised_tokens():
    example = QAExample("q", ("Denver Broncos", "The Broncos"))
    assert has_answer("The Denver Broncos defeated the Panthers.", example)
    assert has_answer("...won by the broncos!", example)
    assert not has_answer("The Broncosaurus is not a team.", example)
    assert not has_answer("Denver is a city.", example)


def test_the_answer_index_finds_the_blocks_has_answer_finds():
    """AnswerBlocks (QA's beam labels): every case above, the ones that must not match among the blocks."""
    positive = [
        "Chopin's nocturnes",
        "the 1997–98 season",
        "a New York-based company",
        "(Frédéric Chopin)",
        "Super Bowl 50, the 50th",
        "The Denver Broncos defeated the Panthers.",
        "...won by the broncos!",
    ]
    negative = ["Chopinesque", "Parisian cafés", "Denver is a city", "The Broncosaurus is not a team."]  # fmt: skip
    bodies = positive + negative
    index = AnswerBlocks(bodies)
    examples = [QAExample("q", (a,)) for a in ("Chopin", "1997", "New York", "Frédéric Chopin", "super bowl 50")]
    examples += [QAExample("q", ("Denver Broncos", "The Broncos")), QAExample("q", ("Paris",)), QAExample("q", ("?",))]
    for example in examples:
        truth = [b for b, body in enumerate(bodies) if has_answer(body, example)]
        assert index.holding(example).tolist() == truth
    assert index.holding(examples[5]).tolist() == [5, 6] and index.holding(examples[6]).tolist() == []
    assert index.holding(QAExample("q", ("Paris",), regex=True)) is None  # regex answers: tested block by block


def test_has_answer_regex():
    example = QAExample("q", (r"Long Island|New\s?York|Roosevelt Field",), regex=True)
    assert has_answer("He took off from Roosevelt Field.", example)
    assert has_answer("flights from NEWYORK", example)  # case-insensitive
    assert not has_answer("He landed in Paris.", example)


def test_exact_match():
    assert is_exact_match("the Denver Broncos.", QAExample("q", ("Denver Broncos",)))
    assert not is_exact_match("Broncos", QAExample("q", ("Denver Broncos",)))


# Patterns of CuratedTrec training questions with an escaped accented letter (DPR's curatedtrec-train; a few of their
# unaccented alternatives left out)
CURATEDTREC_ACCENTED = {
    "Jesús Gil": "Jesus\\s+Gil\\s+y\\s+Gil|Jes\\ús Gil",
    "Shinzō Abe": "Hata|Hosokawa|Kaifu|Miyazawa|Murayama|Takeshita|Shinz\\ō Abe",
    "Cathédrale Notre-Dame": "Champagne\\s+country|cathedrals?|champagne.*museum|Cath\\édrale Notre\\-Dame",
    "Ivana Buzková": "Claudia\\s+Leistner|Debi\\s+Thomas|Nancy\\s+Kerrigan|Ivana Buzkov\\á|Liudmila Bakonina",
    "the Niña": "Nina.*Pinta.*Santa Maria|the Ni\\ña|Ni\\ña and the Pinta|Ni\\ña\\, Pinta\\, and Santa Maria",
}


@pytest.mark.parametrize("name", CURATEDTREC_ACCENTED)
def test_a_regex_answer_with_an_accent_matches_nfd_text(name, tmp_path):
    """DrQA normalises the pattern as well as the text. CuratedTrec's five accented patterns escape the letter
    ("Ni\\ña"), which plain NFD would turn into "\\n" + a combining tilde (a newline): each must match a block
    holding the name, in NFC or NFD, in recall and in the reader's span labels."""
    path = tmp_path / "trec.regex.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": [CURATEDTREC_ACCENTED[name]]}) + "\n", encoding="utf-8")
    (example,) = load_qa(path)
    assert any(re.search(r"\\[^\x00-\x7f]", p) for p in example.answers)  # an escaped accented letter
    for form in ("NFC", "NFD"):
        text = unicodedata.normalize(form, f"It was {name}, they said.")
        assert has_answer(text, example)
        assert is_answer_span(unicodedata.normalize(form, name), example)
    assert not has_answer("It was nobody, they said.", example)


def test_regex_exact_match_is_orqa_regex_match_score():
    """ORQA's regex_match_score: re.match (anchored at the start, not at the end) with IGNORECASE | UNICODE |
    MULTILINE on the raw prediction; a broken pattern never matches."""

    def scored(prediction: str, *patterns: str) -> bool:
        return is_exact_match(prediction, QAExample("q", patterns, regex=True))

    assert scored("Atlantic Ocean", "Atlantic")  # a prefix match counts (fullmatch would not)
    assert scored("September 5", r"Sept?(ember)?|Feb(ruary)?")
    assert scored("atlantic", "Atlantic")  # IGNORECASE
    assert scored("Zürich", "zürich")  # UNICODE
    assert scored("Atlantic\nOcean", "Atlantic$")  # MULTILINE: $ also before a newline
    assert not scored("the Atlantic", "Atlantic")  # anchored at the start of the prediction
    assert not scored("North Atlantic", "Atlantic")
    assert not scored("Atlantic", "(unclosed")
    assert scored("Atlantic", "(unclosed", "Atl")  # any pattern of the list


def _hit(text: str) -> SearchHit:
    return SearchHit(0, "d", 1.0, "t", text)


def test_recall_at_k():
    examples = [QAExample("q1", ("Paris",)), QAExample("q2", ("Nile",)), QAExample("q3", ("Bach",))]
    hits = [
        [_hit("Paris is in France"), _hit("x")],  # first-rank hit
        [_hit("x"), _hit("y"), _hit("The Nile flows north")],  # third-rank hit
        [_hit("nothing here")],  # miss
    ]
    assert recall_at_k(examples, hits, [1, 3, 10]) == pytest.approx(
        {"recall@1": 100 / 3, "recall@3": 200 / 3, "recall@10": 200 / 3}
    )
    with pytest.raises(ValueError):
        recall_at_k(examples, hits[:2], [1])


def test_load_qa_files(tmp_path, caplog):
    regex_file = tmp_path / "trec.regex.jsonl"
    regex_file.write_text(
        "".join(json.dumps({"question": n, "answer": [p]}) + "\n" for n, p in CURATEDTREC_ACCENTED.items())
    )
    regex = load_qa(regex_file)
    assert len(regex) == 5 and all(e.regex for e in regex)
    plain = load_qa(question_file("squad-open-dev"))
    assert len(plain) == 1496 and not any(e.regex for e in plain)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok?", "answer": ["yes"]}\n{"question": "no answer"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_qa(bad)
    # CuratedTrec ships one pattern with a trailing backslash: reported, kept, and never matching.
    bad_regex = tmp_path / "bad.regex.jsonl"
    bad_regex.write_text('{"question": "q", "answer": ["(unclosed", "Paris"]}\n')
    (example,) = load_qa(bad_regex)
    assert "bad.regex.jsonl:1" in caplog.text and "does not compile" in caplog.text
    assert has_answer("Paris, France", example) and not has_answer("(unclosed", example)


def test_qa_split_is_a_function_of_each_question(tmp_path, capsys):
    from realm.cli.main import main

    source = tmp_path / "trec.regex.jsonl"
    lines = [json.dumps({"question": f"question {i}?", "answer": [f"a{i}|b"]}) for i in range(200)]
    source.write_text("\n".join(lines) + "\n")
    assert main(["qa", "split", str(source), "--dev-fraction", "0.25", "--out", str(tmp_path / "s")]) == 0
    train, dev = (load_qa(tmp_path / "s" / f"{part}.regex.jsonl") for part in ("train", "dev"))
    assert all(e.regex for e in train + dev) and len(train) + len(dev) == 200 and 30 < len(dev) < 70
    assert {e.question for e in train}.isdisjoint({e.question for e in dev})
    shuffled = tmp_path / "shuffled.regex.jsonl"
    shuffled.write_text("\n".join(reversed(lines)) + "\n")  # another order: the same questions on each side
    assert main(["qa", "split", str(shuffled), "--dev-fraction", "0.25", "--out", str(tmp_path / "t")]) == 0
    assert {e.question for e in load_qa(tmp_path / "t" / "dev.regex.jsonl")} == {e.question for e in dev}
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n{oops\n")
    assert main(["qa", "split", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "u")]) == 2
    assert "bad.jsonl:2:" in capsys.readouterr().err and not (tmp_path / "u").exists()


def _questions(articles: dict[str, int]) -> list[QAExample]:
    return [QAExample(f"{a} question {i}?", ("x",), article=a) for a, n in articles.items() for i in range(n)]


def test_the_tuning_split_holds_out_whole_articles_in_at_most_a_fifth():
    questions = _questions({f"article {a}": 5 + a % 7 for a in range(60)})
    train, tuning = tuning_split(questions)
    assert 0 < len(tuning) <= len(questions) // 5
    assert not {e.article for e in train} & {e.article for e in tuning}  # no article on both sides
    assert len({e.article for e in tuning}) > 5  # many articles, not the first in file order
    assert tuning_split(list(questions)) == (train, tuning)  # the same on every run of the same data
    assert [questions.index(e) for e in tuning] == sorted(questions.index(e) for e in tuning)  # in file order
    # a file that names no article: each question is its own
    plain = [QAExample(f"question {i}?", ("x",)) for i in range(100)]
    train, tuning = tuning_split(plain)
    assert len(tuning) == 20 and set(train) | set(tuning) == set(plain)
    assert tuning != plain[:20]


def test_squad_open_training_questions_are_split_by_their_articles(tmp_path):
    """SQuAD-open's training questions list Super Bowl 50's first; a copy that names no article (as the project's
    dev file did) gets them from the SQuAD file. No article chooses a setting and trains too."""
    named = question_file("squad-open-train")
    untitled = tmp_path / "squad_open_train.jsonl"
    rows = [json.loads(line) for line in named.read_text(encoding="utf-8").splitlines()]
    untitled.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "title"}) + "\n" for r in rows))
    titles = squad_question_titles(SQUAD_DEV_ZIP)
    questions = load_qa(untitled, titles)
    assert [e.article for e in questions] == [e.article for e in load_qa(named)]
    assert all(e.article for e in questions) and questions[0].article == "Super Bowl 50"
    train, tuning = tuning_split(questions)
    assert len(tuning) <= len(questions) // 5 and len(train) + len(tuning) == len(questions)
    assert not {e.article for e in train} & {e.article for e in tuning}
    assert len({e.article for e in tuning}) >= 3 and "Super Bowl 50" not in {e.article for e in tuning}


def test_a_question_may_name_its_article(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(
        json.dumps({"question": "Who?", "answer": ["Bach"], "title": "Bach"})
        + "\n"
        + json.dumps({"question": "Where?", "answer": ["Eisenach"]})
        + "\n"
        + json.dumps({"question": "When?", "answer": ["1685"], "title": 3})
        + "\n"
    )
    with pytest.raises(ValueError, match=r"qa.jsonl:3: .*'title' must be a string"):
        load_qa(path)
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    assert [e.article for e in load_qa(path)] == ["Bach", None]
    assert [e.article for e in load_qa(path, {"Where?": "Eisenach"})] == ["Bach", "Eisenach"]
