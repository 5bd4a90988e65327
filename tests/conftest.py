"""Shared fixtures: the real tokenizer, a tiny random retriever (2 layers, hidden 32), tiny corpora, a tiny
random QA model with its index, and the HTTP service over it."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from realm.common.tokenization import load_tokenizer, minilm_dir
from realm.config import (
    CorpusConfig,
    EmbedConfig,
    EncoderShape,
    IndexConfig,
    Preset,
    QAConfig,
    RetrieverConfig,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CORPUS = ROOT / "examples" / "corpus.jsonl"  # 645 vital articles (Wikipedia leads), shipped
# The corpora a clone fetches or ships, pinned to the project's dev files that every earlier record read
# (wiki_vital.jsonl.gz, squad_dev_paragraphs.jsonl.gz): sha256 of their documents' [id, title, text] as JSON.
VITAL_ARTICLES_SHA256 = "1dee1ee464bf6fcfecbc8c9bd01ef382bc758327072118ede72d914b3345667c"
SQUAD_PARAGRAPHS_SHA256 = "ed8409496e9e4fc0a64d8f16cc8077a12fcb5e930237068e62a86cd31c915d43"  # texts stripped
TINY_SHAPE = EncoderShape(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TINY_RETRIEVER = RetrieverConfig(  # the cpu preset's retriever settings at a tiny shape
    proj_dim=16,
    pooling="mean",
    dropout_position="pooled",
    null_document="learned_weight",
    query_max_tokens=32,
    shape=TINY_SHAPE,
)
TINY_CORPUS = CorpusConfig(max_block_tokens=48, max_title_tokens=8)
TINY_EMBED = EmbedConfig(batch_size=4, compute_dtype="fp32", storage_dtype="fp32", shard_size=2)
NO_DROPOUT = dataclasses.replace(TINY_SHAPE, dropout=0.0)
TINY_QA = QAConfig(
    epochs=2,
    batch_size=4,
    lr=1e-3,
    head_lr_multiplier=1.0,
    top_k=3,
    beam=6,
    span_hidden=16,
    max_span_width=4,
    checkpoint_every=2,
    log_every=1,
)
TINY_QA_PRESET = Preset(
    name="cpu",
    corpus=TINY_CORPUS,
    retriever=dataclasses.replace(TINY_RETRIEVER, shape=NO_DROPOUT, dropout=0.0),
    embed=TINY_EMBED,
    index=IndexConfig(),
    qa=TINY_QA,
)

DOCS = [
    {
        "id": "paris",
        "title": "Paris",
        "text": "Paris is the capital and largest city of France. "
        "The Eiffel Tower was built for the 1889 World's Fair. The Louvre holds the Mona Lisa.",
    },
    {
        "id": "tokyo",
        "title": "Tokyo",
        "text": "Tokyo is the capital of Japan. It hosted the Summer Olympics in 1964 and 2021.",
    },
    {
        "id": "nile",
        "title": "Nile",
        "text": "The Nile is a major north-flowing river in northeastern Africa. "
        "It flows into the Mediterranean Sea. The Nile is about 6,650 km long.",
    },
    {
        "id": "bach",
        "title": "Johann Sebastian Bach",
        "text": "Johann Sebastian Bach was a German composer of the Baroque "
        "period. He was born in Eisenach in 1685 and died in Leipzig in 1750.",
    },
    {
        "id": "moon",
        "title": "Moon",
        "text": "The Moon is Earth's only natural satellite. Neil Armstrong walked on it in 1969.",
    },
]


def documents_digest(rows: list[list[str]]) -> str:
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


def dead_pid() -> int:
    """The pid of a process that has exited: what a writer killed with SIGKILL leaves in its partial files' names."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory) -> Iterator[Path]:
    """$REALM_CACHE (tagged sentences are shared there) of the session's fixtures: never the user's."""
    folder = tmp_path_factory.mktemp("realm-cache")
    before = os.environ.get("REALM_CACHE")
    os.environ["REALM_CACHE"] = str(folder)
    yield folder
    if before is None:
        del os.environ["REALM_CACHE"]
    else:
        os.environ["REALM_CACHE"] = before


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch) -> Path:
    """Each test's own $REALM_CACHE, empty at its start: what one test tagged is not another's cache."""
    folder = tmp_path_factory.mktemp("realm-cache")
    monkeypatch.setenv("REALM_CACHE", str(folder))
    return folder


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(minilm_dir())


@pytest.fixture
def docs_file(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return path


@pytest.fixture
def tiny_corpus(tmp_path: Path, docs_file: Path, tokenizer):
    from realm.data.blocks import BlockStore, build_corpus

    build_corpus([str(docs_file)], tmp_path / "corpus", tokenizer, TINY_CORPUS, progress=False)
    return BlockStore(tmp_path / "corpus")


@pytest.fixture(scope="session")
def tiny_retriever():
    from realm.models.retriever import Retriever

    return Retriever.load("random", TINY_RETRIEVER)


def tiny_index_config(**changes) -> IndexConfig:
    import dataclasses

    return dataclasses.replace(IndexConfig(), **changes)


def build_tiny_index(store, retriever, index_dir: Path, replace_model: bool = False, **index_changes):
    """Embed `store` with `retriever`'s document tower and publish an index version (the tiny embed settings)."""
    from realm.index.build import build_from_retriever

    return build_from_retriever(
        retriever, store, index_dir, TINY_EMBED, tiny_index_config(**index_changes), replace_model=replace_model
    )


def save_tiny_qa(store, tokenizer, folder: Path) -> tuple[Path, Path]:
    """A tiny random QA model saved to folder/model and the index its document tower built over `store`."""
    from realm.index.build import build_from_retriever
    from realm.models.bert import random_bert
    from realm.models.orqa import QAModel
    from realm.models.retriever import Retriever
    from realm.models.span_reader import SpanReader

    retriever = Retriever.load("random", TINY_QA_PRESET.retriever)
    build_from_retriever(retriever, store, folder / "index", TINY_EMBED, IndexConfig(), 0, 0.0)
    reader = SpanReader(
        random_bert(NO_DROPOUT, len(tokenizer), 7), tokenizer, TINY_QA.span_hidden, TINY_QA.max_span_width
    )
    QAModel(retriever, reader).save(folder / "model")
    return folder / "model", folder / "index"


@pytest.fixture
def tiny_qa(tmp_path: Path, tiny_corpus, tokenizer) -> tuple[Path, Path]:
    """A tiny random QA model saved to disk and the index its document tower built: (model dir, index dir)."""
    return save_tiny_qa(tiny_corpus, tokenizer, tmp_path)


@pytest.fixture(scope="session")
def squad_slice(tmp_path_factory, tokenizer):
    """The first 40 SQuAD dev paragraphs in tiny blocks (158): enough blocks that the dense and BM25 top lists of a
    question part ways."""
    from realm.data.blocks import BlockStore, build_corpus
    from realm.data.sources import SQUAD_DEV_ZIP, BadRecords, read_documents

    folder = tmp_path_factory.mktemp("squad_slice")
    docs = itertools.islice(read_documents(str(SQUAD_DEV_ZIP), False, BadRecords()), 40)
    rows = [json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs]
    (folder / "docs.jsonl").write_text("".join(rows))
    build_corpus([str(folder / "docs.jsonl")], folder / "corpus", tokenizer, TINY_CORPUS, progress=False)
    return BlockStore(folder / "corpus")


@pytest.fixture
def qa_service(tiny_qa):
    """The HTTP service's state over the tiny QA model and its index (dense retrieval, k = TINY_QA.top_k)."""
    from realm.serve.service import QAService

    model_dir, index_dir = tiny_qa
    return QAService.load(str(model_dir), index_dir, TINY_QA_PRESET)


@contextmanager
def serving(app, **settings) -> Iterator[str]:
    """Run `app` with uvicorn (and `settings` for it) in a background thread on a free port; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
