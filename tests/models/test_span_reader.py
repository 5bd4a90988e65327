"""The span reader's heads: ORQA's span MLP and BERT's start/end head, kept with the reader they were trained in."""

from __future__ import annotations

import pytest
import torch
from conftest import NO_DROPOUT

from realm.models.bert import random_bert
from realm.models.span_reader import SpanHead, SpanReader, block_spans, reader_batch


def test_the_start_end_head_scores_a_span_as_its_start_plus_its_end():
    head = SpanHead(8, 4, "start_end")
    hidden = torch.randn(2, 5, 8)  # (N, L, H)
    starts, ends = torch.tensor([[0, 1, 3], [2, 0, 0]]), torch.tensor([[0, 2, 4], [3, 0, 0]])
    valid = torch.tensor([[True, True, True], [True, False, False]])
    scores = head(hidden, starts, ends, valid)  # (N, S)
    expected = head.start(hidden)[..., 0].gather(1, starts) + head.end(hidden)[..., 0].gather(1, ends)
    assert torch.allclose(scores[valid], expected[valid], atol=1e-6)
    assert (scores[~valid] < -1e3).all()  # padding spans stay masked
    with pytest.raises(ValueError, match="unknown span head 'bilinear'"):
        SpanHead(8, 4, "bilinear")


@pytest.mark.parametrize("kind", ["orqa", "start_end"])
def test_a_saved_reader_answers_with_the_head_it_was_trained_with(tmp_path, tokenizer, kind):
    reader = SpanReader(random_bert(NO_DROPOUT, len(tokenizer), 7), tokenizer, 16, 10, kind).eval()
    reader.save(tmp_path / "reader")
    loaded = SpanReader.load(str(tmp_path / "reader"), span_head="orqa" if kind == "start_end" else "start_end")
    assert loaded.span_head.kind == kind and loaded.fine_tuned
    spans = block_spans(tokenizer, "Leonardo da Vinci painted the Mona Lisa in Florence.", 32, 10)
    batch = reader_batch(tokenizer, [tokenizer("Who painted it?", add_special_tokens=False)["input_ids"]], [[spans]])
    with torch.no_grad():
        before = reader(**batch.inputs, starts=batch.starts, ends=batch.ends, span_valid=batch.span_valid)
        after = loaded.eval()(**batch.inputs, starts=batch.starts, ends=batch.ends, span_valid=batch.span_valid)
    assert torch.allclose(before, after)
