"""What the models compute, against the paper and the released code: seeds, fp32 retrieval scores, the paper
preset's objective (the null document, pooling, dropout, no centring)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import TINY_RETRIEVER, TINY_SHAPE

from realm.config import get_preset
from realm.data.sentences import mask_sentence
from realm.models import realm as realm_module
from realm.models import retriever as retriever_module
from realm.models.ict import ICTModel
from realm.models.mlm_reader import Reader
from realm.models.orqa import QABatch, QAModel
from realm.models.realm import RealmModel, make_batch
from realm.models.retriever import Retriever
from realm.models.span_reader import SpanReader

DROPOUT_SHAPE = dataclasses.replace(TINY_SHAPE, dropout=0.1)
PAPER_RETRIEVER = dataclasses.replace(
    get_preset("paper").retriever, proj_dim=16, query_max_tokens=32, shape=dataclasses.replace(TINY_SHAPE, dropout=0.0)
)


# -- seeds ----------------------------------------------------------------------------------------------------------
def test_loading_a_model_leaves_the_callers_random_state_alone():
    """Fresh heads come from their own seed without reseeding the process: cf41f60 called torch.manual_seed(constant)
    in Reader.load, SpanReader.load and random_bert, after the recipe had seeded each rank with --seed + rank."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    Reader.load("random", DROPOUT_SHAPE)
    SpanReader.load("minilm", span_hidden=16)
    Retriever.load("random", TINY_RETRIEVER)
    assert torch.equal(torch.get_rng_state(), before)


def _dropout_draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A recipe's order: seed the process, load the reader, then a training forward. Returns the masked-LM log
    probabilities (dropout on) and the fresh head's weights."""
    torch.manual_seed(seed)
    reader = Reader.load("random", DROPOUT_SHAPE).train()
    ids = torch.tensor([[101, 2054, 103, 2003, 1996, 3007, 102]])
    ones = torch.ones_like(ids)
    out = reader.mask_log_probs(ids, ones, torch.zeros_like(ids), torch.tensor([[2]]))
    return out.detach(), reader.mlm.cls.predictions.transform.dense.weight.detach().clone()


def test_the_seed_decides_dropout_and_ranks_draw_different_masks():
    """--seed changes dropout; the recipes seed rank r with seed + r, so two DDP ranks (seed 0 + rank 0, seed 0 +
    rank 1) draw different masks. The fresh head is the same whatever the seed."""
    (rank0, head0), (again, _), (rank1, head1) = _dropout_draw(0), _dropout_draw(0), _dropout_draw(0 + 1)
    assert torch.equal(rank0, again)
    assert not torch.allclose(rank0, rank1)
    assert torch.equal(head0, head1)


# -- fp32 retrieval scores ------------------------------------------------------------------------------------------
@pytest.fixture
def bf16_bodies(monkeypatch):
    """Every tower's BERT body returns bf16 hidden states, as under bf16 autocast, with or without autocast: the
    reference then sees exactly the hidden states the fast path sees, and only the retrieval head differs."""

    def encode(bert, input_ids, attention_mask, token_type_ids):
        with torch.autocast("cpu", enabled=False):
            hidden = bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return hidden.last_hidden_state.to(torch.bfloat16)

    monkeypatch.setattr(retriever_module, "encode", encode)


def _reference_embedding(tower, inputs: dict) -> torch.Tensor:
    """float64: pool -> dense -> LayerNorm of the same bf16 hidden states (eval mode, no dropout)."""
    hidden = retriever_module.encode(tower.bert, **inputs).double()
    mask = inputs["attention_mask"] * (inputs["input_ids"] != tower.mask_token_id)
    if tower.pooling == "pooler":
        dense = tower.bert.pooler.dense
        pooled = torch.tanh(hidden[:, 0] @ dense.weight.double().T + dense.bias.double())
    else:
        pooled = retriever_module.pool(hidden, mask, tower.pooling)
    projected = pooled @ tower.projection.weight.double().T + tower.projection.bias.double()
    norm = tower.layer_norm
    normed = (projected - projected.mean(-1, keepdim=True)) / torch.sqrt(
        projected.var(-1, unbiased=False, keepdim=True) + norm.eps
    )
    return normed * norm.weight.double() + norm.bias.double()


def _scaled(config) -> Retriever:
    """A retriever whose scores reach ~30, where bf16 keeps steps of 0.125-0.25."""
    retriever = Retriever.load("random", config).eval()
    for tower in (retriever.query_tower, retriever.doc_tower):
        torch.nn.init.constant_(tower.layer_norm.weight, 1.4)
    return retriever


TEXTS = ["Paris is the capital of France.", "The Nile flows into the Mediterranean Sea.", "Bach was born in 1685."]


@pytest.mark.parametrize("config", [TINY_RETRIEVER, PAPER_RETRIEVER], ids=["cpu", "paper"])
def test_ict_and_orqa_scores_are_fp32_under_bf16_autocast(bf16_bodies, config):
    retriever = _scaled(config)
    inputs = dict(retriever.tokenizer(TEXTS, padding=True, return_tensors="pt", return_token_type_ids=True))
    q_ref = _reference_embedding(retriever.query_tower, inputs)
    d_ref = _reference_embedding(retriever.doc_tower, inputs)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ict = ICTModel(retriever).logits(inputs, inputs)
        beam = d_ref.float()[None].expand(len(TEXTS), -1, -1)  # (B, R, D) stored document vectors
        qa = QAModel(retriever, SpanReader.load("minilm", span_hidden=16))
        bm25 = torch.rand(len(TEXTS), len(TEXTS), generator=torch.Generator().manual_seed(0)) * 10
        batch = QABatch(
            inputs,
            beam,
            bm25,
            torch.ones(3, 3, dtype=torch.bool),
            torch.ones(3, 3, dtype=torch.bool),
            qa.reader_inputs(["what"], [["x"]], 8)[0],
            torch.zeros(1, 1, dtype=torch.bool),
        )
        orqa = qa.beam_logits(batch)
    reference = q_ref @ d_ref.T  # (B, B)
    assert reference.abs().max() > 15  # scores where bf16 would round by 0.06-0.125
    assert ict.dtype == orqa.dtype == torch.float32
    assert torch.allclose(ict.double(), reference, atol=1e-5, rtol=0)
    fused = reference + float(qa.bm25_weight.detach()) * bm25.double()
    assert torch.allclose(orqa.double(), fused, atol=1e-5, rtol=0)


@pytest.mark.parametrize("config", [TINY_RETRIEVER, PAPER_RETRIEVER], ids=["cpu", "paper"])
def test_realm_scores_are_fp32_under_bf16_autocast(bf16_bodies, monkeypatch, tiny_corpus, tokenizer, config):
    retriever = _scaled(config)
    model = RealmModel(retriever, Reader.load("random", TINY_SHAPE)).eval()
    captured = []
    for name in ("retrieval_log_probs", "scored_log_probs"):
        original = getattr(realm_module, name)
        monkeypatch.setattr(
            realm_module, name, lambda logits, *rest, f=original: captured.append(logits) or f(logits, *rest)
        )
    rng = np.random.default_rng(0)
    queries = [mask_sentence(text, [], "random-span", tokenizer, 32, 3, rng) for text in TEXTS[:2]]
    batch = make_batch(queries, np.array([[0, 1, 2], [3, 1, 4]]), tiny_corpus, tokenizer, tiny_corpus.config)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(batch)
    q_ref = _reference_embedding(retriever.query_tower, batch.query)  # (B, D)
    d_ref = _reference_embedding(retriever.doc_tower, batch.docs).view(2, 3, -1)  # (B, K-1, D)
    reference = torch.einsum("bd,bkd->bk", q_ref, d_ref)
    if config.null_document == "scored":  # f(x, null) first, the null document an empty block
        null = {
            k: v
            for k, v in zip(
                ("input_ids", "attention_mask", "token_type_ids"),
                (torch.tensor([[101, 102, 102]]), torch.ones(1, 3, dtype=torch.long), torch.tensor([[0, 0, 1]])),
            )
        }
        reference = torch.cat([q_ref @ _reference_embedding(retriever.doc_tower, null).T, reference], dim=1)
    (logits,) = captured
    assert logits.dtype == torch.float32 and reference.abs().max() > 4  # bf16 steps of 0.03 and more
    assert torch.allclose(logits.double(), reference, atol=1e-5, rtol=0)


# -- the paper preset -----------------------------------------------------------------------------------------------
def test_the_paper_preset_holds_the_papers_objective():
    paper = get_preset("paper")
    assert (paper.retriever.pooling, paper.retriever.dropout_position, paper.retriever.null_document) == (
        "pooler",
        "embedding",
        "scored",
    )
    assert paper.pretrain.mask_center_momentum == 0.0  # no centring of masked queries
    assert (paper.corpus.max_block_tokens, paper.retriever.query_max_tokens, paper.retriever.proj_dim) == (288, 96, 128)
    assert (paper.pretrain.num_candidates, paper.pretrain.max_masks, paper.pretrain.lr) == (8, 10, 3e-5)


def test_paper_towers_pool_with_bert_pooler_and_drop_out_after_the_layer_norm(tokenizer):
    """Embed(x) = LayerNorm(W · tanh(W_pool h_[CLS] + b)), then dropout (the released code's order)."""
    config = dataclasses.replace(PAPER_RETRIEVER, dropout=0.5)
    tower = Retriever.load("random", config).query_tower
    assert tower.bert.pooler is not None
    inputs = dict(tokenizer(TEXTS, padding=True, return_tensors="pt", return_token_type_ids=True))
    with torch.no_grad():
        tower.eval()
        clean = tower(**inputs)
        hidden = tower.bert(**inputs).last_hidden_state
        expected = tower.layer_norm(tower.projection(torch.tanh(tower.bert.pooler.dense(hidden[:, 0]))))
        assert torch.allclose(clean, expected, atol=1e-5)
        tower.train()
        tower.bert.eval()  # only the tower's own dropout
        torch.manual_seed(0)
        dropped = tower(**inputs)
    kept = dropped != 0
    assert 0.3 < kept.float().mean() < 0.7  # whole embedding entries are dropped: dropout after the LayerNorm
    assert torch.allclose(dropped[kept], clean[kept] / 0.5, atol=1e-5)


def test_the_paper_null_document_is_scored_by_the_towers(tiny_corpus, tokenizer):
    """p(z | x) = softmax over [f(x, null), f(x, z_1), ...], f(x, null) = Embed_input(x) · Embed_doc([CLS] [SEP]
    [SEP]): p(null | x) depends on x, and there is no learned b_null."""
    retriever = _scaled(PAPER_RETRIEVER)
    model = RealmModel(retriever, Reader.load("random", TINY_SHAPE)).eval()
    assert not hasattr(model, "null_score")
    rng = np.random.default_rng(0)
    queries = [mask_sentence(text, [], "random-span", tokenizer, 32, 3, rng) for text in TEXTS[:2]]
    batch = make_batch(queries, np.array([[0, 1, 2], [3, 1, -1]]), tiny_corpus, tokenizer, tiny_corpus.config)
    with torch.no_grad():
        _, stats = model(batch)
        q = retriever.query_tower(**batch.query)
        d = retriever.doc_tower(**batch.docs).view(2, 3, -1)
        empty = dict(tokenizer([""], [""], return_tensors="pt", return_token_type_ids=True))
        assert empty["input_ids"].tolist() == [[101, 102, 102]]
        null = retriever.doc_tower(**empty)  # (1, D)
    logits = torch.cat([q @ null.T, torch.einsum("bd,bkd->bk", q, d)], dim=1)
    logits[1, 3] = float("-inf")  # the second sentence has two retrieved blocks
    assert torch.allclose(stats["log_pz"], torch.log_softmax(logits, dim=1), atol=1e-5)
    assert not torch.isclose(stats["log_pz"][0, 0], stats["log_pz"][1, 0])  # p(null | x) depends on x


def test_one_block_a_row_under_b_null_skips_the_document_tower(tiny_corpus, tokenizer):
    """With b_null (the cpu preset) and one block a row, the warm-up's, p(z | x) = 1 - sigmoid(b_null) whatever
    f(x, z): the loss and p(z | x) are those of scores computed in full, and the document tower does not run."""
    retriever = _scaled(TINY_RETRIEVER)
    model = RealmModel(retriever, Reader.load("random", TINY_SHAPE)).eval()
    rng = np.random.default_rng(0)
    queries = [mask_sentence(text, [], "random-span", tokenizer, 32, 3, rng) for text in TEXTS[:2]]
    batch = make_batch(queries, np.array([[0], [3]]), tiny_corpus, tokenizer, tiny_corpus.config)
    calls = []
    retriever.doc_tower.register_forward_hook(lambda *_: calls.append(1))
    loss, stats = model(batch)
    assert not calls
    with torch.no_grad():
        f = torch.einsum("bd,bd->b", retriever.query_tower(**batch.query), retriever.doc_tower(**batch.docs))
    assert f.abs().min() > 0  # the scores it skipped were not zero
    full = realm_module.retrieval_log_probs(f[:, None], batch.candidate_mask, model.null_score)
    assert torch.allclose(stats["log_pz"], full, atol=1e-6)
    expected, _ = realm_module.marginal_mlm_loss(full, stats["token_log_probs"], batch.mask_valid)
    assert torch.allclose(loss, expected, atol=1e-6)
