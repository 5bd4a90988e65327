"""The salient-span cache: a sample of a tagged corpus (the pipeline's calibration) takes its spans from the corpus's
cache instead of running spaCy, which a GPU image lacks; the spans are those tagging the sample would give. A corpus
built again from the same documents finds its sentences in the shared cache ($REALM_CACHE/sentences/)."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from realm.data import sentences
from realm.data.blocks import BlockStore
from realm.data.sentences import build_sentences, cached_sentences, sentences_path
from realm.pipeline.calibrate import sample_corpus


def _table(path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def test_a_sample_of_a_tagged_corpus_takes_its_spans_without_the_tagger(tiny_corpus, tmp_path, monkeypatch, own_cache):
    assert cached_sentences(tiny_corpus) is None
    build_sentences(tiny_corpus, progress=False)
    assert cached_sentences(tiny_corpus) is not None
    sample = sample_corpus(tiny_corpus, tmp_path / "sample", 3)
    tagged_here = _table(build_sentences(sample_corpus(tiny_corpus, tmp_path / "tagged", 3), progress=False))
    (
        own_cache / "sentences" / f"{sample.fingerprint}.arrow"
    ).unlink()  # the same blocks: shared, as the next test shows

    def no_spacy(texts, progress=True):
        raise ModuleNotFoundError("No module named 'spacy'")

    monkeypatch.setattr(sentences, "tag_salient_spans", no_spacy)
    with pytest.raises(ModuleNotFoundError):
        build_sentences(sample, progress=False)  # nothing to copy from: it would tag
    copied = _table(build_sentences(sample, progress=False, tagged=tiny_corpus))
    assert copied.equals(tagged_here) and sum(map(len, copied.column("span_starts").to_pylist())) > 0
    assert cached_sentences(sample) is not None


def test_a_corpus_built_again_is_not_tagged_again(tiny_corpus, tmp_path, monkeypatch, own_cache):
    build_sentences(tiny_corpus, progress=False)
    shared = own_cache / "sentences" / f"{tiny_corpus.fingerprint}.arrow"
    assert shared.is_file()
    again = BlockStore(shutil.copytree(tiny_corpus.folder, tmp_path / "again", ignore=shutil.ignore_patterns("sent*")))
    assert cached_sentences(again) == shared  # the same fingerprint, another folder

    def no_spacy(texts, progress=True):
        raise ModuleNotFoundError("No module named 'spacy'")

    monkeypatch.setattr(sentences, "tag_salient_spans", no_spacy)
    assert _table(build_sentences(again, progress=False)).equals(_table(sentences_path(tiny_corpus)))
    assert cached_sentences(again) == sentences_path(again)
    shared.write_bytes(b"damaged")
    (tmp_path / "again" / "sentences.arrow").unlink()
    with pytest.raises(ModuleNotFoundError):  # a damaged cache is no cache: it would tag
        build_sentences(again, progress=False)


def test_a_cache_that_cannot_be_written_leaves_the_corpus_its_own(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("REALM_CACHE", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")
    assert build_sentences(tiny_corpus, progress=False) == sentences_path(tiny_corpus)
    assert cached_sentences(tiny_corpus) == sentences_path(tiny_corpus)
