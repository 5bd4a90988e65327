"""The salient-span cache: a sample of a tagged corpus (the pipeline's calibration) takes its spans from the corpus's
cache instead of running spaCy, which a GPU image lacks; the spans are those tagging the sample would give."""

from __future__ import annotations

import pyarrow as pa
import pytest

from realm.data import sentences
from realm.data.sentences import build_sentences, cached_sentences
from realm.pipeline.calibrate import sample_corpus


def _table(path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def test_a_sample_of_a_tagged_corpus_takes_its_spans_without_the_tagger(tiny_corpus, tmp_path, monkeypatch):
    assert cached_sentences(tiny_corpus) is None
    build_sentences(tiny_corpus, progress=False)
    assert cached_sentences(tiny_corpus) is not None
    sample = sample_corpus(tiny_corpus, tmp_path / "sample", 3)
    tagged_here = _table(build_sentences(sample_corpus(tiny_corpus, tmp_path / "tagged", 3), progress=False))

    def no_spacy(texts, progress=True):
        raise ModuleNotFoundError("No module named 'spacy'")

    monkeypatch.setattr(sentences, "tag_salient_spans", no_spacy)
    with pytest.raises(ModuleNotFoundError):
        build_sentences(sample, progress=False)  # nothing to copy from: it would tag
    copied = _table(build_sentences(sample, progress=False, tagged=tiny_corpus))
    assert copied.equals(tagged_here) and sum(map(len, copied.column("span_starts").to_pylist())) > 0
    assert cached_sentences(sample) is not None
