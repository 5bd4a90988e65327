"""Shared fixtures: the real tokenizer, a tiny random retriever (2 layers, hidden 32), tiny corpora."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from realm.config import CorpusConfig, EmbedConfig, EncoderShape, IndexConfig, RetrieverConfig
from realm.tokenization import load_tokenizer, minilm_dir

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TINY_SHAPE = EncoderShape(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TINY_RETRIEVER = RetrieverConfig(proj_dim=16, pooling="mean", query_max_tokens=32, shape=TINY_SHAPE)
TINY_CORPUS = CorpusConfig(max_block_tokens=48, max_title_tokens=8)
TINY_EMBED = EmbedConfig(batch_size=4, compute_dtype="fp32", storage_dtype="fp32", shard_size=2)

DOCS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital and largest city of France. "
     "The Eiffel Tower was built for the 1889 World's Fair. The Louvre holds the Mona Lisa."},
    {"id": "tokyo", "title": "Tokyo", "text": "Tokyo is the capital of Japan. It hosted the Summer Olympics in 1964 and 2021."},
    {"id": "nile", "title": "Nile", "text": "The Nile is a major north-flowing river in northeastern Africa. "
     "It flows into the Mediterranean Sea. The Nile is about 6,650 km long."},
    {"id": "bach", "title": "Johann Sebastian Bach", "text": "Johann Sebastian Bach was a German composer of the Baroque "
     "period. He was born in Eisenach in 1685 and died in Leipzig in 1750."},
    {"id": "moon", "title": "Moon", "text": "The Moon is Earth's only natural satellite. Neil Armstrong walked on it in 1969."},
]


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
    from realm.corpus import BlockStore, build_corpus

    build_corpus([str(docs_file)], tmp_path / "corpus", tokenizer, TINY_CORPUS, progress=False)
    return BlockStore(tmp_path / "corpus")


@pytest.fixture(scope="session")
def tiny_retriever():
    from realm.retriever import Retriever

    return Retriever.load("random", TINY_RETRIEVER)


def tiny_index_config(**changes) -> IndexConfig:
    import dataclasses

    return dataclasses.replace(IndexConfig(), **changes)
