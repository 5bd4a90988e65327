"""Model cards: what a saved model was trained from, on which data, with which settings, and its figures, with the
Hub model its weights descend from followed through the folders they came from."""

from __future__ import annotations

import json

from realm.config import record_run_config
from realm.pipeline.records import EvalRecord
from realm.pipeline.work import qa_figures
from realm.recipes.model_card import MINILM_HUB_ID, write_model_card


def _front_matter(card: str) -> list[str]:
    assert card.startswith("---\n")
    return card.split("\n---\n", 1)[0].splitlines()[1:]


def test_cards_follow_the_weights_back_to_minilm_and_hold_the_settings_and_figures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["/some/where/bin/realm", "train", "qa", "--model", "realm"])
    # the pipeline's warm start: a stage folder whose config.json names minilm, and no card
    record_run_config(tmp_path / "warm", {"stage": "warm_start", "model": "minilm"}, resume=False)
    realm = {"recipe": "pretrain", "corpus": "corpus", "retriever_model": "warm/retriever", "reader_model": "random"}
    record_run_config(tmp_path / "realm", realm | {"pretrain": {"steps": 300}}, resume=False)
    write_model_card(tmp_path / "realm", tmp_path / "realm")
    qa = {"recipe": "finetune_qa", "model": "realm", "index": "realm/index", "train_questions": 9}
    record_run_config(tmp_path / "qa", qa | {"qa": {"lr": 1e-4, "top_k": 5}}, resume=False)
    (tmp_path / "qa" / "best").mkdir()
    (tmp_path / "qa" / "best" / "dev.json").write_text(json.dumps({"exact_match": 12.5, "questions": 8, "step": 4}))
    evaluation = {
        kind: {
            "exact_match": em,
            "exact_match_95ci": [em - 2, em + 2],
            "questions": 1496,
            "reader_top_k": 5,
            "recall@5": r,
        }
        for kind, em, r in (("dense", 29.28, 80.35), ("bm25", 26.67, 92.25), ("hybrid", 37.77, 95.05))
    }
    write_model_card(tmp_path / "qa" / "best", tmp_path / "qa", qa_figures(EvalRecord.from_dict(evaluation)))

    pretrained = (tmp_path / "realm" / "README.md").read_text()
    assert f"base_model: {MINILM_HUB_ID}" in _front_matter(pretrained)
    assert "None measured yet" in pretrained and "| retriever model | `warm/retriever` |" in pretrained
    card = (tmp_path / "qa" / "best" / "README.md").read_text()
    assert _front_matter(card) == [
        "library_name: realm",
        f"base_model: {MINILM_HUB_ID}",  # qa -> realm's card -> warm/config.json -> minilm
        "tags:",
        "- realm",
        "- dense-retrieval",
        "- question-answering",
    ]
    assert "# open-domain QA retriever and reader" in card
    assert "realm train qa --model realm\n" in card  # the command, without this machine's path to it
    settings = card.split("Every setting it read:\n\n```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(settings) == {"qa": {"lr": 1e-4, "top_k": 5}}
    assert "| train questions | `9` |" in card and "| index | `realm/index` |" in card
    assert (
        "| exact match, hybrid retrieval, top 5 read | 37.77 [35.77, 39.77] (1496 dev questions, 95% interval) |"
        in card
    )
    assert "| recall@5, bm25 retrieval | 92.25 |" in card
    assert "| exact match, dev part seen while fine-tuning | 12.50 (8 questions, step 4) |" in card
