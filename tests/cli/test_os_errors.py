"""A full disk and a closed pipe through the `realm` command line: one `realm: error:` line (or none for the
pipe), never a traceback, and the index or corpus already there as it was. On d1c3134 each of these ended in a
raw faiss RuntimeError, an `OSError: [Errno 28]` or a BrokenPipeError stack trace.

The full disk is the real one of /dev/full where a writer can be pointed at it, and a refused free-space check or
an injected ENOSPC where it cannot (CI has no small filesystem to mount)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import DOCS

from realm.cli.main import main
from realm.data.blocks import BlockStore
from realm.index.embed import BlockEmbedder
from realm.index.mips import VERSIONS, MipsIndex, current_version

EVEREST = {"id": "everest", "title": "Mount Everest", "text": "Mount Everest is Earth's highest mountain."}


@pytest.fixture
def built(tmp_path, docs_file, tiny_retriever) -> dict[str, str]:
    """A saved tiny model, a corpus and an index at v1, built through the CLI."""
    paths = {name: str(tmp_path / name) for name in ("model", "corpus", "index")}
    tiny_retriever.save(paths["model"])
    assert main(["corpus", "build", str(docs_file), "--out", paths["corpus"], "--quiet"]) == 0
    assert (
        main(["index", "build", "--corpus", paths["corpus"], "--model", paths["model"], "--out", paths["index"]]) == 0
    )
    return paths


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("realm: error: "), err
    return err[0]


def _intact(index: str, versions: int = 1) -> None:
    """The live version is the one before the failure, loads, and nothing half-written is left beside it."""
    assert current_version(Path(index)) == 1
    assert sorted(p.name for p in (Path(index) / VERSIONS).iterdir()) == [f"v{n:06d}" for n in range(1, versions + 1)]
    assert MipsIndex(index).meta.num_vectors == len(DOCS)


def test_an_add_without_room_for_its_version_is_refused_before_embedding(built, tmp_path, monkeypatch, capsys):
    docs = tmp_path / "new.jsonl"
    docs.write_text(json.dumps(EVEREST) + "\n")
    monkeypatch.setattr("realm.common.io.free_bytes", lambda path: 100)
    monkeypatch.setattr(BlockEmbedder, "embed", lambda *a, **k: pytest.fail("embedded before checking for room"))
    capsys.readouterr()
    assert main(["index", "add", "--index", built["index"], "--docs", str(docs), "--model", built["model"]]) == 1
    line = _one_error_line(capsys)
    assert f"realm: error: {built['index']}: adding 1 blocks" in line and "needs about" in line
    assert "; 100 are free there" in line
    _intact(built["index"])
    assert not any((Path(built["index"]) / "added").glob("*"))


def test_a_disk_that_fills_while_a_version_is_written_leaves_the_live_one(built, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", full)
    capsys.readouterr()
    assert main(["index", "remove", "--index", built["index"], "--ids", DOCS[0]["id"]]) == 1
    line = _one_error_line(capsys)
    assert f"realm: error: {built['index']}: the disk filled while writing a new version" in line
    assert "bytes are free there" in line
    _intact(built["index"])


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_faiss_meeting_a_full_disk_is_one_line(built, monkeypatch, capsys):
    """faiss writing a new version's index to /dev/full. On d1c3134 a large index gave a RuntimeError trace, and a
    small one (all in faiss' last buffer) printed "close error" and was published truncated."""

    def full_disk(path, mode="r", *args, **kwargs):
        return open("/dev/full", mode) if str(path).endswith("index.faiss") else open(path, mode, *args, **kwargs)

    monkeypatch.setattr("realm.index.mips.open", full_disk, raising=False)
    capsys.readouterr()
    assert main(["index", "remove", "--index", built["index"], "--ids", DOCS[0]["id"]]) == 1
    assert "the disk filled while writing a new version" in _one_error_line(capsys)
    _intact(built["index"])


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_corpus_build_on_a_full_disk_keeps_the_corpus_there(built, docs_file, monkeypatch, capsys):
    before = BlockStore(built["corpus"]).fingerprint
    real = pa.OSFile
    monkeypatch.setattr("realm.data.blocks.pa.OSFile", lambda path, mode: real("/dev/full", mode))
    capsys.readouterr()
    assert (
        main(["corpus", "build", str(docs_file), "--max-block-tokens", "64", "--out", built["corpus"], "--quiet"]) == 1
    )
    line = _one_error_line(capsys)
    assert f"realm: error: {built['corpus']}: the disk filled after" in line and "is unchanged" in line
    assert BlockStore(built["corpus"]).fingerprint == before
    assert [p.name for p in Path(built["corpus"]).iterdir() if "partial" in p.name] == []


def test_other_os_errors_are_one_line_too(built, tmp_path, monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "index" / "CURRENT"))

    monkeypatch.setattr("realm.index.mips.write_atomic", refused)
    capsys.readouterr()
    assert main(["index", "remove", "--index", built["index"], "--ids", DOCS[0]["id"]]) == 1
    assert _one_error_line(capsys) == f"realm: error: {tmp_path / 'index' / 'CURRENT'}: Permission denied"
    assert current_version(Path(built["index"])) == 1


def test_a_closed_pipe_ends_the_command_quietly(built, monkeypatch, capsys):
    """`realm search ... | head`: the reader went away before the hits were written."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        code = main(["search", "--index", built["index"], "--model", built["model"], "Everest", "--json"])
        monkeypatch.undo()
    assert code == 141
    assert capsys.readouterr().err == ""
