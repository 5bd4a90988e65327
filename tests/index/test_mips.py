"""MIPS index: build, atomic publish, resume, backends against exact search, fingerprint checks, search API."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY_EMBED, TINY_RETRIEVER, dead_pid
from conftest import build_tiny_index as _build

from realm.config import IndexConfig
from realm.index.backends import ExactSearch, build_faiss
from realm.index.build import build_index
from realm.index.embed import BlockEmbedder
from realm.index.mips import BUILDING, CURRENT, MipsIndex, MipsIndexError, current_version, publish
from realm.index.search import BM25Searcher, DenseSearcher, SearchHit
from realm.models.retriever import Retriever


def test_build_search_and_reopen(tmp_path, tiny_corpus, tiny_retriever):
    meta = _build(tiny_corpus, tiny_retriever, tmp_path / "index")
    assert (meta.version, meta.num_vectors, meta.dim, meta.backend) == (1, len(tiny_corpus), 16, "flat")
    assert meta.corpus_fingerprint == tiny_corpus.fingerprint
    assert meta.doc_tower_fingerprint == tiny_retriever.doc_fingerprint()
    assert not (tmp_path / "index" / BUILDING).exists()
    index = MipsIndex(tmp_path / "index")
    searcher = DenseSearcher(index, tiny_retriever)  # finds the corpus through the index's metadata
    hits = searcher.search("capital of France", 3)
    assert len(hits) == 3 and all(isinstance(h, SearchHit) for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # Scores are the inner products f(x, z) of the towers' embeddings.
    q = tiny_retriever.embed_queries(["capital of France"]).numpy()[0]
    stored = index.embeddings()
    for hit in hits:
        assert hit.score == pytest.approx(float(stored[hit.block_id].astype(np.float32) @ q), abs=1e-4)
        block = tiny_corpus.take([hit.block_id])[0]
        assert (hit.title, hit.text, hit.doc_id) == (block.title, block.body, block.doc_id)
    batch = searcher.batch_search(["capital of France", "river in Africa"], 2)
    assert [h.block_id for h in batch[0]] == [h.block_id for h in hits[:2]]


def test_a_build_copies_the_embeddings_of_an_index_the_same_document_tower_built(tmp_path, tiny_corpus, monkeypatch):
    import torch

    import realm.index.build as build

    retriever = Retriever.load("random", TINY_RETRIEVER)
    first = build.build_from_retriever(retriever, tiny_corpus, tmp_path / "first", TINY_EMBED, IndexConfig())
    with torch.no_grad():
        retriever.query_tower.projection.weight.mul_(0.5)  # the query tower trained, the document tower did not
    other = Retriever.load("random", dataclasses.replace(TINY_RETRIEVER, pooling="cls"))
    other_meta = build.build_from_retriever(other, tiny_corpus, tmp_path / "other", TINY_EMBED, IndexConfig())

    def no_embedding(*args, **kwargs):
        raise AssertionError("embedded although an index of the same document tower exists")

    monkeypatch.setattr(build, "embed_shards", no_embedding)
    reuse = [tmp_path / "other", tmp_path / "first"]  # the other tower's index is passed over
    copied = build.build_from_retriever(
        retriever, tiny_corpus, tmp_path / "copy", TINY_EMBED, IndexConfig(), reuse=reuse
    )
    assert copied.reused_from == str((tmp_path / "first" / "versions" / "v000001").resolve())
    assert copied.doc_tower_fingerprint == first.doc_tower_fingerprint and other_meta.reused_from is None
    assert np.array_equal(MipsIndex(tmp_path / "copy").embeddings(), MipsIndex(tmp_path / "first").embeddings())
    assert DenseSearcher(MipsIndex(tmp_path / "copy"), retriever).search("moon", 1)
    assert MipsIndex(tmp_path / "first").embeddings().shape == (len(tiny_corpus), 16)  # the source keeps its own
    with pytest.raises(AssertionError, match="embedded although"):  # other settings: embedded anew
        wider = dataclasses.replace(TINY_EMBED, batch_size=TINY_EMBED.batch_size + 1)
        build.build_from_retriever(retriever, tiny_corpus, tmp_path / "wider", wider, IndexConfig(), reuse=reuse)


def test_k_larger_than_corpus(tmp_path, tiny_corpus, tiny_retriever):
    _build(tiny_corpus, tiny_retriever, tmp_path / "index")
    hits = DenseSearcher(MipsIndex(tmp_path / "index"), tiny_retriever).search("moon", 1000)
    assert sorted(h.block_id for h in hits) == list(range(len(tiny_corpus)))


def test_other_doc_tower_is_refused(tmp_path, tiny_corpus, tiny_retriever):
    _build(tiny_corpus, tiny_retriever, tmp_path / "index")
    other = Retriever.load("random", dataclasses.replace(TINY_RETRIEVER, pooling="cls"))
    with pytest.raises(MipsIndexError, match="document tower"):
        DenseSearcher(MipsIndex(tmp_path / "index"), other)


def test_query_tower_change_is_accepted(tmp_path, tiny_corpus):
    import torch

    retriever = Retriever.load("random", TINY_RETRIEVER)
    _build(tiny_corpus, retriever, tmp_path / "index")
    with torch.no_grad():
        retriever.query_tower.projection.weight.mul_(0.5)  # what fine-tuning does
    assert DenseSearcher(MipsIndex(tmp_path / "index"), retriever).search("moon", 1)


def test_changed_corpus_is_refused(tmp_path, tiny_corpus, tiny_retriever, docs_file, tokenizer):
    from realm.data.blocks import build_corpus

    _build(tiny_corpus, tiny_retriever, tmp_path / "index")
    with open(docs_file, "a") as handle:
        handle.write(json.dumps({"id": "new", "title": "New", "text": "A new document."}) + "\n")
    build_corpus([str(docs_file)], tiny_corpus.folder, tokenizer, tiny_corpus.config, progress=False)
    with pytest.raises(MipsIndexError, match="fingerprint"):
        MipsIndex(tmp_path / "index").corpus()


def test_interrupted_build_leaves_previous_index_usable_and_resumes(tmp_path, tiny_corpus, tiny_retriever, monkeypatch):
    index_dir = tmp_path / "index"
    _build(tiny_corpus, tiny_retriever, index_dir)
    expected = DenseSearcher(MipsIndex(index_dir), tiny_retriever).search("Bach composer", 3)

    # A second build with another model dies after two shards have been embedded.
    other = Retriever.load("random", dataclasses.replace(TINY_RETRIEVER, pooling="cls"))
    calls = {"n": 0}
    original = BlockEmbedder.embed

    def dying_embed(self, titles, bodies, on_batch=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return original(self, titles, bodies, on_batch)

    monkeypatch.setattr(BlockEmbedder, "embed", dying_embed)
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_corpus, other, index_dir, replace_model=True)
    assert current_version(index_dir) == 1
    assert DenseSearcher(MipsIndex(index_dir), tiny_retriever).search("Bach composer", 3) == expected
    assert len(list((index_dir / BUILDING).glob("shard_*.npy"))) == 2

    # Resuming embeds only the missing shards and publishes version 2.
    calls["n"] = -100
    meta = _build(tiny_corpus, other, index_dir, replace_model=True)
    assert calls["n"] == -100 + (len(tiny_corpus) + TINY_EMBED.shard_size - 1) // TINY_EMBED.shard_size - 2
    assert meta.version == 2 and current_version(index_dir) == 2
    fresh = _build(tiny_corpus, other, tmp_path / "fresh")
    assert np.array_equal(MipsIndex(index_dir).embeddings(), MipsIndex(tmp_path / "fresh").embeddings())
    assert fresh.doc_tower_fingerprint == meta.doc_tower_fingerprint


def test_half_written_version_is_never_read(tmp_path, tiny_corpus, tiny_retriever):
    index_dir = tmp_path / "index"
    _build(tiny_corpus, tiny_retriever, index_dir)
    # A crashed writer leaves a partial folder behind; readers keep following CURRENT.
    partial = index_dir / "versions" / ".partial-123-456"
    partial.mkdir()
    (partial / "index.faiss").write_bytes(b"garbage")
    assert MipsIndex(index_dir).version == 1
    _build(tiny_corpus, tiny_retriever, index_dir)
    assert MipsIndex(index_dir).version == 2


def test_leftovers_of_killed_writers_are_removed_and_live_ones_kept(tmp_path, tiny_corpus, tiny_retriever):
    index_dir = tmp_path / "index"
    _build(tiny_corpus, tiny_retriever, index_dir)
    dead = dead_pid()
    killed = index_dir / "versions" / f".partial-{dead}-123"  # a whole version, killed before its rename
    (killed / "sub").mkdir(parents=True)
    (index_dir / f".CURRENT.tmp-{dead}-ab12.tmp").write_text("v0000")
    live = index_dir / "versions" / ".partial-1-456"  # pid 1 is alive: another writer at work
    live.mkdir()
    _build(tiny_corpus, tiny_retriever, index_dir)
    assert not killed.exists() and not list(index_dir.glob(".CURRENT.tmp-*")) and live.exists()


def test_old_versions_are_pruned(tmp_path, tiny_corpus, tiny_retriever):
    index_dir = tmp_path / "index"
    for _ in range(4):
        _build(tiny_corpus, tiny_retriever, index_dir, keep_versions=2)
    assert sorted(p.name for p in (index_dir / "versions").iterdir()) == ["v000003", "v000004"]
    assert (index_dir / CURRENT).read_text().strip() == "v000004"


def test_missing_and_corrupt_index_are_clear_errors(tmp_path, tiny_corpus, tiny_retriever):
    with pytest.raises(MipsIndexError, match="no published index"):
        MipsIndex(tmp_path / "nothing")
    _build(tiny_corpus, tiny_retriever, tmp_path / "index")
    (tmp_path / "index" / "versions" / "v000001" / "index.faiss").write_bytes(b"truncated")
    with pytest.raises(MipsIndexError, match="unreadable"):
        MipsIndex(tmp_path / "index")


def test_refuses_foreign_output_folder(tmp_path, tiny_corpus, tiny_retriever):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        _build(tiny_corpus, tiny_retriever, tmp_path / "notes")


@pytest.mark.parametrize("backend, min_recall", [("flat", 1.0), ("hnsw", 0.95), ("ivfpq", 0.9)])
def test_backends_against_exact_search(tmp_path, backend, min_recall):
    """Recall@10 of each backend against numpy brute force on clustered 128-d vectors."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(50, 128)).astype(np.float32)
    vectors = (centers[rng.integers(0, 50, 5000)] + 0.5 * rng.normal(size=(5000, 128))).astype(np.float32)
    queries = (centers[rng.integers(0, 50, 100)] + 0.5 * rng.normal(size=(100, 128))).astype(np.float32)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    index_dir = tmp_path / backend
    meta_fields = dict(
        doc_tower_fingerprint="-",
        corpus_fingerprint="-",
        corpus_path="-",
        num_vectors=5000,
        dim=128,
        backend=backend,
        retriever={},
        storage_dtype="fp16",
        embed_seconds=0,
        build_seconds=0,
    )
    index, params = build_faiss(vectors, dataclasses.replace(IndexConfig(), backend=backend))
    publish(index_dir, vectors.astype(np.float16), np.arange(5000), index, {**meta_fields, "params": params}, 2)
    scores, found = MipsIndex(index_dir).search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])
    assert recall >= min_recall
    if backend == "flat":
        assert np.allclose(scores, np.take_along_axis(queries @ vectors.T, exact, 1), rtol=1e-2, atol=0.5)


@pytest.mark.parametrize("backend", ["hnsw", "ivfpq"])
def test_approximate_backends_end_to_end(tmp_path, tiny_corpus, tiny_retriever, backend):
    meta = _build(tiny_corpus, tiny_retriever, tmp_path / backend, backend=backend)
    assert meta.backend == backend
    exact_dir = tmp_path / "flat"
    _build(tiny_corpus, tiny_retriever, exact_dir)
    approx = DenseSearcher(MipsIndex(tmp_path / backend), tiny_retriever).search("capital of Japan", 1)
    exact = DenseSearcher(MipsIndex(exact_dir), tiny_retriever).search("capital of Japan", 1)
    if backend == "hnsw":
        assert approx[0].block_id == exact[0].block_id


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown index backend"):
        build_faiss(np.zeros((4, 8), np.float32), dataclasses.replace(IndexConfig(), backend="annoy"))


def test_bm25_finds_the_term(tiny_corpus):
    searcher = BM25Searcher(tiny_corpus)
    hits = searcher.search("Eisenach", 3)
    assert hits[0].doc_id == "bach" and hits[0].score > 0
    assert len(hits) == 1  # blocks without any query term are not returned
    assert searcher.batch_search(["zzzzunknownword"], 5) == [[]]


def test_bm25_matches_word_forms_by_their_stem(tiny_corpus):
    hits = BM25Searcher(tiny_corpus).search("flow", 3)  # the Nile "flows", is "north-flowing"
    assert [hit.doc_id for hit in hits] == ["nile"]
    assert BM25Searcher(tiny_corpus, stemmer=None).search("flow", 3) == []  # exact word forms only


# -- exact search in torch (GPUs, and images without faiss) ------------------------------------------
def test_exact_search_in_torch_equals_faiss_flat():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5000, 32)).astype(np.float32)
    queries = rng.standard_normal((50, 32)).astype(np.float32)
    expected_scores, expected_rows = build_faiss(vectors, IndexConfig(backend="flat"))[0].search(queries, 10)
    for chunk_rows in (1 << 20, 777):  # one pass, and a scan in chunks merged across them
        scores, rows = ExactSearch(vectors, "cpu", chunk_rows).search(queries, 10)
        np.testing.assert_array_equal(rows, expected_rows)
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-4)
    scores, rows = ExactSearch(vectors[:7], "cpu", chunk_rows=3).search(queries, 10)  # k > N
    assert rows.shape == (50, 7) and sorted(rows[0].tolist()) == list(range(7))
    assert (np.diff(scores, axis=1) <= 0).all()


def test_flat_index_builds_and_searches_without_faiss(tmp_path, tiny_corpus, tiny_retriever, monkeypatch):
    _build(tiny_corpus, tiny_retriever, tmp_path / "with_faiss")
    queries = tiny_retriever.embed_queries(["capital of France", "river in Africa", "moon"]).numpy()
    expected_scores, expected_ids = MipsIndex(tmp_path / "with_faiss").search(queries, 5)
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` now fails, as on a GPU image without it
    meta = _build(tiny_corpus, tiny_retriever, tmp_path / "without")
    assert not (tmp_path / "without" / "versions" / f"v{meta.version:06d}" / "index.faiss").exists()
    index = MipsIndex(tmp_path / "without")
    assert isinstance(index.index, ExactSearch)
    scores, ids = index.search(queries, 5)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-4)
    with pytest.raises(MipsIndexError, match="hnsw backend needs faiss"):
        _build(tiny_corpus, tiny_retriever, tmp_path / "hnsw", backend="hnsw")


def test_a_flat_index_beyond_its_ram_limit_is_scanned_from_the_memory_mapped_embeddings(
    tmp_path, tiny_corpus, tiny_retriever
):
    _build(tiny_corpus, tiny_retriever, tmp_path / "in_ram")
    queries = tiny_retriever.embed_queries(["capital of France", "river in Africa", "moon"]).numpy()
    expected_scores, expected_ids = MipsIndex(tmp_path / "in_ram").search(queries, 5)
    meta = _build(tiny_corpus, tiny_retriever, tmp_path / "large", flat_in_memory_rows=len(tiny_corpus) - 1)
    assert not (tmp_path / "large" / "versions" / f"v{meta.version:06d}" / "index.faiss").exists()
    index = MipsIndex(tmp_path / "large", device="cpu")
    assert isinstance(index.index, ExactSearch) and isinstance(index.index.vectors, np.memmap)  # no copy in RAM
    index.index.chunk_rows = 3  # a scan in chunks, merged across them
    scores, ids = index.search(queries, 5)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-4)


def test_faiss_backends_build_from_a_memory_mapped_fp16_file_chunk_by_chunk(tmp_path, monkeypatch):
    import realm.index.backends as backends

    rng = np.random.default_rng(0)
    np.save(tmp_path / "vectors.npy", rng.standard_normal((3000, 32)).astype(np.float16))
    stored = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    queries = rng.standard_normal((20, 32)).astype(np.float32)
    whole = build_faiss(np.asarray(stored, dtype=np.float32), IndexConfig(backend="flat"))[0].search(queries, 10)
    monkeypatch.setattr(backends, "ADD_CHUNK_ROWS", 700)
    for backend in ("flat", "ivfpq"):
        index, _ = build_faiss(stored, IndexConfig(backend=backend))
        assert index.ntotal == 3000
        if backend == "flat":
            np.testing.assert_array_equal(index.search(queries, 10)[1], whole[1])


def test_gpu_side_modules_import_without_faiss_bm25s_or_spacy():
    """The GPU image has torch and transformers but not faiss, bm25s or spaCy: training, evaluation and the CLI
    must import there (BM25, approximate backends and salient-span tagging name what is missing when used)."""
    code = (
        "import sys\nfor name in ('faiss', 'bm25s', 'spacy'):\n    sys.modules[name] = None\n"
        "import realm.cli.main, realm.index.mips, realm.index.search, realm.index.refresh, realm.eval.answerer\n"
        "import realm.eval.mlm, realm.eval.qa, realm.pipeline.run, realm.recipes.ict, realm.recipes.pretrain\n"
        "import realm.recipes.finetune_qa, realm.data.sentences\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_build_by_another_model_over_a_live_index_is_refused_unless_asked(
    tmp_path, tiny_corpus, tiny_retriever, capsys
):
    from realm.cli.main import main

    index_dir = tmp_path / "index"
    _build(tiny_corpus, tiny_retriever, index_dir)
    other = Retriever.load("random", dataclasses.replace(TINY_RETRIEVER, pooling="cls"))
    embedder = BlockEmbedder(other.doc_tower, other.tokenizer, tiny_corpus.config, TINY_EMBED)
    args = (tiny_corpus, embedder, other.doc_fingerprint(), index_dir, TINY_EMBED, IndexConfig(), other.config)
    with pytest.raises(MipsIndexError) as refused:
        build_index(*args, progress=False)
    assert tiny_retriever.doc_fingerprint() in str(refused.value) and other.doc_fingerprint() in str(refused.value)
    assert current_version(index_dir) == 1 and not (index_dir / "building").exists()  # nothing embedded or published
    assert build_index(*args, progress=False, replace_model=True).version == 2
    # the command line says the same in one line, and --replace-model is the way to mean it
    assert (
        main(
            [
                "index",
                "build",
                "--corpus",
                str(tiny_corpus.folder),
                "--model",
                "minilm",
                "--out",
                str(index_dir),
                "--quiet",
            ]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert error.startswith("realm: error:") and "--replace-model" in error and error.count("\n") == 1
