"""Retriever towers: pooling, checkpoints loadable by plain transformers, fingerprints, batching."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import TINY_CORPUS, TINY_RETRIEVER
from transformers import BertModel

from realm.config import EmbedConfig
from realm.index.embed import BlockEmbedder
from realm.models.encoder import encode
from realm.models.retriever import Retriever, pool


def test_pool_mean_ignores_padding():
    hidden = torch.tensor([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]]])  # (B=1, L=3, H=2)
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(pool(hidden, mask, "mean"), torch.tensor([[2.0, 2.0]]))
    assert torch.equal(pool(hidden, mask, "cls"), torch.tensor([[1.0, 1.0]]))


def test_mean_pooling_leaves_mask_positions_out(tiny_retriever):
    """A masked query is embedded by the words it has: [MASK] positions are not averaged in (see the module doc)."""
    tower = tiny_retriever.query_tower.eval()
    inputs = tiny_retriever.encode_queries(["who wrote [MASK] [MASK] in 1600?"])
    mask_id = tiny_retriever.tokenizer.mask_token_id
    assert (inputs["input_ids"] == mask_id).sum() == 2
    with torch.no_grad():
        hidden = encode(tower.bert, **inputs)
        kept = pool(hidden, inputs["attention_mask"] * (inputs["input_ids"] != mask_id), "mean")
        averaged_in = pool(hidden, inputs["attention_mask"], "mean")
        assert torch.allclose(tower(**inputs), tower.layer_norm(tower.projection(kept)), atol=1e-5)
        assert not torch.allclose(tower(**inputs), tower.layer_norm(tower.projection(averaged_in)), atol=1e-3)


def test_only_queries_holding_mask_are_centred_and_the_centre_is_saved(tmp_path):
    retriever = Retriever.load("random", TINY_RETRIEVER)
    tower = retriever.query_tower.eval()
    plain, masked = ["who wrote hamlet in 1600?"], ["who wrote [MASK] in 1600?"]
    before = (retriever.embed_queries(plain), retriever.embed_queries(masked))
    fingerprint = retriever.doc_fingerprint()
    center = torch.linspace(-1, 1, TINY_RETRIEVER.proj_dim)
    tower.track_mask_center(center[None], 1.0)  # momentum 1: replace
    assert torch.allclose(tower.mask_center, center)
    assert torch.equal(retriever.embed_queries(plain), before[0])  # a question is never moved
    assert torch.allclose(retriever.embed_queries(masked), before[1] - center, atol=1e-6)
    tower.track_mask_center(torch.zeros(3, TINY_RETRIEVER.proj_dim), 0.25)  # an exponential moving average
    assert torch.allclose(tower.mask_center, 0.75 * center)
    assert retriever.doc_fingerprint() == fingerprint  # the index built before stays valid
    retriever.save(tmp_path / "ckpt")
    again = Retriever.load(str(tmp_path / "ckpt"), TINY_RETRIEVER)
    assert torch.allclose(again.query_tower.mask_center, 0.75 * center)
    assert not again.doc_tower.mask_center.any()


def test_towers_project_to_layer_normed_128d_shape(tiny_retriever):
    q = tiny_retriever.embed_queries(["who wrote hamlet?", "capital of france"])
    assert q.shape == (2, TINY_RETRIEVER.proj_dim) and q.dtype == torch.float32
    # LayerNorm output (gain sqrt(20/d), bias 0 at the warm start): zero mean, f(x, x) = 20 per row.
    assert torch.allclose(q.mean(-1), torch.zeros(2), atol=1e-5)
    assert torch.allclose((q * q).sum(-1), torch.full((2,), 20.0), atol=1e-2)


def test_warm_start_is_deterministic_and_towers_start_aligned(tiny_retriever):
    again = Retriever.load("random", TINY_RETRIEVER)
    assert again.doc_fingerprint() == tiny_retriever.doc_fingerprint()
    assert torch.equal(tiny_retriever.query_tower.projection.weight, tiny_retriever.doc_tower.projection.weight)
    assert tiny_retriever.query_tower.projection.weight is not tiny_retriever.doc_tower.projection.weight


def test_checkpoint_roundtrip_and_plain_bert_loading(tmp_path, tiny_retriever):
    folder = tmp_path / "ckpt"
    tiny_retriever.save(folder)
    for tower in ("query_tower", "doc_tower"):
        bert = BertModel.from_pretrained(folder / tower)  # each tower is a plain Hugging Face BertModel
        assert bert.config.hidden_size == 32
    loaded = Retriever.load(str(folder), dataclasses.replace(TINY_RETRIEVER, pooling="cls"))
    assert loaded.config == TINY_RETRIEVER  # the checkpoint's own config wins over the preset's
    assert loaded.doc_fingerprint() == tiny_retriever.doc_fingerprint()
    queries = ["when did bach die", "nile length"]
    assert torch.allclose(loaded.embed_queries(queries), tiny_retriever.embed_queries(queries), atol=1e-6)
    assert json.loads((folder / "realm.json").read_text())["doc_tower_fingerprint"] == loaded.doc_fingerprint()
    # Saving again over the same folder replaces it cleanly.
    loaded.save(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    # A training output (retriever/ beside reader/) loads as its retriever.
    tiny_retriever.save(tmp_path / "run" / "retriever")
    assert Retriever.load(str(tmp_path / "run"), TINY_RETRIEVER).doc_fingerprint() == tiny_retriever.doc_fingerprint()


def test_fingerprint_tracks_doc_tower_only(tiny_retriever):
    model = Retriever.load("random", TINY_RETRIEVER)
    before = model.doc_fingerprint()
    with torch.no_grad():
        model.query_tower.projection.weight.add_(1.0)  # fine-tuning moves only the query tower
    assert model.doc_fingerprint() == before
    with torch.no_grad():
        model.doc_tower.bert.encoder.layer[0].output.dense.bias.add_(1e-3)
    assert model.doc_fingerprint() != before
    assert Retriever.load("random", dataclasses.replace(TINY_RETRIEVER, pooling="cls")).doc_fingerprint() != before


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="unknown model"):
        Retriever.load(str(tmp_path / "nope"), TINY_RETRIEVER)


def test_bucketed_batches_equal_one_at_a_time(tiny_retriever):
    """Length bucketing and padding must not change any block's embedding."""
    titles = ["Paris", "Tokyo", "Nile", "Bach", "Moon"]
    bodies = ["Paris is the capital of France.", "Tokyo " * 20, "Long river.", "Composer " * 30, "Satellite."]
    embedder = BlockEmbedder(
        tiny_retriever.doc_tower, tiny_retriever.tokenizer, TINY_CORPUS, EmbedConfig(batch_size=3, compute_dtype="fp32")
    )
    batched = embedder.embed(titles, bodies)
    single = [embedder.embed([t], [b])[0] for t, b in zip(titles, bodies)]
    assert np.allclose(batched, np.stack(single), atol=1e-5)
    # The embedder works on a copy: the retriever's own tower keeps fp32 weights.
    assert next(tiny_retriever.doc_tower.parameters()).dtype == torch.float32


def test_bf16_embeddings_close_to_fp32(tiny_retriever):
    args = (tiny_retriever.doc_tower, tiny_retriever.tokenizer, TINY_CORPUS)
    titles, bodies = ["Paris", "Moon"], ["Paris is the capital of France.", "The Moon orbits Earth."]
    fp32 = BlockEmbedder(*args, EmbedConfig(compute_dtype="fp32")).embed(titles, bodies)
    bf16 = BlockEmbedder(*args, EmbedConfig(compute_dtype="bf16")).embed(titles, bodies)
    cosine = (fp32 * bf16).sum(1) / ((fp32**2).sum(1) * (bf16**2).sum(1)) ** 0.5
    assert (cosine > 0.99).all()
