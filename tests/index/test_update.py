"""`realm index add` / `index remove`: new knowledge in a live index without retraining, stable block ids,
old versions self-consistent, removed blocks gone from dense and BM25 search, clear errors, the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import DOCS, TINY_EMBED, TINY_RETRIEVER, build_tiny_index

from realm.cli.main import main
from realm.data.sources import CorpusError
from realm.index.embed import BlockEmbedder
from realm.index.mips import ADDED, MipsIndex, MipsIndexError, current_version
from realm.index.search import BM25Searcher, DenseSearcher
from realm.index.update import add_documents, remove_documents
from realm.models.retriever import Retriever

EVEREST = {
    "id": "everest",
    "title": "Mount Everest",
    "text": "Mount Everest is Earth's highest mountain above sea "
    "level, in the Himalayas on the border of Nepal and China. Its summit is 8,849 metres high. Tenzing Norgay "
    "and Edmund Hillary first reached the summit in 1953.",
}
PIANO = {
    "id": "piano",
    "title": "Piano",
    "text": "The piano is a keyboard instrument invented in Italy by Bartolomeo Cristofori around 1700.",
}


def _jsonl(path: Path, *docs: dict) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


def _add(index_dir: Path, retriever: Retriever, docs_path: str, keep_versions: int = 2):
    return add_documents(MipsIndex(index_dir), docs_path, retriever, TINY_EMBED, keep_versions)


@pytest.fixture
def index_dir(tmp_path, tiny_corpus, tiny_retriever) -> Path:
    build_tiny_index(tiny_corpus, tiny_retriever, tmp_path / "index")
    return tmp_path / "index"


def test_added_document_is_found_through_the_layered_store(tmp_path, index_dir, tiny_corpus, tiny_retriever):
    corpus_files = sorted(p.name for p in tiny_corpus.folder.iterdir())
    done = _add(index_dir, tiny_retriever, _jsonl(tmp_path / "new.jsonl", EVEREST))
    assert (done.version, done.documents, done.live_blocks) == (2, 1, len(tiny_corpus) + done.blocks)
    assert done.blocks >= 2  # 48-wordpiece blocks: the document spans several

    index = MipsIndex(index_dir)
    assert index.version == current_version(index_dir) == 2
    store = index.corpus()
    new_ids = list(range(len(tiny_corpus), len(tiny_corpus) + done.blocks))  # ids continue after the corpus
    assert len(store) == new_ids[-1] + 1 and store.live_ids.tolist() == list(range(len(store)))
    assert {b.doc_id for b in store.take(new_ids)} == {"everest"}
    assert store.take([0]) == tiny_corpus.take([0])  # base ids keep their blocks
    assert store.fingerprint != tiny_corpus.fingerprint and store.config == tiny_corpus.config

    searcher = DenseSearcher(index, tiny_retriever)
    assert searcher.search(store.take([new_ids[0]])[0].body, 1)[0].doc_id == "everest"  # even a random tower
    hits = {h.block_id: h for h in searcher.search("mountain", 1000)}
    assert len(hits) == len(store)
    assert [(hits[i].doc_id, hits[i].text) for i in new_ids] == [("everest", b.body) for b in store.take(new_ids)]
    assert BM25Searcher(store).search("Himalayas", 3)[0].doc_id == "everest"

    # The base corpus is never modified; the new blocks live in the index folder.
    assert sorted(p.name for p in tiny_corpus.folder.iterdir()) == corpus_files
    assert index.meta.added == [
        {
            "file": f"{ADDED}/{next((index_dir / ADDED).iterdir()).name}",
            "first_id": len(tiny_corpus),
            "num_blocks": done.blocks,
        }
    ]


def test_adding_an_existing_id_fails_and_publishes_nothing(tmp_path, index_dir, tiny_retriever):
    clash = dict(EVEREST, id="paris")
    with pytest.raises(CorpusError, match="already in index .* v1: 'paris'"):
        _add(index_dir, tiny_retriever, _jsonl(tmp_path / "new.jsonl", PIANO, clash))
    assert current_version(index_dir) == 1 and not (index_dir / ADDED).exists()
    # Replacing a document: remove it, then add its new text under the same id.
    remove_documents(MipsIndex(index_dir), ["paris"], keep_versions=2)
    done = _add(index_dir, tiny_retriever, _jsonl(tmp_path / "new.jsonl", clash))
    assert done.version == 3
    paris = " ".join(
        h.text for h in DenseSearcher(MipsIndex(index_dir), tiny_retriever).search("x", 1000) if h.doc_id == "paris"
    )
    assert "Everest" in paris and "Eiffel" not in paris


def test_removed_blocks_are_gone_from_dense_and_bm25(index_dir, tiny_corpus, tiny_retriever):
    bach = [i for i, doc_id in enumerate(tiny_corpus.column("doc_id")) if doc_id == "bach"]
    assert BM25Searcher(MipsIndex(index_dir).corpus()).search("Eisenach", 3)[0].doc_id == "bach"
    done = remove_documents(MipsIndex(index_dir), ["bach", "bach"], keep_versions=2)
    assert (done.version, done.documents, done.blocks, done.live_blocks) == (
        2,
        1,
        len(bach),
        len(tiny_corpus) - len(bach),
    )

    index = MipsIndex(index_dir)
    hits = DenseSearcher(index, tiny_retriever).search("Bach composer Leipzig", 1000)
    assert len(hits) == len(tiny_corpus) - len(bach) and "bach" not in {h.doc_id for h in hits}
    store = index.corpus()
    assert BM25Searcher(store).search("Eisenach Bach", 5) == []
    assert sorted(set(store.live_ids.tolist()) | set(bach)) == list(range(len(tiny_corpus)))
    assert BM25Searcher(tiny_corpus).search("Eisenach", 3)[0].doc_id == "bach"  # the corpus itself is untouched


def test_removing_unknown_ids_fails_and_publishes_nothing(index_dir):
    with pytest.raises(MipsIndexError, match="'atlantis', 'eldorado'; nothing was removed"):
        remove_documents(MipsIndex(index_dir), ["bach", "atlantis", "eldorado"], keep_versions=2)
    assert current_version(index_dir) == 1
    with pytest.raises(MipsIndexError, match="empty"):
        remove_documents(MipsIndex(index_dir), [d["id"] for d in DOCS], keep_versions=2)
    assert current_version(index_dir) == 1


def test_older_versions_resolve_their_own_blocks(tmp_path, index_dir, tiny_corpus, tiny_retriever):
    everest = _add(index_dir, tiny_retriever, _jsonl(tmp_path / "a.jsonl", EVEREST), keep_versions=10)
    remove_documents(MipsIndex(index_dir), ["everest"], keep_versions=10)
    piano = _add(index_dir, tiny_retriever, _jsonl(tmp_path / "b.jsonl", PIANO), keep_versions=10)
    assert piano.version == 4

    first_everest, first_piano = len(tiny_corpus), len(tiny_corpus) + everest.blocks  # ids are never reused
    v2, v4 = MipsIndex(index_dir, 2), MipsIndex(index_dir, 4)
    assert v2.corpus().take([first_everest])[0].doc_id == "everest"
    assert {h.doc_id for h in DenseSearcher(v2, tiny_retriever).search("x", 1000)} == {d["id"] for d in DOCS} | {
        "everest"
    }
    v4_hits = DenseSearcher(v4, tiny_retriever).search("x", 1000)
    assert {h.doc_id for h in v4_hits} == {d["id"] for d in DOCS} | {"piano"}
    assert min(h.block_id for h in v4_hits if h.doc_id == "piano") == first_piano
    assert len(v4.meta.added) == 2


@pytest.mark.parametrize("backend", ["hnsw", "ivfpq"])
def test_updates_keep_the_backend_and_its_parameters(tmp_path, tiny_corpus, tiny_retriever, backend):
    built = build_tiny_index(tiny_corpus, tiny_retriever, tmp_path / "index", backend=backend, hnsw_ef_search=77)
    _add(tmp_path / "index", tiny_retriever, _jsonl(tmp_path / "new.jsonl", EVEREST))
    remove_documents(MipsIndex(tmp_path / "index"), ["moon"], keep_versions=2)
    index = MipsIndex(tmp_path / "index")
    assert (index.version, index.meta.backend) == (3, backend)
    assert {k: v for k, v in index.meta.params.items() if k != "nbits"} == {
        k: v for k, v in built.params.items() if k != "nbits"
    }  # PQ bits follow the number of vectors
    hits = DenseSearcher(index, tiny_retriever).search("Everest", 1000)
    assert "everest" in {h.doc_id for h in hits} and "moon" not in {h.doc_id for h in hits}


def test_interrupted_add_leaves_the_previous_version_live(tmp_path, index_dir, tiny_retriever, monkeypatch):
    def dying_embed(self, titles, bodies, on_batch=None):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(BlockEmbedder, "embed", dying_embed)
    with pytest.raises(KeyboardInterrupt):
        _add(index_dir, tiny_retriever, _jsonl(tmp_path / "new.jsonl", EVEREST))
    assert current_version(index_dir) == 1
    assert "everest" not in {h.doc_id for h in DenseSearcher(MipsIndex(index_dir), tiny_retriever).search("x", 1000)}


def test_another_document_tower_is_refused(tmp_path, index_dir):
    other = Retriever.load("random", dataclasses.replace(TINY_RETRIEVER, pooling="cls"))
    with pytest.raises(MipsIndexError, match="document tower"):
        _add(index_dir, other, _jsonl(tmp_path / "new.jsonl", EVEREST))
    assert current_version(index_dir) == 1


def test_cli_add_search_remove(tmp_path, docs_file, tiny_retriever, capsys):
    model, corpus, index = str(tmp_path / "model"), str(tmp_path / "corpus"), str(tmp_path / "index")
    tiny_retriever.save(model)
    assert main(["corpus", "build", str(docs_file), "--out", corpus, "--quiet"]) == 0
    assert main(["index", "build", "--corpus", corpus, "--model", model, "--out", index, "--quiet"]) == 0
    capsys.readouterr()

    new = _jsonl(tmp_path / "new.jsonl", EVEREST, PIANO)
    assert main(["index", "add", "--index", index, "--docs", new, "--model", model, "--quiet"]) == 0
    assert "v2: added 2 documents" in capsys.readouterr().out
    assert main(["search", "--index", index, "--model", model, "Everest", "-k", "100", "--json"]) == 0
    assert {"everest", "piano"} <= {h["doc_id"] for h in json.loads(capsys.readouterr().out)}

    assert main(["index", "add", "--index", index, "--docs", new, "--model", model, "--quiet"]) == 2
    assert "already in index" in capsys.readouterr().err
    assert main(["index", "remove", "--index", index, "--ids", "nowhere", "--quiet"]) == 2
    assert "'nowhere'" in capsys.readouterr().err

    (tmp_path / "ids.txt").write_text("piano\n\n")
    assert (
        main(
            [
                "index",
                "remove",
                "--index",
                index,
                "--ids",
                "everest",
                "--ids-file",
                str(tmp_path / "ids.txt"),
                "--quiet",
            ]
        )
        == 0
    )
    assert "v3: removed 2 documents" in capsys.readouterr().out
    assert main(["search", "--index", index, "--model", model, "Everest", "-k", "100", "--json"]) == 0
    assert {h["doc_id"] for h in json.loads(capsys.readouterr().out)} == {d["id"] for d in DOCS}


def test_an_integer_id_is_a_document_id_as_its_decimal_string(tmp_path, docs_file, tiny_retriever, capsys):
    """Integer ids are accepted on purpose (Parquet id columns are often int64): `5` is the document "5", which
    `index remove --ids 5` finds, and a later `"5"` is the same document. A float or a boolean is a bad record."""
    model, corpus, index = str(tmp_path / "model"), str(tmp_path / "corpus"), str(tmp_path / "index")
    tiny_retriever.save(model)
    assert main(["corpus", "build", str(docs_file), "--out", corpus, "--quiet"]) == 0
    assert main(["index", "build", "--corpus", corpus, "--model", model, "--out", index, "--quiet"]) == 0
    new = _jsonl(tmp_path / "new.jsonl", {**EVEREST, "id": 5}, {**PIANO, "id": 5.0}, {**PIANO, "id": True})
    assert main(["index", "add", "--index", index, "--docs", new, "--model", model, "--skip-bad", "--quiet"]) == 0
    assert "added 1 documents (1 blocks), 2 bad records skipped" in capsys.readouterr().out
    again = _jsonl(tmp_path / "again.jsonl", {**PIANO, "id": "5"})
    assert main(["index", "add", "--index", index, "--docs", again, "--model", model, "--quiet"]) == 2
    assert "already in index" in capsys.readouterr().err
    assert main(["index", "remove", "--index", index, "--ids", "5", "--quiet"]) == 0
    assert "removed 1 documents" in capsys.readouterr().out


@pytest.mark.slow
def test_minilm_answers_from_an_added_document_only_while_it_is_indexed(tmp_path, tiny_corpus):
    from realm.config import get_preset
    from realm.data.qa_examples import QAExample
    from realm.eval.answerer import Answerer
    from realm.models.orqa import QAModel
    from realm.models.span_reader import SpanReader

    retriever = Retriever.load("minilm", get_preset("cpu").retriever)
    build_tiny_index(tiny_corpus, retriever, tmp_path / "index")
    model = QAModel(retriever, SpanReader.load("minilm"))
    example = QAExample("Who first climbed Mount Everest?", ("Edmund Hillary",))

    def answerer() -> Answerer:  # what a service does when a new version is published
        return Answerer(model, DenseSearcher(MipsIndex(tmp_path / "index"), retriever), 3, 128)

    assert answerer().reference_probability(example) == 0.0  # unanswerable: no block holds the answer
    assert "everest" not in {e.doc_id for e in answerer().ask([example.question])[0].evidence}

    _add(tmp_path / "index", retriever, _jsonl(tmp_path / "new.jsonl", EVEREST, PIANO))
    assert answerer().reference_probability(example) > 0.0  # answerable: p(Edmund Hillary | x) > 0
    top = answerer().ask([example.question])[0].evidence[0]
    assert top.doc_id == "everest" and "Hillary" in top.text and top.retrieval_prob > 0.5

    remove_documents(MipsIndex(tmp_path / "index"), ["everest"], keep_versions=2)
    assert answerer().reference_probability(example) == 0.0
    hits = DenseSearcher(MipsIndex(tmp_path / "index"), retriever).search(example.question, 100)
    assert "everest" not in {h.doc_id for h in hits} and len(hits) == len(tiny_corpus) + 1  # piano stays
