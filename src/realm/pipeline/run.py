"""`realm pipeline`: every stage from a corpus to a report, each skipped when its output already matches.

    corpus -> warm start -> ICT -> REALM pretraining (first index, asynchronous refresher)
           -> [QA: off-the-shelf and ICT indexes -> fine-tuning -> evaluation (dense, BM25, zero-shot recall)]
           -> worked examples
           -> [ablations: ICT-only retriever, uniform masking, frozen index; each fine-tuned and evaluated]
    and the report, rewritten after every stage.

Each stage writes into `<run>/<stage>/` and finishes by writing `<run>/stages/<stage>.json` (its
fingerprint, duration and results) atomically. The fingerprint covers the stage's settings, the content
of its input files and the fingerprints of the stages it reads, so a re-run skips what matches, resumes
a stage that was interrupted (trainers continue from their newest checkpoint), and moves aside (never
deletes) a stage folder whose settings changed. The step counts are planned once per run (plan.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from realm.common.io import write_json_atomic
from realm.config import Preset
from realm.data.qa_examples import QAExample, load_qa
from realm.data.sources import VITAL_ARTICLES
from realm.pipeline.plan import PipelinePlan, Workload, plan_pipeline

log = logging.getLogger(__name__)

STAGES = "stages"  # stage records, beside the stage folders
RECALL_KS = (1, 5, 20)
EXAMPLE_POOL = 100  # held-out sentences searched for the worked examples
ACCURACY_LIMIT = 200  # held-out sentences for masked-span accuracy


def fingerprint_of(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def describe_input(spec: str) -> dict:
    """What identifies an input file: the built-in corpus name, or the file's content digest. Not its path or
    mtime: a moved or re-copied file is the same input, and must not re-run hours of training."""
    if spec == VITAL_ARTICLES:
        return {"builtin": spec}
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"input {spec!r} is not a file (nor {VITAL_ARTICLES!r})")
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")  # ~0.9 GB/s here: seconds even for a full Wikipedia dump
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size}


@dataclass(frozen=True)
class StageRecord:
    name: str
    fingerprint: str
    seconds: float  # in the invocation that finished it
    finished: float
    result: dict
    resumed: bool = False  # so `seconds` leaves out the time before the interruption


class Stages:
    """Runs named stages into `run_dir/<name>/`; a stage whose record matches its fingerprint is skipped.
    Records live in `run_dir/stages/` (`<name>.json` when done, `<name>.started.json` while running), so a
    stage folder holds only what the stage wrote."""

    def __init__(self, run_dir: Path, echo: Callable[[str], None] = print,
                 on_finish: Callable[[], None] = lambda: None):
        self.run_dir = Path(run_dir)
        self.echo = echo
        self.on_finish = on_finish  # after each stage that ran
        self.records: dict[str, StageRecord] = {}

    def _record_path(self, name: str) -> Path:
        return self.run_dir / STAGES / f"{name}.json"

    def _started_path(self, name: str) -> Path:
        return self.run_dir / STAGES / f"{name}.started.json"

    def record(self, name: str) -> StageRecord | None:
        path = self._record_path(name)
        return StageRecord(**json.loads(path.read_text())) if path.is_file() else None

    def run(self, name: str, settings: dict, work: Callable[[Path, bool], dict]) -> StageRecord:
        """`work(folder, resume)` does the stage and returns its results (JSON-serialisable)."""
        folder = self.run_dir / name
        fingerprint = fingerprint_of({"stage": name, **settings})
        done = self.record(name)
        if done is not None and done.fingerprint == fingerprint and folder.is_dir():
            self.echo(f"[pipeline] {name}: up to date ({done.seconds / 60:.1f} min when it ran)")
            self.records[name] = done
            return done
        started = self._started_path(name)
        resume = done is None and started.is_file() and json.loads(started.read_text())["fingerprint"] == fingerprint
        if folder.exists() and not resume:
            stale = folder.with_name(f"{name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
            folder.rename(stale)
            for path in (self._record_path(name), started):  # its provenance goes with it
                if path.is_file():
                    path.rename(stale / path.name.replace(name, "stage", 1))
            self.echo(f"[pipeline] {name}: settings changed; the old output is kept in {stale}")
        self._record_path(name).unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(started, {"fingerprint": fingerprint, "settings": settings})
        self.echo(f"[pipeline] {name}: {'resuming' if resume else 'running'}")
        began = time.monotonic()
        result = work(folder, resume)
        record = StageRecord(name, fingerprint, time.monotonic() - began, time.time(), result, resume)
        write_json_atomic(self._record_path(name), dataclasses.asdict(record))
        started.unlink(missing_ok=True)
        self.echo(f"[pipeline] {name}: done in {record.seconds / 60:.1f} min")
        self.records[name] = record
        self.on_finish()
        return record


@dataclass(frozen=True)
class PipelineOptions:
    inputs: tuple[str, ...] = (VITAL_ARTICLES,)
    run_dir: Path = Path("runs/default")
    warm_start: str = "minilm"  # both retriever towers and the reader ("random": tests)
    qa_train: Path | None = None
    qa_dev: Path | None = None
    ablations: bool = False
    budget_minutes: float | None = None
    progress: bool = True
    command: str = "realm pipeline"  # as typed, for the report


def last_metrics(folder: Path, window: int = 20) -> dict[str, float]:
    """Means of the last `window` logged steps of a trainer's metrics.jsonl (one batch is too noisy)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tail = rows[-window:]
    keys = {k for row in tail for k, v in row.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
    out = {k: sum(row[k] for row in tail if k in row) / sum(1 for row in tail if k in row) for k in sorted(keys)}
    return {"steps": rows[-1]["step"], **out} if rows else {}


class Pipeline:
    """The stages of one run, in order; `run()` returns the report path."""

    def __init__(self, options: PipelineOptions, preset: Preset, echo: Callable[[str], None] = print):
        if (options.qa_train is None) != (options.qa_dev is None):
            raise ValueError("give both --qa-train and --qa-dev, or neither")
        if options.ablations and options.qa_train is None:
            raise ValueError("--ablations compares exact match: it needs --qa-train and --qa-dev")
        self.options = options
        self.base_preset = preset
        self.run_dir = Path(options.run_dir)
        self.stages = Stages(self.run_dir, echo, on_finish=lambda: self.report(complete=False))
        self.echo = echo
        self.qa_train: list[QAExample] = load_qa(options.qa_train) if options.qa_train else []
        self.qa_dev: list[QAExample] = load_qa(options.qa_dev) if options.qa_dev else []
        self.plan: PipelinePlan | None = None
        self.began = time.time()  # the report counts this invocation's time from here

    # -- stages ---------------------------------------------------------------------------------------
    def corpus(self) -> StageRecord:
        from realm.common.tokenization import MINILM, load_tokenizer, resolve_tokenizer_dir
        from realm.data.blocks import BlockStore, build_corpus

        preset = self.base_preset
        tokenizer_spec = MINILM if self.options.warm_start in (MINILM, "random") else self.options.warm_start

        def work(folder: Path, resume: bool) -> dict:
            tokenizer = load_tokenizer(resolve_tokenizer_dir(tokenizer_spec))
            meta = build_corpus(list(self.options.inputs), folder, tokenizer, preset.corpus,
                                progress=self.options.progress)
            store = BlockStore(folder)
            return {"blocks": len(store), "documents": meta.num_documents, "skipped": meta.skipped_records,
                    "fingerprint": meta.fingerprint}

        return self.stages.run("corpus", {"inputs": [describe_input(i) for i in self.options.inputs],
                                          "corpus": dataclasses.asdict(preset.corpus), "tokenizer": tokenizer_spec}, work)

    def warm_start(self) -> StageRecord:
        """Both towers and the reader as the later stages start from them, saved so every stage reads the same."""
        from realm.models.mlm_reader import Reader
        from realm.models.retriever import Retriever

        preset = self.base_preset

        def work(folder: Path, resume: bool) -> dict:
            retriever = Retriever.load(self.options.warm_start, preset.retriever)
            retriever.save(folder / "retriever")
            Reader.load(self.options.warm_start, preset.retriever.shape).save(folder / "reader")
            return {"model": self.options.warm_start, "doc_tower_fingerprint": retriever.doc_fingerprint()}

        return self.stages.run("warm_start", {"model": self.options.warm_start,
                                              "retriever": dataclasses.asdict(preset.retriever)}, work)

    def ict(self, preset: Preset, warm: StageRecord, corpus: StageRecord) -> StageRecord:
        from realm.recipes.ict import train_ict

        def work(folder: Path, resume: bool) -> dict:
            train_ict(self.run_dir / "corpus", folder, str(self.run_dir / "warm_start" / "retriever"), preset,
                      resume=resume, progress=self.options.progress)
            return last_metrics(folder)

        return self.stages.run("ict", {"after": [corpus.fingerprint, warm.fingerprint],
                                       "ict": dataclasses.asdict(preset.ict)}, work)

    def index(self, name: str, retriever_folder: Path, preset: Preset, after: list[StageRecord]) -> StageRecord:
        """Embed the corpus with a retriever's document tower (zero-shot recall, and the ICT-only baseline)."""
        from realm.data.blocks import BlockStore
        from realm.index.refresh import build_from_retriever
        from realm.models.retriever import Retriever

        def work(folder: Path, resume: bool) -> dict:
            retriever = Retriever.load(str(retriever_folder), preset.retriever)
            meta = build_from_retriever(retriever, BlockStore(self.run_dir / "corpus"), folder / "index", preset.embed,
                                        preset.index, 0, time.time(), self.options.progress)
            return {"vectors": meta.num_vectors, "embed_seconds": meta.embed_seconds}

        return self.stages.run(name, {"after": [r.fingerprint for r in after], "embed": dataclasses.asdict(preset.embed),
                                      "index": dataclasses.asdict(preset.index)}, work)

    def pretrain(self, name: str, preset: Preset, ict: StageRecord, warm: StageRecord) -> StageRecord:
        """REALM pretraining; the trainer builds the first index from the ICT retriever, then a builder
        process refreshes it beside the trainer (unless `refresh_every` is 0: a frozen index)."""
        from realm.index.mips import MipsIndex
        from realm.recipes.pretrain import train_pretrain

        def work(folder: Path, resume: bool) -> dict:
            train_pretrain(self.run_dir / "corpus", folder, str(self.run_dir / "ict" / "retriever"),
                           str(self.run_dir / "warm_start" / "reader"), preset, resume=resume,
                           progress=self.options.progress)
            return {**last_metrics(folder), "index_version": MipsIndex(folder / "index").version}

        return self.stages.run(name, {"after": [ict.fingerprint, warm.fingerprint],
                                      "pretrain": dataclasses.asdict(preset.pretrain),
                                      "embed": dataclasses.asdict(preset.embed)}, work)

    def finetune(self, name: str, model_folder: Path, index_folder: Path, preset: Preset, after: list[StageRecord],
                 reader: Path | None = None, evaluate: bool = False) -> StageRecord:
        """Open-QA fine-tuning over a frozen index (and, for the ablations, dense evaluation on all dev questions)."""
        from realm.eval.answerer import load_answerer
        from realm.eval.qa import evaluate_qa
        from realm.recipes.finetune_qa import train_qa

        def work(folder: Path, resume: bool) -> dict:
            best = train_qa(str(model_folder), index_folder, self.qa_train, self.qa_dev, folder, preset, resume=resume,
                            progress=self.options.progress, reader_spec=str(reader) if reader else None)
            result = {"dev": json.loads((best / "dev.json").read_text()), "train": last_metrics(folder)}
            if evaluate:
                answerer = load_answerer(str(best), index_folder, preset)
                result["dense"] = evaluate_qa(answerer, self.qa_dev, RECALL_KS, folder / "predictions_dense.jsonl")
            return result

        settings = {"after": [r.fingerprint for r in after], "qa": dataclasses.asdict(preset.qa), "evaluate": evaluate,
                    "reader": str(reader) if reader else None, "data": [describe_input(str(self.options.qa_train)),
                                                                         describe_input(str(self.options.qa_dev))]}
        return self.stages.run(name, settings, work)

    def evaluate(self, preset: Preset, qa: StageRecord, zero_shot: dict[str, tuple[StageRecord, Path]]) -> StageRecord:
        """EM and recall of the fine-tuned model (dense), of BM25 with the same reader, and zero-shot recall
        of each retriever before fine-tuning (`zero_shot`: row label -> (its index stage, the retriever))."""
        from realm.eval.answerer import load_answerer
        from realm.eval.qa import evaluate_qa
        from realm.eval.retrieval import recall_at_k
        from realm.index.mips import MipsIndex
        from realm.index.search import DenseSearcher, search_all
        from realm.models.retriever import Retriever

        best = self.run_dir / qa.name / "best"
        index_folder = self.run_dir / "realm_index" / "index"

        def work(folder: Path, resume: bool) -> dict:
            result = {}
            for kind in ("dense", "bm25"):
                answerer = load_answerer(str(best), index_folder, preset, kind)
                result[kind] = evaluate_qa(answerer, self.qa_dev, RECALL_KS, folder / f"predictions_{kind}.jsonl")
            questions = [e.question for e in self.qa_dev]
            for label, (stage, retriever_folder) in zero_shot.items():
                index = MipsIndex(self.run_dir / stage.name / "index")
                config = dataclasses.replace(preset.retriever, **index.meta.retriever)
                retriever = Retriever.load(str(retriever_folder), config)
                hits = search_all(DenseSearcher(index, retriever), questions, max(RECALL_KS))
                result[f"zero_shot/{label}"] = {k: round(v, 2) for k, v in recall_at_k(self.qa_dev, hits, RECALL_KS).items()}
            return result

        return self.stages.run("eval", {"after": [qa.fingerprint, *(s.fingerprint for s, _ in zero_shot.values())]}, work)

    def examples(self, preset: Preset, realm: StageRecord) -> StageRecord:
        """The paper's Table 3 in miniature, and masked-span accuracy with and without retrieval (held out)."""
        from realm.data.blocks import BlockStore
        from realm.data.sentences import SentenceSet
        from realm.eval.mlm import masked_span_accuracy, worked_examples
        from realm.index.mips import MipsIndex
        from realm.models.mlm_reader import Reader
        from realm.models.realm import RealmModel
        from realm.models.retriever import Retriever

        def work(folder: Path, resume: bool) -> dict:
            store = BlockStore(self.run_dir / "corpus")
            held_out = SentenceSet(store.folder / "sentences.arrow", preset.pretrain.held_out_fraction, held_out=True)
            model = RealmModel(Retriever.load(str(self.run_dir / realm.name / "retriever"), preset.retriever),
                               Reader.load(str(self.run_dir / realm.name / "reader")))
            index = MipsIndex(self.run_dir / realm.name / "index")
            k, query_tokens, masks = preset.pretrain.num_candidates, preset.retriever.query_max_tokens, preset.pretrain.max_masks
            examples = worked_examples(model, held_out, store, index, k, query_tokens, masks, pool=EXAMPLE_POOL)
            return {"held_out_sentences": len(held_out), "pool": EXAMPLE_POOL, "examples": [e.to_dict() for e in examples],
                    "null_only": masked_span_accuracy(model, held_out, store, None, 1, query_tokens, masks, ACCURACY_LIMIT),
                    "with_retrieval": masked_span_accuracy(model, held_out, store, index, k, query_tokens, masks,
                                                           ACCURACY_LIMIT)}

        return self.stages.run("examples", {"after": [realm.fingerprint], "pool": EXAMPLE_POOL,
                                            "limit": ACCURACY_LIMIT}, work)

    # -- the run --------------------------------------------------------------------------------------
    def report(self, complete: bool) -> Path | None:
        """The report of the stages finished so far (none before the plan exists)."""
        from realm.pipeline.report import write_report

        if self.plan is None:
            return None
        return write_report(self.run_dir, self.stages.records, self.plan, time.time() - self.began,
                            self.options.command, complete)

    def make_plan(self, work: Workload) -> PipelinePlan:
        """Planned once per run directory: a re-run for the same budget, preset and workload keeps the scale
        in plan.json, so stage costs measured anew (a newer version) cannot change step counts and so
        re-run finished stages."""
        basis = {"budget_minutes": self.options.budget_minutes, "preset": self.base_preset.name,
                 "workload": dataclasses.asdict(work)}
        path = self.run_dir / "plan.json"
        stored = json.loads(path.read_text()) if path.is_file() else {}
        plan = plan_pipeline(self.base_preset, work, self.options.budget_minutes,
                             stored["scale"] if stored.get("basis") == basis else None)
        options = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self.options).items()}
        write_json_atomic(path, {"basis": basis, **plan.to_dict(), "preset": plan.preset.to_dict(), "options": options})
        return plan

    def run(self) -> Path:
        corpus = self.corpus()
        self.plan = self.make_plan(
            Workload(corpus.result["blocks"], len(self.qa_train), len(self.qa_dev), self.options.ablations))
        preset = self.plan.preset
        self.echo(f"[pipeline] plan: {self.plan.estimated_minutes:.0f} min estimated"
                  + (f" for a budget of {self.plan.budget_minutes:g} min (training steps x{self.plan.scale:.2f})"
                     if self.plan.budget_minutes else "")
                  + f"; ICT {preset.ict.steps} steps, REALM {preset.pretrain.steps} steps"
                  + (f", QA {preset.qa.steps} steps" if self.qa_train else ""))
        warm = self.warm_start()
        ict = self.ict(preset, warm, corpus)
        realm = self.pretrain("realm", preset, ict, warm)
        if self.qa_train:
            warm_index = self.index("baseline_index", self.run_dir / "warm_start" / "retriever", preset, [warm, corpus])
            ict_index = self.index("ict_index", self.run_dir / "ict" / "retriever", preset, [ict, corpus])
            realm_index = self.index("realm_index", self.run_dir / "realm" / "retriever", preset, [realm, corpus])
            qa = self.finetune("qa", self.run_dir / "realm", self.run_dir / "realm_index" / "index", preset, [realm_index])
            self.evaluate(preset, qa, {"off-the-shelf": (warm_index, self.run_dir / "warm_start" / "retriever"),
                                       "ICT": (ict_index, self.run_dir / "ict" / "retriever"),
                                       "REALM": (realm_index, self.run_dir / "realm" / "retriever")})
        self.examples(preset, realm)
        if self.options.ablations:
            self.finetune("qa_ict", self.run_dir / "ict", self.run_dir / "ict_index" / "index", preset, [ict_index],
                          reader=self.run_dir / "warm_start" / "reader", evaluate=True)
            for variant, changes in (("uniform", {"masking": "uniform"}), ("frozen", {"refresh_every": 0})):
                varied = dataclasses.replace(preset, pretrain=dataclasses.replace(preset.pretrain, **changes))
                pretrained = self.pretrain(f"realm_{variant}", varied, ict, warm)
                index = self.index(f"realm_{variant}_index", self.run_dir / pretrained.name / "retriever", preset,
                                   [pretrained, corpus])
                self.finetune(f"qa_{variant}", self.run_dir / pretrained.name, self.run_dir / index.name / "index",
                              preset, [index], evaluate=True)
        report = self.report(complete=True)
        self.echo(f"[pipeline] report: {report} (and {report.with_suffix('.html').name})")
        return report
