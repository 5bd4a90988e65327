"""REALM pretraining: the marginal loss, candidates (null first, no trivial retrievals), masking,
the refresh policy and builder, exact resume after a crash, and 2-process DDP."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import socket
import time

import numpy as np
import pytest
import torch
from conftest import TINY_CORPUS, TINY_EMBED, TINY_RETRIEVER, TINY_SHAPE, dead_pid

from realm.config import IndexConfig, Preset, PretrainConfig
from realm.data.sentences import date_spans, mask_each_salient_span, mask_sentence, merge_spans
from realm.index.mips import MipsIndex, current_version
from realm.index.refresh import (
    STOP_FILE,
    BuilderConfig,
    RefreshPolicy,
    index_source_step,
    list_snapshots,
    refresh_loop,
    save_snapshot,
)
from realm.models.realm import (
    NULL_BLOCK,
    candidate_mlm_loss,
    make_batch,
    marginal_mlm_loss,
    retrieval_log_probs,
    select_candidates,
)
from realm.models.retriever import Retriever
from realm.training.data import DataOrder, DataPosition
from realm.training.optim import bert_optimizer
from realm.training.schedule import linear_schedule

NO_DROPOUT_SHAPE = dataclasses.replace(TINY_SHAPE, dropout=0.0)
TINY_PRESET = Preset(
    name="cpu",
    corpus=TINY_CORPUS,
    retriever=dataclasses.replace(TINY_RETRIEVER, shape=NO_DROPOUT_SHAPE, dropout=0.0),
    embed=dataclasses.replace(TINY_EMBED, shard_size=1000),
    index=IndexConfig(),
    pretrain=PretrainConfig(
        steps=4,
        batch_size=4,
        lr=1e-3,
        head_lr_multiplier=10,
        warmup_steps=1,
        num_candidates=3,
        max_masks=5,
        masking="salient",
        mask_center_momentum=0.01,
        refresh_every=0,
        checkpoint_every=2,
        log_every=1,
        held_out_fraction=0.0,
    ),
)


def test_marginal_loss_equals_hand_computation():
    # One example, candidates (null, z1, z2, z3), two masks; z3 is padding and must not count.
    f = torch.tensor([[1.0, 2.0, 50.0]])  # f(x, z) of z1..z3
    candidate_mask = torch.tensor([[True, True, True, False]])
    b_null = torch.tensor(0.5)
    token_lp = torch.log(torch.tensor([[[0.1, 0.2], [0.6, 0.3], [0.5, 0.4], [0.9, 0.9]]]))  # (B=1, K=4, M=2)
    valid = torch.tensor([[True, True]])
    log_pz = retrieval_log_probs(f, candidate_mask, b_null)
    p_null = 1 / (1 + math.exp(-0.5))
    p_z1 = (1 - p_null) * math.exp(1) / (math.exp(1) + math.exp(2))
    p_z2 = (1 - p_null) * math.exp(2) / (math.exp(1) + math.exp(2))
    assert log_pz.exp().tolist()[0] == pytest.approx([p_null, p_z1, p_z2, 0.0], rel=1e-6)
    loss, stats = marginal_mlm_loss(log_pz, token_lp, valid)
    m1 = math.log(p_null * 0.1 + p_z1 * 0.6 + p_z2 * 0.5)
    m2 = math.log(p_null * 0.2 + p_z1 * 0.3 + p_z2 * 0.4)
    assert loss.item() == pytest.approx(-(m1 + m2) / 2, rel=1e-6)
    assert stats["p_null"].item() == pytest.approx(p_null, rel=1e-6)
    null_ll = (math.log(0.1) + math.log(0.2)) / 2
    assert stats["utility"].item() == pytest.approx((m1 + m2) / 2 - null_ll, rel=1e-6)
    # An invalid mask slot does not count.
    loss_one, _ = marginal_mlm_loss(log_pz, token_lp, torch.tensor([[True, False]]))
    assert loss_one.item() == pytest.approx(-m1, rel=1e-6)
    # No retrieved block left: the null document takes it all.
    alone = retrieval_log_probs(f, torch.tensor([[True, False, False, False]]), b_null)
    assert alone.exp().tolist()[0] == [1.0, 0.0, 0.0, 0.0]


def test_the_masked_lm_loss_averages_over_masked_tokens_as_the_released_code():
    """Two sentences, one with three masks and one with one: the loss is the mean of the four tokens' -log p(y_j|x),
    not the mean of the two sentences' means (cf41f60), so a sentence with more masks weighs more."""
    log_pz = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))  # (B=2, K=2)
    p = torch.tensor([[[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]], [[0.8, 0.5, 0.5], [0.6, 0.5, 0.5]]])  # (B, K, M=3)
    valid = torch.tensor([[True, True, True], [True, False, False]])
    loss, stats = marginal_mlm_loss(log_pz, p.log(), valid)
    marginals = [0.5 * (0.1 + 0.3), 0.5 * (0.2 + 0.2), 0.5 * (0.3 + 0.1), 0.5 * (0.8 + 0.6)]
    assert loss.item() == pytest.approx(-sum(math.log(m) for m in marginals) / 4, rel=1e-6)
    null_ll = (math.log(0.1) + math.log(0.2) + math.log(0.3) + math.log(0.8)) / 4
    assert stats["utility"].item() == pytest.approx(sum(math.log(m) for m in marginals) / 4 - null_ll, abs=1e-6)


def test_towers_get_no_gradient_shared_by_every_block(tiny_corpus, tokenizer):
    """The null document's weight is b_null alone: raising it cannot move the queries (models/realm.py)."""
    f = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    b_null = torch.tensor(0.0, requires_grad=True)
    log_pz = retrieval_log_probs(f, torch.ones(1, 4, dtype=torch.bool), b_null)
    token_lp = torch.log(torch.tensor([[[0.9], [0.1], [0.2], [0.1]]]))  # the reader does best with no block
    loss, _ = marginal_mlm_loss(log_pz, token_lp, torch.tensor([[True]]))
    loss.backward()
    assert f.grad.sum().item() == pytest.approx(0.0, abs=1e-6)  # a shift of every f(x, z) changes nothing
    assert b_null.grad.item() < 0  # descent raises p(null)


def test_gradient_reaches_both_towers_and_reader(tiny_corpus, tokenizer):
    from realm.models.mlm_reader import Reader
    from realm.models.realm import RealmModel

    model = RealmModel(Retriever.load("random", TINY_PRESET.retriever), Reader.load("random", NO_DROPOUT_SHAPE))
    query = mask_sentence(
        "Paris is the capital of France.", [(0, 5)], "salient", tokenizer, 32, 5, np.random.default_rng(0)
    )
    batch = make_batch([query], np.array([[0, 1]]), tiny_corpus, tokenizer, tiny_corpus.config)
    loss, stats = model(batch)
    loss.backward()
    for part in (model.retriever.query_tower, model.retriever.doc_tower, model.reader):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    assert model.null_score.grad is not None and model.null_score.grad.abs() > 0
    assert 0 <= stats["accuracy"].item() <= 1


def test_candidate_loss_is_each_candidates_own_reading_and_trains_the_reader_only(tiny_corpus, tokenizer):
    from realm.models.mlm_reader import Reader
    from realm.models.realm import RealmModel

    token_lp = torch.log(torch.tensor([[[0.9, 0.5], [0.1, 0.5], [0.3, 0.3]]]))  # (B=1, K=3, M=2)
    candidates, valid = torch.tensor([[True, True, False]]), torch.tensor([[True, False]])  # one padded, one mask
    assert candidate_mlm_loss(token_lp, candidates, valid).item() == pytest.approx(-(math.log(0.9) + math.log(0.1)) / 2)

    query = mask_sentence(
        "Paris is the capital of France.", [(0, 5)], "salient", tokenizer, 32, 5, np.random.default_rng(0)
    )
    batch = make_batch([query], np.array([[0, 1]]), tiny_corpus, tokenizer, tiny_corpus.config)
    grads = {}
    for reader_loss in ("marginal", "marginal+candidates"):
        torch.manual_seed(0)
        retriever, reader = Retriever.load("random", TINY_PRESET.retriever), Reader.load("random", NO_DROPOUT_SHAPE)
        model = RealmModel(retriever, reader, reader_loss)
        loss, stats = model(batch)
        loss.backward()
        grads[reader_loss] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    plain, added = grads["marginal"], grads["marginal+candidates"]
    for name in plain:  # the towers and b_null see the marginal alone; the reader sees more
        if name.startswith("reader."):
            continue
        assert torch.allclose(plain[name], added[name]), name
    assert any(not torch.allclose(plain[n], added[n]) for n in plain if n.startswith("reader."))


def test_null_score_offsets_the_null_document_and_is_saved_with_the_retriever(tmp_path, tiny_corpus, tokenizer):
    from realm.models.mlm_reader import Reader
    from realm.models.realm import RealmModel

    reader = Reader.load("random", NO_DROPOUT_SHAPE)
    model = RealmModel(Retriever.load("random", TINY_PRESET.retriever), reader)
    query = mask_sentence(
        "Paris is the capital of France.", [(0, 5)], "salient", tokenizer, 32, 5, np.random.default_rng(0)
    )
    batch = make_batch([query], np.array([[0, 1]]), tiny_corpus, tokenizer, tiny_corpus.config)
    with torch.no_grad():
        _, before = model(batch)
        model.null_score.fill_(2.0)
        _, after = model(batch)
    p_null = lambda stats: stats["log_pz"][0, 0].exp().item()  # noqa: E731
    assert p_null(before) == pytest.approx(0.5) and p_null(after) == pytest.approx(1 / (1 + math.exp(-2.0)))
    blocks = lambda stats: stats["log_pz"][0, 1:].softmax(-1)  # noqa: E731
    assert torch.allclose(blocks(after), blocks(before))  # the blocks' ranking is the towers' alone
    assert torch.equal(after["token_log_probs"], before["token_log_probs"])  # the reader is untouched
    model.export_null_score()
    model.retriever.save(tmp_path / "retriever")
    reloaded = RealmModel(Retriever.load(str(tmp_path / "retriever"), TINY_PRESET.retriever), reader)
    assert reloaded.null_score.item() == pytest.approx(2.0)


def test_trivial_candidates_are_dropped_and_null_is_first(tiny_corpus, tokenizer):
    doc_ids = np.array(tiny_corpus.column("doc_id"), dtype=object)
    own = [i for i, d in enumerate(doc_ids) if d == "paris"]
    others = [i for i, d in enumerate(doc_ids) if d != "paris"]
    retrieved = np.array([own + others[:3] + [-1]])  # the source document ranks first
    chosen = select_candidates(retrieved, doc_ids, ["paris"], 3)
    assert chosen.tolist() == [others[:3]]
    # Too few non-trivial blocks: padded with NULL_BLOCK, masked out of the softmax.
    short = select_candidates(np.array([own + others[:1]]), doc_ids, ["paris"], 3)
    assert short.tolist() == [[others[0], NULL_BLOCK, NULL_BLOCK]]
    query = mask_sentence(
        "Paris is the capital of France.", [(0, 5)], "salient", tokenizer, 32, 5, np.random.default_rng(0)
    )
    batch = make_batch([query], short, tiny_corpus, tokenizer, tiny_corpus.config)
    assert batch.candidate_ids[0, 0] == NULL_BLOCK
    assert batch.candidate_mask.tolist() == [[True, True, False, False]]
    # The null document is [CLS] x [SEP] [SEP] for the reader; the doc tower embeds the retrieved blocks only.
    null_reader = batch.reader["input_ids"][0][batch.reader["attention_mask"][0].bool()].tolist()
    assert null_reader == query.input_ids + [tokenizer.sep_token_id]
    assert len(batch.docs["input_ids"]) == 3


def test_salient_masking_masks_one_whole_span(tokenizer):
    text = "Johann Sebastian Bach was born in Eisenach in 1685."
    spans = merge_spans([(0, 21), (34, 42)] + date_spans(text))
    assert (46, 50) in spans
    seen = set()
    for seed in range(20):
        q = mask_sentence(text, spans, "salient", tokenizer, 32, 10, np.random.default_rng(seed))
        words = tokenizer.decode(q.targets)
        assert words in {"johann sebastian bach", "eisenach", "1685"}
        assert q.mask_positions == list(range(q.mask_positions[0], q.mask_positions[0] + len(q.targets)))
        assert all(q.input_ids[p] == tokenizer.mask_token_id for p in q.mask_positions)
        seen.add(words)
    assert len(seen) == 3  # the span is chosen at random


def test_every_salient_span_is_masked_in_turn_for_evaluation(tokenizer):
    text = "Johann Sebastian Bach was born in Eisenach in 1685."
    spans = merge_spans([(0, 21), (34, 42)] + date_spans(text))
    queries = mask_each_salient_span(text, spans, tokenizer, 32, 10)
    assert [tokenizer.decode(q.targets) for q in queries] == ["johann sebastian bach", "eisenach", "1685"]
    # the same masks as training's draw of each span: one query per span, the rest of the sentence intact
    drawn = {
        tuple(mask_sentence(text, spans, "salient", tokenizer, 32, 10, np.random.default_rng(s)).input_ids)
        for s in range(20)
    }
    assert {tuple(q.input_ids) for q in queries} == drawn
    assert mask_each_salient_span(text, spans, tokenizer, 32, 1) == queries[2:]  # the others are 3 wordpieces
    assert mask_each_salient_span(text, [], tokenizer, 32, 10) == []  # no fallback span


def test_other_masking_schemes(tokenizer):
    text = "The Nile is a major north-flowing river in northeastern Africa and flows into the sea."
    rng = np.random.default_rng(0)
    for scheme in ("uniform", "random-span"):
        for _ in range(10):
            q = mask_sentence(text, [], scheme, tokenizer, 64, 4, rng)
            assert 1 <= len(q.targets) <= 4 and q.input_ids[0] == tokenizer.cls_token_id
    span = mask_sentence(text, [], "random-span", tokenizer, 64, 4, np.random.default_rng(3))
    assert span.mask_positions == list(range(span.mask_positions[0], span.mask_positions[-1] + 1))
    with pytest.raises(ValueError, match="no maskable salient span"):  # never a random fallback
        mask_sentence(text, [], "salient", tokenizer, 64, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="no maskable salient span"):  # the only span is longer than max_masks
        mask_sentence(text, [(4, 85)], "salient", tokenizer, 64, 4, np.random.default_rng(0))
    with pytest.raises(ValueError):
        mask_sentence(text, [], "everything", tokenizer, 64, 4, rng)


def test_salient_masking_leaves_out_sentences_without_a_maskable_span(tmp_path, tiny_corpus, tokenizer):
    """The released code skips an example without a valid salient span; cf41f60 masked a random span instead (a
    third of the cpu preset's training sentences). Every mask of a kept sentence lies inside a tagged span, and the
    run records how many sentences salient masking could use."""
    from realm.data.sentences import SentenceSet, build_sentences
    from realm.recipes.pretrain import SENTENCE_USAGE, train_pretrain

    every = SentenceSet(build_sentences(tiny_corpus, progress=False), 0.0)
    one_piece = every.with_salient_spans(tokenizer, 32, 1)  # spans of one wordpiece only: most sentences have none
    assert 0 < len(one_piece) < len(every) == one_piece.tagged
    for i, (text, spans) in enumerate(zip(one_piece.texts, one_piece.spans)):
        query = mask_sentence(text, spans, "salient", tokenizer, 32, 1, np.random.default_rng(i))
        start, end = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][
            query.mask_positions[0] - 1
        ]
        assert len(query.targets) == 1 and (start, end) in spans  # the masked wordpiece is a whole tagged span
    cfg = TINY_PRESET.pretrain
    kept = every.with_salient_spans(tokenizer, TINY_PRESET.retriever.query_max_tokens, cfg.max_masks)
    train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", TINY_PRESET, progress=False)
    assert "# REALM-pretrained retriever and reader" in (tmp_path / "run" / "README.md").read_text()
    usage = json.loads((tmp_path / "run" / SENTENCE_USAGE).read_text())
    assert usage == {
        "masking": "salient",
        "salient_spans": "any",
        "sentences": len(every),
        "used": len(kept),
        "share_used": kept.usage()["share_used"],
    }


def test_refresh_policy():
    policy = RefreshPolicy(every_steps=50)
    assert [s for s in range(0, 201) if policy.should_snapshot(s)] == [50, 100, 150, 200]
    assert policy.should_rebuild(100, 50) and policy.should_rebuild(50, None)
    assert not policy.should_rebuild(50, 50) and not policy.should_rebuild(None, 0)
    assert policy.should_reload(3, 4) and not policy.should_reload(4, 4) and not policy.should_reload(4, None)
    frozen = RefreshPolicy(0)
    assert frozen.frozen and not any(frozen.should_snapshot(s) for s in range(1000))
    assert not frozen.should_rebuild(100, None)
    late = RefreshPolicy(every_steps=50, start_step=100)
    assert [s for s in range(0, 201) if late.should_snapshot(s)] == [150, 200]


def test_towers_keep_zero_lr_until_their_start():
    def rates(**schedule) -> list[dict[str, float]]:
        model = torch.nn.ModuleDict({"retriever": torch.nn.Linear(2, 2), "reader": torch.nn.Linear(2, 2)})
        optimizer = bert_optimizer(model, 1.0, prefix_lrs={"retriever.": 0.1})
        scheduler = linear_schedule(optimizer, warmup=2, total=10, start_at={"retriever.": 4}, **schedule)
        seen = []
        for _ in range(10):
            seen.append({g["prefix"]: round(g["lr"], 4) for g in optimizer.param_groups})
            optimizer.step()
            scheduler.step()
        return seen

    plain = rates()
    assert [r["retriever."] for r in plain] == [0, 0, 0, 0, 0.05, 0.1, 0.1, 0.075, 0.05, 0.025]
    assert [r[""] for r in plain] == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
    held = rates(decay_from=6)  # a warm-up phase at the full rate, then the decay over the rest
    assert [r[""] for r in held] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert [r["retriever."] for r in held] == [0, 0, 0, 0, 0.05, 0.1, 0.1, 0.075, 0.05, 0.025]


def test_a_resumed_run_takes_its_learning_rates_from_its_config_not_the_checkpoint(tmp_path):
    """A branch of a run (experiments/pretrain_branch.py) may change a rate: LambdaLR's saved base rates must not win."""
    from realm.training.checkpoints import load_checkpoint, save_checkpoint
    from realm.training.distributed import ONE_PROCESS

    def trainer(tower_lr: float):
        model = torch.nn.ModuleDict({"retriever": torch.nn.Linear(2, 2), "reader": torch.nn.Linear(2, 2)})
        optimizer = bert_optimizer(model, 1.0, prefix_lrs={"retriever.": tower_lr})
        return model, optimizer, linear_schedule(optimizer, warmup=2, total=10, start_at={"retriever.": 4})

    def rates(optimizer, scheduler, steps: int) -> list[float]:
        seen = []
        for _ in range(steps):
            seen.append(round(next(g["lr"] for g in optimizer.param_groups if g["prefix"] == "retriever."), 4))
            optimizer.step()
            scheduler.step()
        return seen

    model, optimizer, scheduler = trainer(0.1)
    assert rates(optimizer, scheduler, 5) == [0, 0, 0, 0, 0.05]
    save_checkpoint(tmp_path, 5, model, optimizer, scheduler, DataPosition(), ONE_PROCESS)
    for tower_lr, expected in ((0.1, [0.1, 0.1, 0.075, 0.05, 0.025]), (0.01, [0.01, 0.01, 0.0075, 0.005, 0.0025])):
        model, optimizer, scheduler = trainer(tower_lr)
        load_checkpoint(tmp_path / "checkpoints" / "step-00000005", model, optimizer, scheduler, ONE_PROCESS)
        assert rates(optimizer, scheduler, 5) == expected


def test_fused_optimizer_matches_reference_adamw():
    """bert_optimizer's fused update is AdamW's: the same weights as the per-op reference after a few steps."""
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    reference_model, initial = copy.deepcopy(fused_model), copy.deepcopy(fused_model)
    fused = bert_optimizer(fused_model, 1e-2)
    assert all(group["fused"] for group in fused.param_groups)
    reference = torch.optim.AdamW(
        [
            {"params": g["params"], "weight_decay": g["weight_decay"]}
            for g in bert_optimizer(reference_model, 1e-2).param_groups
        ],
        lr=1e-2,
        eps=1e-6,
        foreach=False,
    )
    for step in range(5):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        for model, optimizer in ((fused_model, fused), (reference_model, reference)):
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(fused_model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(fused_model[0].weight, initial[0].weight, atol=1e-3)  # the steps did move it


def test_builder_publishes_newer_snapshots(tmp_path, tiny_corpus):
    retriever = Retriever.load("random", TINY_PRESET.retriever)
    save_snapshot(retriever, tmp_path / "snapshots", step=5)
    config = BuilderConfig(TINY_EMBED, IndexConfig(), TINY_PRESET.retriever, refresh_every=5)
    builds = refresh_loop(
        tmp_path / "snapshots", tiny_corpus.folder, tmp_path / "index", config, poll_seconds=0.01, max_builds=1
    )
    assert builds == 1 and index_source_step(tmp_path / "index") == 5
    assert MipsIndex(tmp_path / "index").meta.doc_tower_fingerprint == retriever.doc_fingerprint()
    for step in (10, 15, 20):
        save_snapshot(retriever, tmp_path / "snapshots", step=step)
    assert [p.name for p in list_snapshots(tmp_path / "snapshots")] == ["step-00000015", "step-00000020"]
    refresh_loop(
        tmp_path / "snapshots", tiny_corpus.folder, tmp_path / "index", config, poll_seconds=0.01, max_builds=1
    )
    assert index_source_step(tmp_path / "index") == 20 and current_version(tmp_path / "index") == 2


def test_an_external_builder_is_handed_the_run_and_its_versions_are_used(tmp_path, tiny_corpus):
    """--builder external: the trainer starts no builder, writes builder.json for one running elsewhere, and says
    STOP when training is over; a version that builder publishes is searched by the (resumed) trainer."""
    from realm.recipes.pretrain import train_pretrain

    pretrain = dataclasses.replace(TINY_PRESET.pretrain, refresh_every=2, builder="external")
    preset = dataclasses.replace(TINY_PRESET, pretrain=pretrain)
    run = tmp_path / "run"
    train_pretrain(tiny_corpus.folder, run, "random", "random", preset, progress=False)
    assert not (run / "builder.log").exists() and (run / "snapshots" / STOP_FILE).exists()
    assert {m["index_version"] for m in _metrics(run)} == {1}  # the trainer's own first index
    (run / "snapshots" / STOP_FILE).unlink()  # as if the builder elsewhere had been slower than training
    config = BuilderConfig.load(run / "builder.json")
    assert refresh_loop(run / "snapshots", tiny_corpus.folder, run / "index", config, 0.01, max_builds=1) == 1
    assert index_source_step(run / "index") == 4
    longer = dataclasses.replace(preset, pretrain=dataclasses.replace(pretrain, steps=6))
    train_pretrain(tiny_corpus.folder, run, "random", "random", longer, True, False, allow_config_change=True)
    assert [m["index_version"] for m in _metrics(run) if m["step"] > 4] == [2, 2]


@pytest.mark.slow
def test_builder_and_bootstrap_index_get_identical_configs(tmp_path, tiny_corpus, monkeypatch):
    """The trainer's first index and the builder process's rebuilds are built with the same embed/index settings:
    the builder receives them as JSON (run_dir/builder.json), not a preset name."""
    import subprocess
    import sys

    import realm.index.refresh as refresh
    import realm.recipes.pretrain as recipe

    started = {}

    def fake_start(run_dir, corpus, nice=0):
        started["config"] = BuilderConfig.load(run_dir / "builder.json")
        return subprocess.Popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr(refresh, "start_builder", fake_start)
    embed = dataclasses.replace(TINY_EMBED, batch_size=3, shard_size=5)  # settings no preset name would give
    preset = dataclasses.replace(
        TINY_PRESET, embed=embed, pretrain=dataclasses.replace(TINY_PRESET.pretrain, refresh_every=1)
    )
    recipe.train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", preset, progress=False)
    config = started["config"]
    assert (config.embed, config.index, config.refresh_every) == (embed, preset.index, 1)
    config.save(tmp_path / "builder.json")
    (tmp_path / "run" / "snapshots" / "STOP").unlink()  # left by the trainer's exit
    subprocess.run(
        [
            sys.executable,
            "-m",
            "realm.index.refresh",
            "--config",
            str(tmp_path / "builder.json"),
            "--watch",
            str(tmp_path / "run" / "snapshots"),
            "--corpus",
            str(tiny_corpus.folder),
            "--out",
            str(tmp_path / "run" / "index"),
            "--max-builds",
            "1",
            "--poll-seconds",
            "0.05",
        ],
        check=True,
        capture_output=True,
    )
    bootstrap, rebuilt = (MipsIndex(tmp_path / "run" / "index", version).meta for version in (1, 2))
    assert rebuilt.checkpoint_step == 4 and bootstrap.checkpoint_step == 0
    assert bootstrap.embed == rebuilt.embed == dataclasses.asdict(embed)
    assert (bootstrap.backend, bootstrap.params, bootstrap.storage_dtype) == (
        rebuilt.backend,
        rebuilt.params,
        rebuilt.storage_dtype,
    )


def test_the_builder_stops_when_its_trainer_is_gone_even_if_that_came_before_the_builder_started(tmp_path, tiny_corpus):
    """The trainer names itself (--parent-pid): a builder still importing torch when the trainer was killed must
    not take its new parent (init) for the trainer and run forever."""
    save_snapshot(Retriever.load("random", TINY_PRESET.retriever), tmp_path / "snapshots", step=1)
    config = BuilderConfig(TINY_EMBED, IndexConfig(), TINY_PRESET.retriever, refresh_every=1)
    builds = refresh_loop(
        tmp_path / "snapshots", tiny_corpus.folder, tmp_path / "index", config, poll_seconds=0.01, parent_pid=dead_pid()
    )
    assert builds == 0 and not (tmp_path / "index").exists()


def test_data_order_is_a_function_of_position():
    order = DataOrder(10, seed=3)
    first, position = order.take(DataPosition(), 4)
    second, position = order.take(position, 4)
    third, position = order.take(position, 4)  # crosses into epoch 1
    assert sorted(np.concatenate([first, second, third[:2]]).tolist()) == list(range(10))
    assert position == DataPosition(1, 2)
    again, _ = DataOrder(10, seed=3).take(DataPosition(0, 4), 4)
    assert again.tolist() == second.tolist()


def _metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_resume_after_crash_reproduces_the_same_batches(tmp_path, tiny_corpus, monkeypatch):
    import realm.recipes.pretrain as recipe

    recipe.train_pretrain(tiny_corpus.folder, tmp_path / "straight", "random", "random", TINY_PRESET, progress=False)
    straight = _metrics(tmp_path / "straight")

    original = recipe.save_checkpoint

    def crash_after_step_2(out, step, *args, **kwargs):
        original(out, step, *args, **kwargs)
        if step == 2:
            raise KeyboardInterrupt("simulated kill -9 after the step-2 checkpoint")

    monkeypatch.setattr(recipe, "save_checkpoint", crash_after_step_2)
    with pytest.raises(KeyboardInterrupt):
        recipe.train_pretrain(tiny_corpus.folder, tmp_path / "crashed", "random", "random", TINY_PRESET, progress=False)
    monkeypatch.setattr(recipe, "save_checkpoint", original)
    recipe.train_pretrain(
        tiny_corpus.folder, tmp_path / "crashed", "random", "random", TINY_PRESET, resume=True, progress=False
    )
    resumed = _metrics(tmp_path / "crashed")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert a["accuracy"] == b["accuracy"]
    for name in ("retriever", "reader"):
        assert (tmp_path / "crashed" / name).is_dir()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, corpus: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank))
    torch.set_num_threads(1)
    from realm.recipes.pretrain import train_pretrain

    train_pretrain(corpus, out, "random", "random", TINY_PRESET, progress=False)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(tmp_path, tiny_corpus):
    import torch.multiprocessing as mp

    from realm.recipes.pretrain import train_pretrain

    train_pretrain(tiny_corpus.folder, tmp_path / "single", "random", "random", TINY_PRESET, progress=False)
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tiny_corpus.folder), str(tmp_path / "ddp")), nprocs=2)
    single, ddp = _metrics(tmp_path / "single"), _metrics(tmp_path / "ddp")
    assert [m["step"] for m in ddp] == [1, 2, 3, 4]
    for a, b in zip(single, ddp):  # same global batch, no dropout: the same curve up to float summation order
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)


def test_masked_queries_start_centred_and_the_centre_is_tracked(tmp_path, tiny_corpus):
    """The first mask_center is the mean of a sample of masked training queries (so their centred mean is 0);
    training then moves it; momentum 0 turns centring off."""
    from realm.data.sentences import SentenceSet, build_sentences, sentences_path
    from realm.models.realm import CENTER_SAMPLE, estimate_mask_center, pad_queries
    from realm.recipes.pretrain import train_pretrain

    cfg = TINY_PRESET.pretrain
    retriever = Retriever.load("random", TINY_PRESET.retriever)
    build_sentences(tiny_corpus, progress=False)
    sentences = SentenceSet(sentences_path(tiny_corpus), 0.0)
    assert len(sentences) < CENTER_SAMPLE  # the tiny corpus: every sentence is in the sample
    estimate_mask_center(retriever, sentences, cfg, TINY_PRESET.retriever.query_max_tokens, torch.device("cpu"))
    assert retriever.query_tower.mask_center.norm() > 0.1
    rng = np.random.default_rng(cfg.seed)
    rows = rng.choice(len(sentences), len(sentences), replace=False)
    queries = [
        mask_sentence(sentences.texts[i], sentences.spans[i], cfg.masking, retriever.tokenizer, 32, cfg.max_masks, rng)
        for i in rows
    ]
    centred = retriever.query_vectors(pad_queries(queries, retriever.tokenizer.pad_token_id)[0])
    assert np.abs(centred.mean(0)).max() < 1e-4

    train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", TINY_PRESET, progress=False)
    trained = Retriever.load(str(tmp_path / "run" / "retriever"), TINY_PRESET.retriever).query_tower.mask_center
    assert trained.norm() > 0.1 and not torch.allclose(trained, retriever.query_tower.mask_center)
    off = dataclasses.replace(TINY_PRESET, pretrain=dataclasses.replace(cfg, mask_center_momentum=0.0, steps=1))
    train_pretrain(tiny_corpus.folder, tmp_path / "off", "random", "random", off, progress=False)
    assert not Retriever.load(str(tmp_path / "off" / "retriever"), off.retriever).query_tower.mask_center.any()


def test_null_only_baseline_trains_without_an_index(tmp_path, tiny_corpus):
    """--num-candidates 1 is masked-LM with the null document alone: no index, no builder."""
    from realm.recipes.pretrain import train_pretrain

    preset = dataclasses.replace(
        TINY_PRESET, pretrain=dataclasses.replace(TINY_PRESET.pretrain, num_candidates=1, steps=2, refresh_every=5)
    )
    train_pretrain(tiny_corpus.folder, tmp_path / "null", "random", "random", preset, progress=False)
    metrics = _metrics(tmp_path / "null")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["p_null"] == 1.0 for m in metrics)
    assert "index_version" not in metrics[0] and not (tmp_path / "null" / "index").exists()


def test_null_warmup_reads_the_null_document_then_retrieves(tmp_path, tiny_corpus):
    """The first null_warmup_steps train the reader on the null document alone; retrieval starts after them."""
    from realm.recipes.pretrain import train_pretrain

    preset = dataclasses.replace(TINY_PRESET, pretrain=dataclasses.replace(TINY_PRESET.pretrain, null_warmup_steps=2))
    train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", preset, progress=False)
    metrics = _metrics(tmp_path / "run")
    assert [m["p_null"] == 1.0 for m in metrics] == [True, True, False, False]
    assert all(m["index_version"] == 1 for m in metrics)  # the first index is built before the warm-up
    assert Retriever.load(str(tmp_path / "run"), TINY_PRESET.retriever).null_score != 0.0  # b_null trained, saved


def test_a_fixed_document_tower_keeps_the_first_index_exact(tmp_path, tiny_corpus):
    """--doc-tower fixed: the query tower trains, the document tower (and so the index built from it) does not, and
    nothing is refreshed whatever `refresh_every` says."""
    from realm.recipes.pretrain import train_pretrain

    start = Retriever.load("random", TINY_PRESET.retriever)
    fixed = dataclasses.replace(TINY_PRESET.pretrain, doc_tower="fixed", refresh_every=1)
    preset = dataclasses.replace(TINY_PRESET, pretrain=fixed)
    train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", preset, progress=False)
    trained = Retriever.load(str(tmp_path / "run"), TINY_PRESET.retriever)
    assert trained.doc_fingerprint() == start.doc_fingerprint()
    assert MipsIndex(tmp_path / "run" / "index").meta.doc_tower_fingerprint == start.doc_fingerprint()
    assert trained.query_tower.fingerprint() != start.query_tower.fingerprint()
    metrics = _metrics(tmp_path / "run")
    assert [m["index_version"] for m in metrics] == [1, 1, 1, 1]
    assert not any("staleness_steps" in m or "builder_alive" in m for m in metrics)  # never stale, no builder
    assert not list((tmp_path / "run" / "snapshots").glob("step-*"))  # no builder was fed


def test_a_zero_tower_learning_rate_keeps_the_towers(tmp_path, tiny_corpus):
    """--retriever-lr 0 holds both towers at their start (0 is a rate, not "unset": the reader's lr is not used)."""
    from realm.recipes.pretrain import train_pretrain

    start = Retriever.load("random", TINY_PRESET.retriever)
    preset = dataclasses.replace(TINY_PRESET, pretrain=dataclasses.replace(TINY_PRESET.pretrain, retriever_lr=0.0))
    train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", preset, progress=False)
    trained = Retriever.load(str(tmp_path / "run"), TINY_PRESET.retriever)
    assert trained.query_tower.fingerprint() == start.query_tower.fingerprint()
    assert trained.doc_fingerprint() == start.doc_fingerprint()


@pytest.mark.slow
def test_training_survives_a_dead_builder(tmp_path, tiny_corpus, monkeypatch):
    import subprocess
    import sys

    import realm.index.refresh as refresh
    import realm.recipes.pretrain as recipe

    monkeypatch.setattr(
        refresh, "start_builder", lambda *a, **kw: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    )
    preset = dataclasses.replace(TINY_PRESET, pretrain=dataclasses.replace(TINY_PRESET.pretrain, refresh_every=1))
    recipe.train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", preset, progress=False)
    metrics = _metrics(tmp_path / "run")
    assert [m["index_version"] for m in metrics] == [1, 1, 1, 1]  # the bootstrap index, never replaced
    assert [m["staleness_steps"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[-1]["builder_alive"] == 0.0
    assert len(list((tmp_path / "run" / "snapshots").glob("step-*"))) == 2  # snapshots kept coming


def test_masked_span_accuracy_with_and_without_retrieval(tmp_path, tiny_corpus):
    from realm.common.deadline import Deadline, TimeLimit
    from realm.data.recoverable import SpanFinder
    from realm.data.sentences import SentenceSet, build_sentences
    from realm.eval.mlm import masked_span_accuracy
    from realm.index.build import build_index
    from realm.index.embed import BlockEmbedder
    from realm.models.mlm_reader import Reader
    from realm.models.realm import RealmModel

    model = RealmModel(Retriever.load("random", TINY_PRESET.retriever), Reader.load("random", NO_DROPOUT_SHAPE))
    embedder = BlockEmbedder(model.retriever.doc_tower, model.retriever.tokenizer, tiny_corpus.config, TINY_EMBED)
    build_index(
        tiny_corpus,
        embedder,
        model.retriever.doc_fingerprint(),
        tmp_path / "index",
        TINY_EMBED,
        IndexConfig(),
        model.retriever.config,
        progress=False,
    )
    sentences = SentenceSet(build_sentences(tiny_corpus, progress=False), 0.0)
    alone = masked_span_accuracy(model, sentences, tiny_corpus, None, 3, 32)
    retrieved = masked_span_accuracy(model, sentences, tiny_corpus, MipsIndex(tmp_path / "index"), 3, 32)
    assert alone["sentences"] == retrieved["sentences"] == len(sentences) > 0
    assert alone["p_null"] == 1.0 and alone["utility"] == 0.0 and retrieved["p_null"] < 1.0
    assert 0 <= retrieved["span_accuracy"] <= 100 and 0 <= retrieved["token_accuracy"] <= 100
    # the paired baseline inside the retrieval pass is the null-only pass, mask for mask
    assert retrieved["null_token_accuracy"] == pytest.approx(alone["token_accuracy"], abs=1e-9)
    assert alone["retrieval_gain"] == 0 and alone["retrieval_gain_95ci"] == [0, 0]
    low, high = retrieved["retrieval_gain_95ci"]
    assert low <= retrieved["retrieval_gain"] <= high
    assert retrieved["retrieval_gain"] == pytest.approx(retrieved["token_accuracy"] - alone["token_accuracy"])
    per_sentence = retrieved["per_sentence_gain"]  # what runs scored on the same masks compare, paired
    assert len(per_sentence) == retrieved["sentences"] and np.mean(per_sentence) == pytest.approx(
        retrieved["retrieval_gain"]
    )
    # every salient span in turn: more masks, the same sentences resampled together
    each = masked_span_accuracy(model, sentences, tiny_corpus, MipsIndex(tmp_path / "index"), 3, 32, every_span=True)
    with_spans = sum(1 for spans in sentences.spans if spans)
    assert each["sentences"] <= with_spans and each["spans"] >= each["sentences"] > 0
    # a stage already past its allotment scores its least (here: the first batch's sentences), then stops
    late = TimeLimit(Deadline(time.time() - 1.0), least=1)
    cut = masked_span_accuracy(model, sentences, tiny_corpus, None, 3, 32, batch_size=2, every_span=True, until=late)
    assert 0 < cut["sentences"] <= 2 < each["sentences"] and cut["spans"] == 2
    assert each["retrieval_gain"] == pytest.approx(each["token_accuracy"] - each["null_token_accuracy"])
    low, high = each["retrieval_gain_95ci"]
    assert low <= each["retrieval_gain"] <= high
    # split by where the span is: retrieved (a candidate holds it), else recoverable (another document does), else not
    finder = SpanFinder(tiny_corpus, model.retriever.tokenizer)
    split = masked_span_accuracy(
        model, sentences, tiny_corpus, MipsIndex(tmp_path / "index"), 3, 32, every_span=True, finder=finder
    )
    groups = split["by_recoverability"]
    assert list(groups) == ["retrieved", "recoverable_not_retrieved", "not_recoverable"]
    assert sum(g["spans"] for g in groups.values()) == split["spans"] == each["spans"]
    assert split["retrieved_share"] == pytest.approx(100 * groups["retrieved"]["spans"] / split["spans"])
    assert split["recoverable_share"] >= split["retrieved_share"]
    assert all(
        g["retrieval_gain_95ci"][0] <= g["retrieval_gain"] <= g["retrieval_gain_95ci"][1] for g in groups.values()
    )


def test_ict_trains_both_towers_and_resumes(tmp_path, tiny_corpus):
    from realm.recipes.ict import ict_pair, train_ict

    query, context = ict_pair("First sentence here. Second one follows. Third ends it.", np.random.default_rng(0), 1.0)
    assert query and query not in context  # removed from its context
    preset = dataclasses.replace(
        TINY_PRESET, ict=dataclasses.replace(TINY_PRESET.ict, steps=2, batch_size=4, checkpoint_every=1, log_every=1)
    )
    folder = train_ict(tiny_corpus.folder, tmp_path / "ict", "random", preset, progress=False, steps=2)
    trained = Retriever.load(str(folder), TINY_PRESET.retriever)
    assert trained.doc_fingerprint() != Retriever.load("random", TINY_PRESET.retriever).doc_fingerprint()
    with pytest.raises(ValueError, match="ict.steps"):  # a longer run is another schedule: said, not mixed in
        train_ict(tiny_corpus.folder, tmp_path / "ict", "random", preset, resume=True, progress=False, steps=3)
    train_ict(
        tiny_corpus.folder,
        tmp_path / "ict",
        "random",
        preset,
        resume=True,
        progress=False,
        steps=3,
        allow_config_change=True,
    )
    assert [m["step"] for m in _metrics(tmp_path / "ict")] == [1, 2, 3]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: realm\n") and "# ICT retriever" in card and '"steps": 3' in card


def test_the_context_warmup_reads_the_own_block_without_the_sentence(tmp_path, tiny_corpus):
    """--reader-warmup context: the warm-up's one block is the sentence's own, with the sentence cut out; retrieval
    (and recoverability, logged per step) starts after it."""
    from realm.data.sentences import OwnBlocks, SentenceSet, build_sentences
    from realm.recipes.pretrain import train_pretrain

    sentences = SentenceSet(build_sentences(tiny_corpus, progress=False), 0.0)
    own = OwnBlocks(tiny_corpus)
    for doc_id, text in zip(sentences.doc_ids, sentences.texts):
        block, body = own.without(doc_id, text)
        assert tiny_corpus.take([block])[0].doc_id == doc_id and text in tiny_corpus.take([block])[0].body
        assert text not in body and len(body) < len(tiny_corpus.take([block])[0].body)
    assert own.without("paris", "Not a sentence of Paris.") == (-1, "")
    # a window keeps that many words each side of the sentence: the copy reading still holds it, the context not
    narrow = OwnBlocks(tiny_corpus, window=2)
    for doc_id, text in zip(sentences.doc_ids, sentences.texts):
        block, body = own.holding(doc_id, text)
        head, _, tail = body.partition(text)
        assert narrow.holding(doc_id, text) == (block, " ".join([*head.split()[-2:], text, *tail.split()[:2]]))
        assert narrow.without(doc_id, text) == (block, " ".join([*head.split()[-2:], *tail.split()[:2]]))
    assert any(
        len(narrow.holding(d, t)[1]) < len(own.holding(d, t)[1]) for d, t in zip(sentences.doc_ids, sentences.texts)
    )
    cfg = dataclasses.replace(TINY_PRESET.pretrain, null_warmup_steps=2, reader_warmup="context")
    train_pretrain(tiny_corpus.folder, tmp_path / "run", "random", "random", dataclasses.replace(TINY_PRESET, pretrain=cfg),
                   progress=False)  # fmt: skip
    metrics = _metrics(tmp_path / "run")
    assert [m["p_null"] for m in metrics[:2]] == [0.5, 0.5]  # b_null waits for retrieval; the own block is read
    assert all(m["utility"] != 0.0 for m in metrics[:2])
    assert ["span_recoverable" in m for m in metrics] == [False, False, True, True]
    assert all(0 <= m["span_retrieved"] <= m["span_recoverable"] <= 1 for m in metrics[2:])
