"""Named question sets: the shipped SQuAD-open split, DPR's topic files read out of a jar inside a wheel (built here
as pyserini 0.20.0 lays them out), pinned by sha256 and count, and the errors a user sees."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import subprocess
import zipfile

import pytest

from realm.cli.main import main
from realm.data import question_sets
from realm.data.qa_examples import has_answer, is_exact_match, load_qa
from realm.data.question_sets import (
    QUESTION_SETS,
    SQUAD_OPEN_DEV_ARTICLES,
    QuestionSetError,
    question_file,
    topic_lines,
    write_jar_sets,
)
from realm.data.sources import CorpusError, download_wheel

# DPR's qas lines as the jar holds them: CSV with TAB, a quoted field's quotes doubled, CRLF line ends
NQ_LINES = (
    "who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']\r\n"
    'where was the mona lisa kept during ww2\t"[\'the Ingres Museum\', ""Château d\'Amboise"", \'Château de Chambord\']"\r\n'
)
CURATED_LINES = '{"question": "How tall is Mount McKinley?", "answer": ["20\\\\s?,?\\\\s?(32|40)0\\\\s?f(ee|oo)t"]}\n'


def test_dpr_topic_lines_are_read_as_dpr_reads_them():
    rows = [json.loads(line) for line in topic_lines(NQ_LINES, "nq")]
    assert rows[0] == {"question": "who got the first nobel prize in physics", "answer": ["Wilhelm Conrad Röntgen"]}
    assert rows[1]["answer"] == ["the Ingres Museum", "Château d'Amboise", "Château de Chambord"]
    (curated,) = [json.loads(line) for line in topic_lines(CURATED_LINES, "ct")]
    assert curated["answer"] == [r"20\s?,?\s?(32|40)0\s?f(ee|oo)t"]


@pytest.mark.parametrize(
    "line",
    ["a question without answers", "q\t[]", "q\t__import__('os').system('true')", "q\t['unclosed'", '{"question": 1}'],
)
def test_a_bad_topic_line_is_named_never_run(line):
    with pytest.raises(QuestionSetError, match=r"^where:2: not a question and its answers"):
        topic_lines("ok\t['fine']\n" + line + "\n", "where")


def _wheel_with_jar(members: dict[str, str]) -> zipfile.ZipFile:
    """A wheel holding a jar that holds `members`, as pyserini 0.20.0 holds Anserini's topics."""
    jar = io.BytesIO()
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in members.items():
            archive.writestr(name, text.encode("utf-8"))
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pyserini/resources/jars/anserini.jar", jar.getvalue())
    return zipfile.ZipFile(wheel)


def _pinned(name: str, text: str, **changes) -> question_sets.QuestionSet:
    member = f"topics-and-qrels/{name}.txt"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return dataclasses.replace(QUESTION_SETS["nq-test"], name=name, member=member, sha256=digest, **changes)


def test_sets_are_read_out_of_the_jar_checked_and_written_as_jsonl(tmp_path, monkeypatch):
    monkeypatch.setenv("REALM_CACHE", str(tmp_path))
    nq, curated = _pinned("nq", NQ_LINES, questions=2), _pinned("ct", CURATED_LINES, questions=1, regex=True)
    wheel = _wheel_with_jar({nq.member: NQ_LINES, curated.member: CURATED_LINES})
    write_jar_sets(wheel, "pyserini/resources/jars/anserini.jar", (nq, curated))
    examples = load_qa(tmp_path / "question-sets" / "nq.jsonl")
    assert [e.answers for e in examples][1][1] == "Château d'Amboise"
    (regex,) = load_qa(tmp_path / "question-sets" / "ct.regex.jsonl")  # the file name marks regex answers
    assert regex.regex and is_exact_match("20,320 feet", regex) and has_answer("it is 20 320 feet tall", regex)

    with pytest.raises(QuestionSetError, match="nq.txt has sha256 .*, expected 0000"):
        write_jar_sets(wheel, "pyserini/resources/jars/anserini.jar", (dataclasses.replace(nq, sha256="0000"),))
    with pytest.raises(QuestionSetError, match="nq: 2 questions, expected 3"):
        write_jar_sets(wheel, "pyserini/resources/jars/anserini.jar", (dataclasses.replace(nq, questions=3),))


def test_squad_open_ships_with_the_package_split_by_article(tmp_path, monkeypatch):
    monkeypatch.setenv("REALM_CACHE", str(tmp_path))
    train, dev = (load_qa(name) for name in ("squad-open-train", "squad-open-dev"))  # a set's name reads its file
    assert (len(train), len(dev)) == (9074, 1496) and load_qa(question_file("squad-open-dev")) == dev
    dev_articles = {e.article for e in dev}
    assert dev_articles == {a.replace("_", " ") for a in SQUAD_OPEN_DEV_ARTICLES}
    assert not dev_articles & {e.article for e in train}  # no article on both sides
    assert dev[0].question == "Of what nationality was Martin Luther?" and dev[0].answers == ("German",)


def test_a_path_is_a_path_and_an_unknown_set_is_named(tmp_path):
    assert question_file(tmp_path / "mine.jsonl") == tmp_path / "mine.jsonl"
    with pytest.raises(QuestionSetError, match="nq-tset: no such question set"):
        question_sets.question_set("nq-tset")


def test_an_unreachable_registry_is_one_line(tmp_path, monkeypatch):
    def refused(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: retrying\nERROR: No matching distribution found\n")

    monkeypatch.setattr(subprocess, "run", refused)
    with pytest.raises(CorpusError, match=r"could not download pyserini==0.20.0 .*: ERROR: No matching distribution"):
        download_wheel("pyserini==0.20.0", tmp_path)


def test_the_pipeline_takes_both_question_files_or_a_set(capsys):
    assert main(["pipeline", "--qa-train", "squad-open-train", "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "realm: error: give both --qa-train and --qa-dev, or neither (--qa-set names both)"
    )


@pytest.mark.parametrize(
    "argv, train, dev",
    [
        ([], "squad-open-train", "squad-open-dev"),
        (["--qa-set", "none"], None, None),
        (["--qa-set", "nq", "--qa-train", "my.jsonl", "--qa-dev", "nq-test"], "my.jsonl", "nq-test"),
    ],
)
def test_the_bare_pipeline_answers_squad_open_questions(argv, train, dev, monkeypatch):
    """`realm pipeline` alone: the default corpus with SQuAD's paragraphs, and SQuAD-open's questions; the
    pipeline is given the names (its plan.json records them, never a cache path)."""
    from realm.pipeline import run

    seen = []
    monkeypatch.setattr(run.Pipeline, "__init__", lambda self, options, preset: seen.append(options))
    monkeypatch.setattr(run.Pipeline, "run", lambda self: None)
    assert main(["pipeline", "--quiet", *argv]) == 0
    (options,) = seen
    assert options.inputs == ("vital-articles", "squad-paragraphs")
    assert (options.qa_train, options.qa_dev) == (train, dev)
