"""Fault injection: SIGKILL each long job at seeded random moments, run it again, check the invariants.

`realm corpus build`, `realm index build`, `realm index add` and the REALM trainer run as real processes and are
killed (kill -9) at seeded random moments once their work is under way (a partial file, the k-th shard or
checkpoint on disk). After every kill, what is live is
complete: a corpus folder with its meta.json loads, and CURRENT names an index version that loads and answers as
before. The same command then finishes, and its result equals the uninterrupted run's: corpus fingerprint, index
embeddings and search results, the trainer's logged losses. No file a killed writer left stays behind.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import DOCS, EXAMPLE_CORPUS

from realm.data.blocks import BlockStore
from realm.index.mips import MipsIndex, current_version

pytestmark = pytest.mark.slow

SEED = 20261122
REALM = [sys.executable, "-m", "realm.cli"]
KILLS: list[str] = []  # one line per kill injected, printed at the end


@pytest.fixture(scope="module", autouse=True)
def report_the_kills(request):
    """After this module's tests: which kills landed, on the terminal (a report, not a test)."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nfault injection: {len(KILLS)} kills injected" + "".join(f"\n  {k}" for k in KILLS))


def realm(*args: str) -> None:
    done = subprocess.run([*REALM, *args, "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, f"realm {' '.join(args)}: {done.stderr[-2000:]}"


def kill_when(ready, extra: float, *args: str) -> bool:
    """Start `realm args`; once `ready()` says its work is under way, wait `extra` seconds more and SIGKILL it.
    True if it was still running then (the kill landed)."""
    process = subprocess.Popen([*REALM, *args, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while process.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(extra)
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait()
    KILLS.append(f"realm {args[0]} {args[1]}: killed {extra:.2f} s after its work began")
    return True


def running(needle: str) -> bool:
    """Is a process whose command line mentions `needle` alive (Linux /proc)?"""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                return True
        except OSError:  # it exited while we looked
            continue
    return False


def leftovers(folder: Path) -> list[str]:
    """Unfinished outputs: pid-stamped partial and temporary files, half-swapped checkpoint folders."""
    pattern = re.compile(r"\.(?:partial|tmp)-\d+|\.partial$|\.old$")
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if pattern.search(p.name))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Vital-articles documents: 500 for a corpus build, 120 for an index, 20 more to add to it."""
    folder = tmp_path_factory.mktemp("faults")
    lines = EXAMPLE_CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)[:520]
    (folder / "docs.jsonl").write_text("".join(lines[:500]))
    (folder / "index_docs.jsonl").write_text("".join(lines[:120]))
    (folder / "more.jsonl").write_text(
        "".join(json.dumps({**json.loads(line), "id": f"more:{n}"}) + "\n" for n, line in enumerate(lines[500:]))
    )
    return folder


def test_killed_corpus_builds_rerun_to_the_same_corpus(inputs, tmp_path):
    rng = random.Random(SEED)
    realm("corpus", "build", str(inputs / "docs.jsonl"), "--out", str(tmp_path / "reference"))
    reference = BlockStore(tmp_path / "reference").fingerprint
    killed = 0
    for n in range(3):
        out = tmp_path / f"killed{n}"
        writing = lambda out=out: bool(list(out.glob("blocks.arrow.partial-*")))  # noqa: E731
        killed += kill_when(
            writing, rng.uniform(0, 0.6), "corpus", "build", str(inputs / "docs.jsonl"), "--out", str(out)
        )
        if (out / "meta.json").exists():
            assert BlockStore(out).fingerprint == reference  # whatever is committed is complete
        realm("corpus", "build", str(inputs / "docs.jsonl"), "--out", str(out))
        assert BlockStore(out).fingerprint == reference and leftovers(out) == []
    assert killed, "no build was still running at its kill moment"


def test_killed_index_builds_and_adds_leave_a_live_version_and_rerun_to_the_same_index(inputs, tmp_path):
    rng = random.Random(SEED + 1)
    corpus = tmp_path / "corpus"
    realm("corpus", "build", str(inputs / "index_docs.jsonl"), "--out", str(corpus))
    build = ["--corpus", str(corpus), "--model", "random", "--shard-size", "16"]
    realm("index", "build", *build, "--out", str(tmp_path / "reference"))
    shutil.copytree(tmp_path / "reference", tmp_path / "pristine")
    reference = MipsIndex(tmp_path / "reference", device="cpu")
    shards = -(-reference.meta.num_vectors // 16)
    queries = np.random.default_rng(SEED).standard_normal((8, reference.meta.dim)).astype(np.float32)
    expected = reference.search(queries, 10)

    def answers_as_before(index_dir: Path) -> None:
        index = MipsIndex(index_dir, device="cpu")  # CURRENT names a complete version
        scores, ids = index.search(queries, 10)
        np.testing.assert_array_equal(ids, expected[1])
        np.testing.assert_allclose(scores, expected[0], rtol=1e-3, atol=1e-3)

    live, killed = tmp_path / "live", 0
    shutil.copytree(tmp_path / "pristine", live)
    for _ in range(2):  # a rebuild of a live index killed after k of its shards: readers keep a complete version
        before, k = current_version(live), rng.randrange(shards)
        embedded = lambda k=k: len(list((live / "building").glob("shard_*.npy"))) > k  # noqa: E731
        killed += kill_when(embedded, rng.uniform(0, 0.2), "index", "build", *build, "--out", str(live))
        answers_as_before(live)
        realm("index", "build", *build, "--out", str(live))
        assert current_version(live) > before and not (live / "building").exists()
        answers_as_before(live)
        assert leftovers(live) == []

    added = ["--docs", str(inputs / "more.jsonl"), "--model", "random"]
    realm("index", "add", "--index", str(tmp_path / "reference"), *added)
    with_added = MipsIndex(tmp_path / "reference", device="cpu")
    for n in range(2):
        target = tmp_path / f"add{n}"
        shutil.copytree(tmp_path / "pristine", target)
        stored = lambda target=target: (target / "added").is_dir() and any((target / "added").iterdir())  # noqa: E731
        killed += kill_when(stored, rng.uniform(0, 0.4), "index", "add", "--index", str(target), *added)
        if not MipsIndex(target, device="cpu").meta.added:  # killed before it published: v1 still answers
            answers_as_before(target)
            realm("index", "add", "--index", str(target), *added)  # and the same command completes the add
        index = MipsIndex(target, device="cpu")
        assert np.array_equal(index.block_ids, with_added.block_ids) and leftovers(target) == []
        np.testing.assert_allclose(index.embeddings(), with_added.embeddings(), atol=1e-2)
    assert killed, "no index job was still running at its kill moment"


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "realm.cli"]


def rank_process(rank: int, needle: str) -> int | None:
    """The pid of torchrun's worker `rank` whose command line mentions `needle` (Linux /proc)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if needle in cmdline and f"RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:  # it exited while we looked
            continue
    return None


def test_torchrun_index_build_equals_one_process_and_a_killed_rank_costs_only_its_unfinished_shards(inputs, tmp_path):
    """`torchrun --nproc_per_node=2 -m realm.cli index build` publishes the 1-process version (same ids, the same
    embeddings bit for bit at the same threads per process: bf16 kernels round differently across thread counts);
    with rank 1 SIGKILLed mid-build the job dies, and the re-run reuses every shard on disk."""
    corpus = tmp_path / "corpus"
    realm("corpus", "build", str(inputs / "index_docs.jsonl"), "--out", str(corpus))
    build = ["index", "build", "--corpus", str(corpus), "--model", "random", "--shard-size", "8", "--quiet"]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}  # torchrun's ranks run 1 thread each: the same bf16 kernels
    alone = subprocess.run([*REALM, *build, "--out", str(tmp_path / "one")], env=one_thread, capture_output=True)
    assert alone.returncode == 0, alone.stderr[-2000:]
    one = MipsIndex(tmp_path / "one", device="cpu")
    two_ranks = subprocess.run([*TORCHRUN, *build, "--out", str(tmp_path / "two")], capture_output=True, text=True)
    assert two_ranks.returncode == 0, two_ranks.stderr[-2000:]
    two = MipsIndex(tmp_path / "two", device="cpu")
    assert (
        np.array_equal(two.block_ids, one.block_ids)
        and two.meta.doc_tower_fingerprint == one.meta.doc_tower_fingerprint
    )
    np.testing.assert_array_equal(two.embeddings(), one.embeddings())  # the shards do not depend on the ranks
    queries = np.random.default_rng(SEED).standard_normal((8, one.meta.dim)).astype(np.float32)
    np.testing.assert_array_equal(two.search(queries, 5)[1], one.search(queries, 5)[1])

    out, shards = tmp_path / "killed", -(-one.meta.num_vectors // 8)
    job = subprocess.Popen([*TORCHRUN, *build, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(list((out / "building").glob("shard_*.npy"))) < shards // 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    victim = rank_process(1, str(out))
    assert victim is not None and job.poll() is None, "the build ended before rank 1 could be killed"
    os.kill(victim, signal.SIGKILL)
    assert job.wait(timeout=300) != 0  # torchrun takes the job down with its rank
    finished = sorted((out / "building").glob("shard_*.npy"))
    assert 0 < len(finished) < shards and not (out / "CURRENT").exists()
    KILLS.append(f"torchrun index build: rank 1 killed after {len(finished)} of {shards} shards")
    for path in finished:  # mark what is on disk: a re-run that re-embedded a shard would publish the true rows
        np.save(path, -np.load(path))
    rerun = subprocess.run([*TORCHRUN, *build, "--out", str(out)], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    resumed = MipsIndex(out, device="cpu").embeddings()
    marked = np.zeros(len(resumed), dtype=bool)
    for path in finished:
        marked[int(path.stem.split("_")[1]) * 8 :][:8] = True
    np.testing.assert_array_equal(resumed[marked], -one.embeddings()[marked])  # reused as found on disk
    np.testing.assert_array_equal(resumed[~marked], one.embeddings()[~marked])  # the rest embedded anew
    assert leftovers(out) == [] and not (out / "building").exists()


def test_a_killed_trainer_resumes_to_the_losses_of_an_uninterrupted_run(inputs, tmp_path):
    from realm.data.sentences import build_sentences

    rng = random.Random(SEED + 2)
    corpus = tmp_path / "corpus"
    (tmp_path / "small.jsonl").write_text("".join((inputs / "docs.jsonl").read_text().splitlines(True)[:60]))
    realm("corpus", "build", str(tmp_path / "small.jsonl"), "--out", str(corpus))
    build_sentences(BlockStore(corpus), progress=False)  # tagged once, as by a user's first run
    train = [
        "train",
        "pretrain",
        "--corpus",
        str(corpus),
        "--retriever",
        "random",
        "--reader",
        "random",
        "--steps",
        "5",
        "--batch-size",
        "2",
        "--num-candidates",
        "3",
        "--null-warmup-steps",
        "2",  # a kill may land before or after retrieval starts
        "--refresh-every",
        "0",
        "--checkpoint-every",
        "1",
    ]
    realm(*train, "--out", str(tmp_path / "reference"))
    reference = [json.loads(line) for line in (tmp_path / "reference" / "metrics.jsonl").read_text().splitlines()]
    killed = 0
    for n in range(2):
        out, k = tmp_path / f"killed{n}", rng.randint(1, 4)
        trained = lambda out=out, k=k: (out / "checkpoints" / f"step-{k:08d}").is_dir()  # noqa: E731
        killed += kill_when(trained, rng.uniform(0, 0.8), *train, "--out", str(out))
        realm(*train, "--out", str(out), "--resume")
        resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in resumed] == [m["step"] for m in reference]
        for a, b in zip(resumed, reference, strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert leftovers(out) == [] and leftovers(corpus) == []
        shutil.rmtree(out)  # its checkpoints (weights and optimizer state) take a gigabyte or more
    assert killed, "no trainer was still running at its kill moment"


PIPELINE = """
import sys
from pathlib import Path
sys.path[:0] = [{tests!r}, {tests!r} + "/pipeline"]
from test_pipeline import TINY_PIPELINE
from realm.pipeline.plan import PipelineOptions
from realm.pipeline.run import Pipeline
options = PipelineOptions(inputs=({docs!r},), run_dir=Path({run!r}), warm_start="random", progress=False)
Pipeline(options, TINY_PIPELINE, echo=lambda line: None).run()
"""


def test_a_killed_pipeline_reruns_to_the_end_resuming_the_stage_it_was_in(inputs, tmp_path):
    """The tiny pipeline (random models) killed as soon as REALM pretraining wrote a checkpoint: the same command
    skips the stages that had finished, resumes the one that was cut and finishes with a report."""
    run = tmp_path / "run"
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    code = PIPELINE.format(tests=str(Path(__file__).parent), docs=str(docs), run=str(run))
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while process.poll() is None and not (run / "realm" / "checkpoints" / "step-00000002").is_dir():
        time.sleep(0.01)
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    process.send_signal(signal.SIGKILL)
    process.wait()
    stages = run / "stages"
    finished = {p.name: p.read_text() for p in stages.glob("*.json") if not p.name.endswith(".started.json")}
    cut = {p.name.removesuffix(".started.json") for p in stages.glob("*.started.json")} - {n[:-5] for n in finished}
    KILLS.append(f"realm pipeline: killed in stage {', '.join(sorted(cut))}, after a REALM checkpoint")
    assert cut  # a stage was under way
    orphans_gone = time.monotonic() + 60  # its index builder notices the trainer is gone and exits
    while running(str(run)):
        assert time.monotonic() < orphans_gone, "the killed trainer's index builder did not exit"
        time.sleep(0.2)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for name, record in finished.items():  # skipped: their records are untouched
        assert (stages / name).read_text() == record, name
    for name in cut:
        assert json.loads((stages / f"{name}.json").read_text())["resumed"], name
    assert {"corpus", "warm_start", "ict", "realm", "examples"} <= {p.stem for p in stages.glob("*.json")}
    assert (run / "report.md").is_file() and leftovers(run) == []
