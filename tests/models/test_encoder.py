"""The packed encoder (models/encoder.py) against Hugging Face's BertModel.forward, the reference.

Tolerances: in fp32 the packed forward equals the reference to 1e-5 (only summation order differs); the
trainers' fast path (packed, bf16 autocast) gives each loss within 0.5% of the fp32 reference on a fixed batch,
dropout off (the losses are 10-15 nats; bf16 keeps 8 bits of mantissa)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_SHAPE

from realm.data.sentences import mask_sentence
from realm.models import encoder, mlm_reader, retriever, span_reader
from realm.models.bert import random_bert
from realm.models.encoder import dropout, encode
from realm.models.ict import ICTModel
from realm.models.mlm_reader import Reader
from realm.models.orqa import QABatch, QAModel
from realm.models.realm import RealmModel, make_batch
from realm.models.retriever import Retriever
from realm.models.span_reader import SpanReader

LOSS_TOLERANCE = 0.005  # relative, bf16 packed vs fp32 reference (measured: 5e-4 ICT, 2e-4 REALM, 3e-4 QA)


def hf_forward(bert, input_ids, attention_mask, token_type_ids):
    return bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


def ragged_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    length = max(lengths)
    ids = torch.randint(1000, 20000, (len(lengths), length), generator=generator)
    mask = (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(length)[None] >= 3).long().expand(len(lengths), -1) * mask
    return ids * mask, mask, types


def assert_inference_equals_bert_forward(bert, ids, mask, types) -> None:
    """Without gradients, `encode` equals BertModel.forward on every real token (fp32) and is zero at padding."""
    with torch.no_grad():
        reference = hf_forward(bert, ids, mask, types)
        encoded = encode(bert, ids, mask, types)
    real = mask.bool()
    torch.testing.assert_close(encoded[real], reference[real], rtol=1e-5, atol=1e-5)
    assert encoded[~real].abs().max() == 0


@pytest.fixture(params=["one bucket", "a bucket per length"])
def bucketing(request, monkeypatch):
    """The default cost keeps these short rows in one attention bucket; no overhead splits them by length."""
    if request.param == "a bucket per length":
        monkeypatch.setattr(encoder, "BUCKET_OVERHEAD", 0)
    return request.param


def test_length_buckets_pay_padding_only_where_it_is_cheaper_than_a_bucket(monkeypatch):
    monkeypatch.setattr(encoder, "BUCKET_OVERHEAD", 100)
    assert encoder.length_buckets([10, 10, 10]) == [[0, 1, 2]]
    assert encoder.length_buckets([9, 10, 8, 10]) == [[2, 0, 1, 3]]  # 2 * (100 - 81) < 100: one bucket
    assert encoder.length_buckets([30, 2, 3, 31]) == [[1, 2], [0, 3]]  # 2 * (961 - 9) > 100: split
    monkeypatch.setattr(encoder, "BUCKET_OVERHEAD", 0)
    assert encoder.length_buckets([5, 1, 5, 2]) == [[1], [3], [0, 2]]


def test_packed_forward_equals_bert_forward_on_every_real_token(bucketing):
    bert = random_bert(TINY_SHAPE, 30522, seed=1).eval()
    ids, mask, types = ragged_batch([17, 3, 9, 17, 1])
    assert_inference_equals_bert_forward(bert, ids, mask, types)
    real = mask.bool()
    # with gradients the CPU takes the plain attention path: same values, same gradients
    bert.zero_grad()
    hf_forward(bert, ids, mask, types)[real].pow(2).sum().backward()
    expected = [p.grad.clone() for p in bert.parameters()]
    bert.zero_grad()
    encode(bert, ids, mask, types)[real].pow(2).sum().backward()
    for param, grad in zip(bert.parameters(), expected):
        torch.testing.assert_close(param.grad, grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lengths", [[17, 16, 17, 17], [17, 3, 9, 17, 1]], ids=["dense", "packed"])
def test_inference_in_chunks_equals_bert_forward(lengths, monkeypatch):
    """Without gradients: a batch of about one length runs every position (`dense`), a ragged one packed; the
    scores a row at a time and the feed-forward block 4 tokens at a time (the cache-sized chunks, made tiny)."""
    monkeypatch.setattr(encoder, "SCORES_BYTES", 1)
    monkeypatch.setattr(encoder, "FFN_ROWS", 4)
    assert_inference_equals_bert_forward(random_bert(TINY_SHAPE, 30522, seed=2).eval(), *ragged_batch(lengths, seed=1))


def test_padded_forward_of_a_gpu_equals_the_packed_one(bucketing):
    """The GPU's path (`encode_padded`), run here on a CPU: the packed path's values and gradients, zeros at
    padding."""
    bert = random_bert(TINY_SHAPE, 30522, seed=3).eval()
    ids, mask, types = ragged_batch([12, 4, 20, 1])
    real = mask.bool()
    outputs, grads = [], []
    for forward in (encoder.encode_packed, encoder.encode_padded):
        bert.zero_grad()
        out = forward(bert, ids, mask, types)
        out[real].pow(2).sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in bert.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    assert outputs[1][~real].abs().max() == 0
    for packed, padded in zip(grads[0], grads[1]):
        torch.testing.assert_close(padded, packed, rtol=1e-4, atol=1e-4)


def test_packing_changes_no_example(bucketing):
    """An example's hidden states do not depend on the other rows of its batch (their count or lengths)."""
    bert = random_bert(TINY_SHAPE, 30522, seed=2).eval()
    ids, mask, types = ragged_batch([11, 30, 2, 25])
    with torch.no_grad():
        together = encode(bert, ids, mask, types)
        for row in range(4):
            n = int(mask[row].sum())
            alone = encode(bert, ids[row : row + 1, :n], mask[row : row + 1, :n], types[row : row + 1, :n])
            torch.testing.assert_close(together[row, :n], alone[0], rtol=1e-5, atol=1e-5)


def test_dropout_keeps_with_probability_1_minus_p_and_rescales():
    torch.manual_seed(0)
    x = torch.ones(1_000_000, dtype=torch.bfloat16)
    y = dropout(x, 0.1, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 1e6 draws: sd 0.0003
    assert torch.all(y[kept] == torch.tensor(1 / 0.9, dtype=torch.bfloat16))
    assert not torch.equal(kept, dropout(x, 0.1, training=True) != 0)  # a fresh mask each call
    assert dropout(x, 0.1, training=False) is x
    # a training step with dropout still reaches every weight
    bert = random_bert(TINY_SHAPE, 30522, seed=3).train()
    ids, mask, types = ragged_batch([8, 5])
    encode(bert, ids, mask, types).sum().backward()
    assert all(p.grad is not None for p in bert.encoder.parameters())


@pytest.fixture
def reference_encoder(monkeypatch):
    """Switch every tower and reader to BertModel.forward over the padded batch."""

    def use() -> None:
        for module in (retriever, mlm_reader, span_reader):
            monkeypatch.setattr(module, "encode", hf_forward)

    yield use
    monkeypatch.undo()
    assert retriever.encode is encoder.encode


def fast_and_reference(model: torch.nn.Module, batch, use_reference) -> tuple[float, float, float]:
    """Loss of the fast path (packed, bf16 autocast), of packed fp32 and of the fp32 padded reference."""
    model.eval()  # no dropout: the three see the same function
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = float(model(*batch)[0])
        packed_fp32 = float(model(*batch)[0])
        use_reference()
        reference = float(model(*batch)[0])
    return fast, packed_fp32, reference


def check(losses: tuple[float, float, float]) -> None:
    fast, packed_fp32, reference = losses
    assert packed_fp32 == pytest.approx(reference, rel=1e-5)
    assert fast == pytest.approx(reference, rel=LOSS_TOLERANCE)


@pytest.fixture(scope="module")
def minilm() -> Retriever:
    from realm.config import RetrieverConfig

    return Retriever.load("minilm", RetrieverConfig(pooling="mean", query_max_tokens=64))


def test_ict_loss_matches_the_fp32_reference(minilm, tiny_corpus, reference_encoder):
    titles, bodies = tiny_corpus.slice(0, len(tiny_corpus))

    def encode_(texts: list[str], n: int) -> dict:
        return dict(minilm.tokenizer(texts, padding=True, truncation=True, max_length=n, return_tensors="pt"))

    query = encode_([body.split(".")[0] for body in bodies], 64)
    # each query's positive is the *next* block, so the loss is large (its own block would make it ~1e-5)
    docs = encode_([f"{t} [SEP] {b}" for t, b in zip(titles[1:] + titles[:1], bodies[1:] + bodies[:1])], 128)
    check(fast_and_reference(ICTModel(minilm), (query, docs), reference_encoder))


def test_realm_loss_matches_the_fp32_reference(minilm, tiny_corpus, tokenizer, reference_encoder):
    rng = np.random.default_rng(0)
    sentences = ["Paris is the capital and largest city of France.", "The Eiffel Tower was finished in 1889."]
    queries = [mask_sentence(s, [], "random-span", tokenizer, 64, 5, rng) for s in sentences]
    retrieved = np.array([[0, 1, 2], [3, 1, -1]])
    batch = make_batch(queries, retrieved, tiny_corpus, tokenizer, tiny_corpus.config)
    check(fast_and_reference(RealmModel(minilm, Reader.load("minilm")), (batch,), reference_encoder))


def test_qa_loss_matches_the_fp32_reference(minilm, tiny_corpus, reference_encoder):
    model = QAModel(minilm, SpanReader.load("minilm"))
    questions = ["What is the capital of France?", "When was the Eiffel Tower finished?"]
    _, bodies = tiny_corpus.slice(0, 4)
    reader, _ = model.reader_inputs(questions, [bodies[:3], bodies[1:4]], 48)
    match = torch.zeros_like(reader.span_valid)
    match[0, 3] = match[4, 1] = match[5, 7] = True
    query = dict(minilm.tokenizer(questions, padding=True, return_tensors="pt"))
    beam = torch.nn.functional.normalize(torch.randn(2, 6, 128, generator=torch.Generator().manual_seed(0)), dim=-1)
    beam_answer = torch.tensor([[True, False, False, True, False, False], [False, True, True, False, False, False]])
    bm25 = torch.rand(2, 6, generator=torch.Generator().manual_seed(1)) * 10  # the hybrid's BM25 term
    batch = QABatch(query, beam * 4, bm25, torch.ones(2, 6, dtype=torch.bool), beam_answer, reader, match)
    check(fast_and_reference(model, (batch,), reference_encoder))


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))],
)
def test_the_seed_decides_dropout_after_a_fresh_model_on_every_device(device: str) -> None:
    """A recipe seeds, then loads models with fresh heads (fresh_weights): dropout must follow the recipe's seed,
    on CUDA too (torch.manual_seed inside fresh_weights used to leave every CUDA device at the head's seed)."""

    def dropout_mask(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        random_bert(TINY_SHAPE, 100, seed=7)
        return torch.nn.functional.dropout(torch.ones(4096, device=device), 0.5).cpu()

    assert torch.equal(dropout_mask(0), dropout_mask(0))
    assert not torch.equal(dropout_mask(0), dropout_mask(1))
