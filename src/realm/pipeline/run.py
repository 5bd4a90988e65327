"""`realm pipeline`: every stage from a corpus to a report, each skipped when its output already matches.

    corpus -> warm start -> [QA: off-the-shelf index] -> [budget: calibration, then the plan] -> [ICT] -> REALM
           pretraining (first index, asynchronous refresher) -> [QA: ICT and REALM indexes -> the start (the best
           retriever by zero-shot recall) -> fine-tuning -> evaluation (dense, BM25, zero-shot recall)] -> examples
           -> [ablations: ICT-only retriever, uniform masking, document tower trained (if the recipe fixes it),
               frozen index; each fine-tuned and evaluated]
    and the report, rewritten after every stage.

Each stage writes into `<run>/<stage>/` and finishes by writing `<run>/stages/<stage>.json` (its fingerprint,
duration and results) atomically; the fingerprint covers the stage's settings, the content of its input files and
the fingerprints of the stages it reads (pipeline/stages.py). The step counts are planned once per run (plan.json).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from realm.common.weights import MINILM
from realm.config import Preset
from realm.data.qa_examples import QAExample, load_qa
from realm.data.question_sets import QUESTION_SETS, question_file
from realm.data.sources import squad_question_titles
from realm.index.mips import MipsIndex
from realm.models.mlm_reader import Reader
from realm.models.retriever import Retriever
from realm.pipeline import work as stage_work
from realm.pipeline.ablations import ablation_variants
from realm.pipeline.calibrate import calibrate, calibration_settings
from realm.pipeline.estimate import (
    MIN_EVAL_QUESTIONS,
    MIN_SCORED_SENTENCES,
    SCORED_SENTENCES,
    Workload,
    trained_preset,
)
from realm.pipeline.pace import RunClock, StageTiming
from realm.pipeline.plan import PipelineOptions, PipelinePlan, plan_run
from realm.pipeline.report import write_report
from realm.pipeline.stages import StageRecord, Stages, describe_input, last_metrics
from realm.recipes.finetune_qa import qa_settings
from realm.recipes.ict import ict_settings, train_ict
from realm.recipes.pretrain import SENTENCE_USAGE, pretrain_settings, train_pretrain
from realm.recipes.reading import reading_settings, reading_summary, train_reading
from realm.training.schedule import TimedSteps, read_steps

log = logging.getLogger(__name__)
PLANNED_AFTER = ("corpus", "warm_start", "baseline_index", "calibration")  # their seconds count against the budget
# the reader QA fine-tunes from: REALM's masked-LM reader was no better a start than MiniLM's (-1.04 EM [-2.77, +0.75]
# on the tuning split, retriever fixed:
# docs/log/2026-11-28-results-honest-numbers-the-choices-re-measured-on-a-tuning-split-nineteenth.md)
QA_READERS = {"warm start": "warm_start", "REALM": "realm"}
QA_READER = "warm start"


class Pipeline:
    """The stages of one run, in order; `run()` returns the report path."""

    def __init__(self, options: PipelineOptions, preset: Preset, echo: Callable[[str], None] = print):
        if (options.qa_train is None) != (options.qa_dev is None):
            raise ValueError("give both --qa-train and --qa-dev, or neither")
        if options.ablations and options.qa_train is None:
            raise ValueError(
                "--ablations compares exact match: it needs QA data (a --qa-set other than none, or --qa-train and --qa-dev)"
            )
        self.options = options
        self.base_preset = preset
        self.run_dir = Path(options.run_dir)
        self.stages = Stages(self.run_dir, echo, on_finish=lambda: self.report(complete=False))
        self.echo = echo
        articles = squad_question_titles(options.qa_articles)
        # a QA file, or a named set (data/question_sets.py) written once into the cache
        self.qa_files = [question_file(spec) for spec in (options.qa_train, options.qa_dev) if spec is not None]
        qa_train = load_qa(self.qa_files[0], articles) if self.qa_files else []
        # what QA fine-tunes on, and the training questions of held-out articles that choose its start and its
        # query tower (split_training_questions)
        self.qa_train, self.qa_held_out = stage_work.split_training_questions(qa_train)
        if options.qa_train and not self.qa_held_out:
            raise ValueError(
                f"{options.qa_train}: {len(qa_train)} questions, and no article's questions fit in a fifth of them; "
                "QA fine-tuning holds out whole articles to choose retrievers on: give more questions or articles"
            )
        self.qa_dev: list[QAExample] = load_qa(self.qa_files[1]) if self.qa_files else []
        self.plan: PipelinePlan | None = None
        self.began = time.time()  # the report counts this invocation's time from here

    # -- stages ---------------------------------------------------------------------------------------
    def corpus(self) -> StageRecord:
        preset = self.base_preset
        tokenizer_spec = MINILM if self.options.warm_start in (MINILM, "random") else self.options.warm_start

        def work(folder: Path, resume: bool) -> dict:
            return stage_work.build_corpus_folder(
                self.options.inputs, folder, tokenizer_spec, preset, self.options.progress
            )

        inputs = [describe_input(i) for i in self.options.inputs]
        return self.stages.run(
            "corpus", {"inputs": inputs, "corpus": dataclasses.asdict(preset.corpus), "tokenizer": tokenizer_spec}, work
        )

    def warm_start(self) -> StageRecord:
        """Both towers and the reader as the later stages start from them, saved so every stage reads the same."""

        preset = self.base_preset

        def work(folder: Path, resume: bool) -> dict:
            retriever = Retriever.load(self.options.warm_start, preset.retriever)
            retriever.save(folder / "retriever")
            Reader.load(self.options.warm_start, preset.retriever.shape).save(folder / "reader")
            return {"model": self.options.warm_start, "doc_tower_fingerprint": retriever.doc_fingerprint()}

        return self.stages.run(
            "warm_start", {"model": self.options.warm_start, "retriever": dataclasses.asdict(preset.retriever)}, work
        )

    def ict(self, preset: Preset, timed: TimedSteps | None, warm: StageRecord, corpus: StageRecord) -> StageRecord:

        def work(folder: Path, resume: bool) -> dict:
            train_ict(
                self.stages.output("corpus"),
                folder,
                str(self.stages.output("warm_start", "retriever")),
                preset,
                resume=resume,
                progress=self.options.progress,
                timed=timed,
            )
            return last_metrics(folder) | {"steps_trained": read_steps(folder)}

        return self.stages.run("ict", {"after": [corpus.fingerprint, warm.fingerprint]} | ict_settings(preset), work)

    def index(self, name: str, retriever_folder: Path, preset: Preset, after: list[StageRecord]) -> StageRecord:
        """Embed the corpus with a retriever's document tower (zero-shot recall, and the ICT-only baseline)."""

        def work(folder: Path, resume: bool) -> dict:
            return stage_work.build_index_folder(
                retriever_folder, self.run_dir, folder / "index", preset, self.options.progress
            )

        settings = {"after": [r.fingerprint for r in after], "embed": dataclasses.asdict(preset.embed)}
        return self.stages.run(name, settings | {"index": dataclasses.asdict(preset.index)}, work)

    def pretrain(
        self, name: str, preset: Preset, start: StageRecord, warm: StageRecord, timed: TimedSteps | None = None
    ) -> StageRecord:
        """REALM pretraining from `start`'s retriever (ICT's, or the warm start's), whose index it builds first;
        its steps end by `timed` (None: the preset's)."""

        def work(folder: Path, resume: bool) -> dict:
            train_pretrain(
                self.stages.output("corpus"),
                folder,
                str(self.stages.output(start, "retriever")),
                str(self.stages.output("warm_start", "reader")),
                preset,
                resume=resume,
                progress=self.options.progress,
                reuse_indexes=stage_work.run_indexes(self.run_dir),
                timed=timed,
            )
            sentences = json.loads((folder / SENTENCE_USAGE).read_text())
            index = {"index_version": MipsIndex(folder / "index").version}
            return last_metrics(folder) | index | {"sentences": sentences, "steps_trained": read_steps(folder)}

        settings = {"after": [start.fingerprint, warm.fingerprint]} | pretrain_settings(preset)  # all it reads
        return self.stages.run(name, settings, work)

    def finetune(
        self,
        name: str,
        model_folder: Path,
        index_folder: Path,
        preset: Preset,
        after: list[StageRecord],
        reader: Path | None = None,
        evaluate: bool = False,
        timed: TimedSteps | None = None,
    ) -> StageRecord:
        """Open-QA fine-tuning over a frozen index, its steps ending by `timed` (None: the preset's), and for the
        ablations dense evaluation on the dev sample."""

        evaluated = self.dev_sample() if evaluate else None

        def work(folder: Path, resume: bool) -> dict:
            return stage_work.finetune(
                model_folder,
                index_folder,
                reader,
                self.qa_train,
                self.qa_held_out,
                preset,
                folder,
                resume,
                self.options.progress,
                evaluated,
                timed,
            )

        settings = qa_settings(preset) | {
            "after": [r.fingerprint for r in after],
            "evaluate": len(evaluated) if evaluated is not None else False,
            "reader": str(reader) if reader else None,
            "data": [describe_input(str(path)) for path in self.qa_files],
            "held_out": self.selection(),
        }
        return self.stages.run(name, settings, work)

    def read(
        self,
        preset: Preset,
        timed: TimedSteps | None,
        model_folder: Path,
        index_folder: Path,
        reader: Path,
        chosen: StageRecord,
    ) -> StageRecord:
        """The reading stage: `reader` trained on the blocks holding each training question's answer (and retrieved
        ones without), found with the chosen retriever over `index_folder`; QA fine-tunes from what it saves."""

        def work(folder: Path, resume: bool) -> dict:
            train_reading(
                str(model_folder),
                index_folder,
                self.qa_train,
                folder,
                preset,
                resume=resume,
                progress=self.options.progress,
                reader_spec=str(reader),
                timed=timed,
            )
            return last_metrics(folder) | reading_summary(folder) | {"steps_trained": read_steps(folder)}

        settings = reading_settings(preset) | {
            "after": [chosen.fingerprint],
            "reader": str(reader),
            "data": describe_input(str(self.qa_files[0])),
        }
        return self.stages.run("read", settings, work)

    def qa_start(self, preset: Preset, retrievers: dict[str, tuple[StageRecord, Path]]) -> StageRecord:
        """The retriever and reader QA fine-tunes from (work.py: choose_qa_start), never a worse retriever than the
        run has, silently; with --ablations REALM's own, whose pretraining the ablations measure."""
        fixed = "REALM" if self.options.ablations else None
        folders = {label: (self.stages.output(stage, "index"), path) for label, (stage, path) in retrievers.items()}
        reader = fixed or QA_READER
        after = [stage.fingerprint for stage, _ in retrievers.values()]
        settings = {
            "after": after,
            "fixed": fixed,
            "reader": reader,
            "data": describe_input(str(self.qa_files[0])),
        }
        work = lambda folder, resume: stage_work.choose_qa_start(folders, self.qa_held_out, preset, reader, fixed)  # noqa: E731
        return self.stages.run("qa_start", settings | {"questions": self.selection()}, work)

    def selection(self) -> dict:
        """What chose the retrievers, for the fingerprints: how many questions, of which articles."""
        articles = self.options.qa_articles
        return {
            "questions": len(self.qa_held_out),
            "articles": len({e.article for e in self.qa_held_out}) if self.qa_held_out[0].article else None,
            "named_by": describe_input(str(articles)) if articles else None,
        }

    def evaluate(
        self, preset: Preset, qa: StageRecord, zero_shot: dict[str, tuple[StageRecord, Path]], index_folder: Path
    ) -> StageRecord:
        """EM, recall and outcomes of the fine-tuned model with dense (over `index_folder`, its retriever's), BM25
        and hybrid retrieval, and zero-shot recall of each retriever before fine-tuning (`zero_shot`: row label ->
        (its index stage, the retriever))."""
        retrievers = {
            label: (self.stages.output(stage, "index"), folder) for label, (stage, folder) in zero_shot.items()
        }
        timing = self.timed("eval")  # with a budget: all of dev offered, in the seeded order, until the stage's end
        evaluated = self.dev_sample() if timing is None else stage_work.dev_order(self.qa_dev)
        deadline = None if timing is None else timing.deadline

        def work(folder: Path, resume: bool) -> dict:
            best, corpus = self.stages.output(qa, "best"), self.stages.output("corpus")
            result = stage_work.evaluate_systems(
                best,
                corpus,
                index_folder,
                retrievers,
                self.qa_dev,
                evaluated,
                preset,
                folder,
                deadline,
                MIN_EVAL_QUESTIONS,
            )
            named = str(self.options.qa_dev)
            return result | {"question_set": named if named in QUESTION_SETS else None}

        settings = {
            "after": [qa.fingerprint, *(s.fingerprint for s, _ in zero_shot.values())],
            "systems": stage_work.SYSTEMS,
            "questions": len(evaluated),
            "until": deadline.at if deadline is not None else None,
        }
        return self.stages.run("eval", settings, work)

    def examples(self, preset: Preset, realm: StageRecord) -> StageRecord:
        """The paper's Table 3 in miniature, and masked-span accuracy with and without retrieval (held out)."""

        assert self.plan is not None
        timing = self.timed("examples")  # with a budget: up to SCORED_SENTENCES, until the stage's end
        sentences = self.plan.work.scored_sentences if timing is None else SCORED_SENTENCES
        deadline = None if timing is None else timing.deadline

        def work(folder: Path, resume: bool) -> dict:
            corpus, realm_run = self.stages.output("corpus"), self.stages.output(realm)
            return stage_work.pretraining_examples(corpus, realm_run, preset, sentences, deadline, MIN_SCORED_SENTENCES)

        scoring = stage_work.SCORING | {"sentences": sentences, "until": deadline.at if deadline else None}
        return self.stages.run(
            "examples", {"after": [realm.fingerprint], "pool": stage_work.EXAMPLE_POOL, "scoring": scoring}, work
        )

    def dev_sample(self) -> list[QAExample]:
        """The dev questions evaluation answers without a budget, and the ablations with one (each compared on the
        same questions): a seeded sample (work.py: dev_sample) of the plan's size."""
        assert self.plan is not None
        return stage_work.dev_sample(self.qa_dev, self.plan.work.eval_questions)

    def ablations(
        self,
        realm_preset: Preset,
        qa_preset: Preset,
        start: StageRecord,
        start_index: StageRecord,
        warm: StageRecord,
        corpus: StageRecord,
    ) -> None:
        """The paper's ablations (ablations.py), each fine-tuned and evaluated. Every ablated run trains exactly as
        long as the main one it is compared with (`realm_preset`, `qa_preset`: the steps the run's pace gave the main
        REALM and QA stages): pacing each on its own gave the later ones 5-30% more steps, which the comparison
        would have read as their effect."""
        self.finetune(
            "qa_ict",
            self.stages.output(start),
            self.stages.output(start_index, "index"),
            qa_preset,
            [start_index],
            reader=self.stages.output("warm_start", "reader"),
            evaluate=True,
        )
        for variant, changes in ablation_variants(realm_preset.pretrain).items():
            varied = dataclasses.replace(realm_preset, pretrain=dataclasses.replace(realm_preset.pretrain, **changes))
            pretrained = self.pretrain(f"realm_{variant}", varied, start, warm)
            retriever = self.stages.output(pretrained, "retriever")
            index = self.index(f"realm_{variant}_index", retriever, realm_preset, [pretrained, corpus])
            index_folder = self.stages.output(index, "index")
            self.finetune(
                f"qa_{variant}", self.stages.output(pretrained), index_folder, qa_preset, [index], evaluate=True
            )

    # -- the run --------------------------------------------------------------------------------------
    def report(self, complete: bool) -> Path | None:
        """The report of the stages finished so far (none before the plan exists)."""

        if self.plan is None:
            return None
        return write_report(
            self.run_dir, self.stages.records, self.plan, time.time() - self.began, self.options.command, complete
        )

    def calibration(self, corpus: StageRecord, warm: StageRecord, warm_index: StageRecord | None) -> dict | None:
        """This machine's stage costs, measured on a sample of the run's data, QA on the off-the-shelf index of the
        whole corpus (`warm_index`: the reader's blocks are those retrieval picks there) (None: too little data)."""

        preset = self.base_preset

        def work(folder: Path, resume: bool) -> dict:
            qa = (self.qa_train, self.qa_dev, self.stages.output("baseline_index", "index")) if warm_index else None
            try:
                return calibrate(self.stages.output("corpus"), self.stages.output("warm_start"), folder, preset, qa)
            except ValueError as err:  # e.g. fewer blocks than an ICT batch: the preset's constants will do
                return {"fallback": str(err)}

        data = [describe_input(str(path)) for path in self.qa_files]
        after = [r.fingerprint for r in (corpus, warm, warm_index) if r]
        settings = {"after": after, "qa": data, **calibration_settings(preset)}
        result = self.stages.run("calibration", settings, work).result
        if "fallback" in result:
            self.echo(
                f"[pipeline] calibration: not possible ({result['fallback']}); planning with {preset.costs.source}"
            )
            return None
        return result

    def make_plan(self, work: Workload, calibration: dict | None = None) -> PipelinePlan:
        """The run's plan (plan.json), counting what the stages before it took."""
        spent = (r.seconds for name, r in self.stages.records.items() if name in PLANNED_AFTER)
        share = (calibration or {}).get("measured", {}).get("held_out_sentences_per_block")
        if share is not None:  # held-out sentences with a salient span: the calibration sample's share of blocks
            work = dataclasses.replace(work, held_out_sentences=round(share * work.blocks))
        return plan_run(self.options, self.base_preset, work, calibration, sum(spent), self.began)

    @property
    def clock(self) -> RunClock:
        """The run's clock after its plan (pipeline/pace.py): each stage's deadline as it begins."""
        assert self.plan is not None
        return RunClock(self.plan, self.base_preset, self.run_dir, self.stages.records, self.echo)

    def timed(self, stage: str) -> StageTiming | None:
        """How `stage`, about to begin, is sized to what is left of the budget (None without a budget)."""
        return self.clock.timing(stage)

    def sized(self, stage: str) -> tuple[Preset, TimedSteps | None]:
        """The preset a training stage begins with, and the deadline its steps end by with what sizes them (None:
        fixed steps)."""
        return self.clock.sized(stage)

    def trained(self, stage: str, preset: Preset) -> Preset:
        """`preset` with the steps `stage` trained (its steps.json), for a run compared with it."""
        steps = read_steps(self.run_dir / stage)
        return trained_preset(preset, stage, steps["trained"]) if steps is not None else preset

    def run(self) -> Path:
        corpus = self.corpus()
        warm = self.warm_start()
        # the off-the-shelf index over the whole corpus: QA is calibrated on it, then measured against it
        warm_index = (
            self.index(
                "baseline_index", self.stages.output("warm_start", "retriever"), self.base_preset, [warm, corpus]
            )
            if self.qa_train
            else None
        )
        calibration = self.calibration(corpus, warm, warm_index) if self.options.budget_minutes else None
        work = Workload(
            corpus.result["blocks"], len(self.qa_train), len(self.qa_dev), self.options.ablations, len(self.qa_held_out)
        )
        self.plan = self.make_plan(work, calibration)
        preset = self.plan.preset
        self.echo(f"[pipeline] plan: {self.plan.describe()}")
        start = self.ict(*self.sized("ict"), warm, corpus) if preset.ict.steps else warm
        realm_preset, realm_timed = self.sized("realm")
        realm = self.pretrain("realm", realm_preset, start, warm, realm_timed)
        if warm_index is not None:
            start_index = warm_index
            retrievers = {"off-the-shelf": (warm_index, self.stages.output("warm_start", "retriever"))}
            if preset.ict.steps:
                start_index = self.index("ict_index", self.stages.output("ict", "retriever"), preset, [start, corpus])
                retrievers["ICT"] = (start_index, self.stages.output("ict", "retriever"))
            realm_index = self.index("realm_index", self.stages.output("realm", "retriever"), preset, [realm, corpus])
            retrievers["REALM"] = (realm_index, self.stages.output("realm", "retriever"))
            chosen = self.qa_start(preset, retrievers)
            index_stage, retriever_folder = retrievers[chosen.result["retriever"]]
            index_folder = self.stages.output(index_stage, "index")
            reader = self.stages.output(QA_READERS[chosen.result["reader"]], "reader")
            after = [chosen]
            # the reader first reads answer-bearing blocks (recipes/reading.py); not with --ablations, whose arms
            # fine-tune without it: the arms and the main run compared like for like
            if preset.reading.total_steps(len(self.qa_train)) and not self.options.ablations:
                read = self.read(*self.sized("read"), retriever_folder.parent, index_folder, reader, chosen)
                reader, after = self.stages.output(read, "reader"), [chosen, read]
            qa_preset, qa_timed = self.sized("qa")
            qa = self.finetune(
                "qa", retriever_folder.parent, index_folder, qa_preset, after, reader=reader, timed=qa_timed
            )
            self.evaluate(preset, qa, retrievers, index_folder)
        self.examples(preset, realm)
        if self.options.ablations:
            realm_trained, qa_trained = self.trained("realm", realm_preset), self.trained("qa", qa_preset)
            self.ablations(realm_trained, qa_trained, start, start_index, warm, corpus)
        report = self.report(complete=True)
        assert report is not None  # the plan exists by now
        self.echo(f"[pipeline] report: {report} (and {report.with_suffix('.html').name})")
        return report
