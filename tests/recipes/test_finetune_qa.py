"""Open-QA: span marginalisation, answer matching, fine-tuning with resume, answers with evidence, CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch
from conftest import TINY_CORPUS, TINY_QA, TINY_QA_PRESET, save_tiny_qa

from realm.cli.main import main
from realm.data.qa_examples import QAExample, is_exact_match, load_qa, normalize_answer
from realm.data.question_sets import question_file
from realm.eval.answerer import Answerer, load_answerer, load_answerers
from realm.index.search import BM25Searcher, DenseSearcher, HybridSearcher
from realm.models.orqa import DEFAULT_BM25_WEIGHT, joint_log_probs, marginal_answer_log_likelihood, qa_loss
from realm.models.retriever import Retriever
from realm.models.span_reader import block_spans, matching_spans
from realm.pipeline.work import SYSTEMS
from realm.recipes import finetune_qa
from realm.recipes.finetune_qa import train_qa

PRESET = TINY_QA_PRESET
QUESTIONS = [
    QAExample("What is the capital of Japan?", ("Tokyo",)),
    QAExample("Where did Bach die?", ("Leipzig",)),
    QAExample("Who walked on the Moon in 1969?", ("Neil Armstrong",)),
    QAExample("Into which sea does the Nile flow?", ("the Mediterranean Sea", "Mediterranean")),
    QAExample("What does the Louvre hold?", ("the Mona Lisa",)),
    QAExample("When was Bach born?", (r"16\d\d",), regex=True),
]


def test_joint_normalisation_over_blocks_and_spans_matches_hand_computation():
    """ORQA's joint_logits: one softmax over f(x, z) + S(s) for every span of every top-k block."""
    f_beam = torch.tensor([[1.0, 0.0, -1.0]])  # beam of 3; the top 2 go to the reader
    scores = torch.tensor([[[2.0, 0.0, 1.0], [0.5, 0.5, 0.0]]])  # (B=1, K=2, S=3) span scores
    valid = torch.tensor([[[True, True, True], [True, True, False]]])  # the third span of z1 is padding
    match = torch.tensor([[[False, True, False], [True, False, False]]])  # span 1 of z0, span 0 of z1
    beam_answer = torch.tensor([[False, True, True]])
    loss, stats = qa_loss(f_beam, torch.ones(1, 3, dtype=torch.bool), beam_answer, scores, valid, match)

    joint = [math.exp(1.0 + s) for s in (2.0, 0.0, 1.0)] + [math.exp(0.0 + s) for s in (0.5, 0.5)]
    p_answer = (joint[1] + joint[3]) / sum(joint)
    beam = [math.exp(v) for v in (1.0, 0.0, -1.0)]
    p_beam = (beam[1] + beam[2]) / sum(beam)
    assert stats["reader_loss"].item() == pytest.approx(-math.log(p_answer), rel=1e-5)
    assert stats["retrieval_loss"].item() == pytest.approx(-math.log(p_beam), rel=1e-5)
    assert loss.item() == pytest.approx(-math.log(p_answer) - math.log(p_beam), rel=1e-5)
    log_joint = joint_log_probs(f_beam[:, :2], scores, valid)
    assert marginal_answer_log_likelihood(log_joint, match).exp().item() == pytest.approx(p_answer, rel=1e-5)
    assert log_joint[0, 1, 2].item() == float("-inf") and log_joint.exp().sum().item() == pytest.approx(1.0)
    assert stats["train_em"].item() == 0.0  # the best (z, s) is span 0 of z0, not an answer


def test_span_scores_rank_blocks_under_joint_normalisation():
    """A block the retriever ranks lower wins when its spans score higher: per-block normalisation could not
    tell the two blocks apart (each would spend all its mass on its best span)."""
    block_logits = torch.tensor([[1.0, 0.0]])
    scores = torch.tensor([[[0.0, 0.0], [6.0, 0.0]]])  # (1, K=2, S=2): only z1 has a confident span
    valid = torch.ones(1, 2, 2, dtype=torch.bool)
    p = joint_log_probs(block_logits, scores, valid).exp()[0]
    assert p[1].sum() > 0.9 and p[1, 0] > p[0].max() * 50


def test_unanswerable_examples_add_nothing_and_keep_gradients_finite():
    f_beam = torch.zeros(2, 3, requires_grad=True)
    scores = torch.randn(2, 2, 5, requires_grad=True)  # B=2, K=2
    valid = torch.ones(2, 2, 5, dtype=torch.bool)
    valid[1, 1] = False  # a block with no span at all (empty body)
    match = torch.zeros(2, 2, 5, dtype=torch.bool)
    match[0, 0, 2] = True  # only the first example has an answer in its top 2 ...
    beam_answer = torch.tensor([[True, False, False], [False, False, False]])  # ... and in its beam
    loss, stats = qa_loss(f_beam, torch.ones(2, 3, dtype=torch.bool), beam_answer, scores, valid, match)
    loss.backward()
    assert torch.isfinite(f_beam.grad).all() and torch.isfinite(scores.grad).all()
    assert scores.grad[1].abs().sum() == 0 and f_beam.grad[1].abs().sum() == 0  # example 2 contributes nothing
    alone, _ = qa_loss(
        f_beam[:1], torch.ones(1, 3, dtype=torch.bool), beam_answer[:1], scores[:1], valid[:1], match[:1]
    )
    assert loss.item() == pytest.approx(alone.item() / 2, rel=1e-5)  # summed over answerable, divided by B
    assert stats["answer_in_top_k"].item() == 0.5


def test_spans_are_whole_words_and_match_normalised_or_regex_answers(tokenizer):
    body = "Johann Sebastian Bach was born in Eisenach in 1685, and died in Leipzig."
    spans = block_spans(tokenizer, body, max_tokens=64, max_width=4)
    inside_word = lambda i: 0 < i < len(body) and body[i - 1].isalnum() and body[i].isalnum()  # noqa: E731
    for span in spans.spans:
        assert span[1] - span[0] < 4
        start, end = spans.char_span(span)
        assert not inside_word(start) and not inside_word(end)  # whole words only
    found = [
        spans.text(body, s)
        for s, ok in zip(spans.spans, matching_spans(body, spans, QAExample("q", ("eisenach",))))
        if ok
    ]
    assert found == ["Eisenach"]
    years = [
        spans.text(body, s)
        for s, ok in zip(spans.spans, matching_spans(body, spans, QAExample("q", (r"16\d\d",), regex=True)))
        if ok
    ]
    assert years == ["1685"]
    assert not any(matching_spans(body, spans, QAExample("q", ("Paris",))))


def test_fine_tuning_keeps_best_model_and_resumes_exactly(tmp_path, tiny_qa, monkeypatch):
    model_dir, index_dir = tiny_qa
    crashed, save_checkpoint = tmp_path / "crashed", finetune_qa.save_checkpoint

    def save_then_copy(out, step, *args, **kwargs):
        save_checkpoint(out, step, *args, **kwargs)
        if step == 2:
            shutil.copytree(out, crashed)  # the run as a kill just after the step-2 checkpoint leaves it

    monkeypatch.setattr(finetune_qa, "save_checkpoint", save_then_copy)
    best = train_qa(str(model_dir), index_dir, QUESTIONS, QUESTIONS, tmp_path / "run", PRESET, progress=False)
    dev = json.loads((best / "dev.json").read_text())
    assert dev["questions"] == len(QUESTIONS)
    row = f"| exact match, dev part seen while fine-tuning | {dev['exact_match']:.2f} ({len(QUESTIONS)} questions"
    assert row in (best / "README.md").read_text()  # the model card, swapped in with the model
    assert (best / "reader" / "span_head.safetensors").is_file()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and sum("dev_em" in r for r in rows) == 2
    assert all(math.isfinite(r["loss"]) for r in rows)
    # The document tower never changes: the fine-tuned model still opens the same index.
    DenseSearcher(
        __import__("realm.index.mips", fromlist=["MipsIndex"]).MipsIndex(index_dir),
        Retriever.load(str(best / "retriever"), PRESET.retriever),
    )

    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-00000004"]  # finished: the last

    train_qa(str(model_dir), index_dir, QUESTIONS, QUESTIONS, crashed, PRESET, resume=True, progress=False)
    resumed = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(rows[2:], resumed[2:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


def test_hybrid_fine_tuning_learns_the_bm25_weight(tmp_path, tiny_qa):
    model_dir, index_dir = tiny_qa
    preset = dataclasses.replace(PRESET, qa=dataclasses.replace(TINY_QA, retriever="hybrid"))
    best = train_qa(str(model_dir), index_dir, QUESTIONS, QUESTIONS, tmp_path / "run", preset, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows) and sum("bm25_weight" in r for r in rows) == 2
    learned = json.loads((best / "fusion.json").read_text())["bm25_weight"]
    assert learned != pytest.approx(DEFAULT_BM25_WEIGHT, abs=1e-4)  # the weight trained
    answerer = load_answerer(str(best), index_dir, preset, "hybrid")
    assert isinstance(answerer.searcher, HybridSearcher) and answerer.searcher.bm25_weight == pytest.approx(learned)
    assert all(answer.evidence for answer in answerer.ask([q.question for q in QUESTIONS]))


def test_eval_qa_reads_the_blocks_ask_reads(tmp_path, squad_slice, tokenizer):
    """`eval qa` measures recall deeper than the reader's k; the reader still gets the blocks `ask` (and `serve`,
    and fine-tuning's dev score) retrieve, for every retriever (cf41f60's hybrid gave it others for 2 of these
    100 questions)."""
    from realm.eval.qa import evaluate_qa

    model_dir, index_dir = save_tiny_qa(squad_slice, tokenizer, tmp_path)
    questions = load_qa(question_file("squad-open-dev"))[:100]
    for retriever in ("dense", "bm25", "hybrid"):
        answerer = load_answerer(str(model_dir), index_dir, PRESET, retriever)
        evaluate_qa(answerer, questions, (1, 20), tmp_path / f"{retriever}.jsonl")
        evaluated = [json.loads(line) for line in (tmp_path / f"{retriever}.jsonl").read_text().splitlines()]
        asked = answerer.ask([q.question for q in questions])
        assert [[e["block_id"] for e in row["evidence"]] for row in evaluated] == [
            [e.block_id for e in a.evidence] for a in asked
        ]
        assert [row["prediction"] for row in evaluated] == [a.answer for a in asked]


def test_systems_sharing_reads_answer_as_each_alone(tmp_path, squad_slice, tokenizer, monkeypatch):
    """The evaluation's dense, BM25 and hybrid answerers share what the reader read: each (question, block) is
    read once, and every answer, its score and evidence is what that system gives alone."""
    model_dir, index_dir = save_tiny_qa(squad_slice, tokenizer, tmp_path)
    questions = [q.question for q in load_qa(question_file("squad-open-dev"))[:40]]
    shared = load_answerers(str(model_dir), index_dir, PRESET, SYSTEMS)
    model = shared["dense"].model
    rows_read: list[int] = []
    read = model.span_scores
    monkeypatch.setattr(model, "span_scores", lambda batch: rows_read.append(len(batch.span_valid)) or read(batch))
    answered = {kind: shared[kind].ask(questions) for kind in SYSTEMS}
    pairs = {(a.question, e.block_id) for answers in answered.values() for a in answers for e in a.evidence}
    assert sum(rows_read) == len(pairs) == len(shared["bm25"].read_rows or {})
    assert len(pairs) < len(SYSTEMS) * len(questions) * PRESET.qa.top_k  # the systems overlap: fewer rows read
    for kind in SYSTEMS:
        alone = load_answerer(str(model_dir), index_dir, PRESET, kind).ask(questions)
        for a, b in zip(answered[kind], alone, strict=True):
            assert a.answer == b.answer and a.score == pytest.approx(b.score, rel=1e-4, abs=1e-6)
            assert [(e.block_id, e.answer_span) for e in a.evidence] == [
                (e.block_id, e.answer_span) for e in b.evidence
            ]


def test_answers_come_with_consistent_evidence(tiny_qa, tiny_corpus):
    model_dir, index_dir = tiny_qa
    answerer = load_answerer(str(model_dir), index_dir, PRESET)
    assert isinstance(answerer.searcher, DenseSearcher)
    for answer in answerer.ask([q.question for q in QUESTIONS]):
        assert answer.answer and 0 < answer.score <= 1 + 1e-6
        assert len(answer.evidence) == TINY_QA.top_k
        assert sum(e.retrieval_prob for e in answer.evidence) == pytest.approx(1.0, rel=1e-5)
        assert sum(e.answer_prob for e in answer.evidence) == pytest.approx(answer.score, rel=1e-5)
        for ev in answer.evidence:
            assert ev.answer_prob >= 0
            if ev.answer_span is not None:
                assert normalize_answer(ev.text[slice(*ev.answer_span)]) == normalize_answer(answer.answer)
    bm25 = Answerer(answerer.model, BM25Searcher(tiny_corpus), 3, TINY_CORPUS.max_block_tokens)
    answer = bm25.ask(["capital of Japan"])[0]
    assert {round(e.retrieval_prob, 6) for e in answer.evidence} == {round(1 / len(answer.evidence), 6)}
    assert bm25.ask(["zzzz qqqq"])[0].answer == ""  # nothing retrieved: no answer, no crash


def test_eval_qa_and_ask_commands(tmp_path, tiny_qa, capsys, monkeypatch):
    model_dir, index_dir = tiny_qa
    monkeypatch.setattr("realm.cli.options.get_preset", lambda name: PRESET)
    qa_file = tmp_path / "qa.jsonl"
    qa_file.write_text(
        "".join(json.dumps({"question": q.question, "answer": list(q.answers)}) + "\n" for q in QUESTIONS[:5])
    )
    for retriever in ("dense", "bm25", "hybrid"):
        out = tmp_path / f"{retriever}.jsonl"
        assert (
            main(
                [
                    "eval",
                    "qa",
                    "--model",
                    str(model_dir),
                    "--index",
                    str(index_dir),
                    "--qa",
                    str(qa_file),
                    "--out",
                    str(out),
                    "--retriever",
                    retriever,
                    "--recall-k",
                    "1,3",
                    "--json",
                    "--quiet",
                ]
            )
            == 0
        )
        summary = json.loads(capsys.readouterr().out)
        predictions = [json.loads(line) for line in out.read_text().splitlines()]
        assert summary["questions"] == 5 and set(summary) >= {"exact_match", "recall@1", "recall@3"}
        assert summary["exact_match"] == pytest.approx(
            100 * sum(is_exact_match(p["prediction"], QUESTIONS[i]) for i, p in enumerate(predictions)) / 5
        )
        assert sum(summary["outcomes"].values()) == pytest.approx(100.0, abs=0.05)
        assert summary["outcomes"]["exact_match"] == summary["exact_match"]
        assert all(p["outcome"] in summary["outcomes"] for p in predictions)
        low, high = summary["exact_match_95ci"]
        assert low <= summary["exact_match"] <= high and 0 <= low and high <= 100
        assert all(len(p["evidence"]) == 3 or retriever == "bm25" for p in predictions)
    # without --out it prints the score and writes nothing
    files = sorted(tmp_path.iterdir())
    args = ["eval", "qa", "--model", str(model_dir), "--index", str(index_dir), "--qa", str(qa_file), "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "exact_match" in printed and "predictions:" not in printed and sorted(tmp_path.iterdir()) == files
    assert (
        main(["ask", "What is the capital of Japan?", "--model", str(model_dir), "--index", str(index_dir), "--quiet"])
        == 0
    )
    printed = capsys.readouterr().out
    assert "p(z|x)" in printed and "[[" in printed and "]]" in printed
    assert main(["ask", "anything", "--model", str(tmp_path / "nope"), "--index", str(index_dir), "--quiet"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_a_reader_never_fine_tuned_answers_with_a_warning(tmp_path, tiny_qa, capsys, monkeypatch):
    """A `train pretrain` output has no span head: its answers are noise, and every surface says so."""
    import shutil

    from fastapi.testclient import TestClient

    from realm.serve.service import QAService, create_app

    model_dir, index_dir = tiny_qa
    monkeypatch.setattr("realm.cli.options.get_preset", lambda name: PRESET)
    fresh = tmp_path / "pretrained"
    shutil.copytree(model_dir, fresh)
    (fresh / "reader" / "span_head.safetensors").unlink()
    question = QUESTIONS[0].question
    assert main(["ask", question, "--model", str(fresh), "--index", str(index_dir), "--json", "--quiet"]) == 0
    said = capsys.readouterr()
    assert "never fine-tuned" in json.loads(said.out)["warning"] and said.err.startswith("realm: warning:")
    assert main(["ask", question, "--model", str(model_dir), "--index", str(index_dir), "--json", "--quiet"]) == 0
    said = capsys.readouterr()
    assert "warning" not in json.loads(said.out) and "warning" not in said.err
    client = TestClient(create_app(QAService.load(str(fresh), index_dir, PRESET)))
    assert "never fine-tuned" in client.post("/ask", json={"question": question}).json()["warning"]
    assert "never fine-tuned" in client.get("/health").json()["warning"]
