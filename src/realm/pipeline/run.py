"""`realm pipeline`: every stage from a corpus to a report, each skipped when its output already matches. The stages
before the plan (corpus, warm start, with QA data its index, with a budget the calibration), then those of the
table (pipeline/stage_table.py) in its order, and the report, rewritten after every stage.

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
from realm.pipeline.ablations import arm_of, measured_by, paired_exact_match, paired_measures, predictions
from realm.pipeline.calibrate import calibrate, calibration_settings
from realm.pipeline.estimate import MIN_SCORED_SENTENCES, SCORED_SENTENCES, Workload, trained_preset
from realm.pipeline.pace import RunClock, StageTiming
from realm.pipeline.plan import PipelineOptions, PipelinePlan, plan_run
from realm.pipeline.records import EvalRecord, ExamplesRecord, QAStart
from realm.pipeline.report import write_report
from realm.pipeline.stage_table import ARMS_EVAL, INDEXES_BUILT_BY, MAIN_QA, Stage, kind_of, run_stages
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
        timed: TimedSteps | None = None,
    ) -> StageRecord:
        """Open-QA fine-tuning over a frozen index, its steps ending by `timed` (None: the preset's)."""

        def work(folder: Path, resume: bool) -> dict:
            train, held_out, progress = self.qa_train, self.qa_held_out, self.options.progress
            args = (model_folder, index_folder, reader, train, held_out, preset, folder, resume, progress)
            return stage_work.finetune(*args, None, timed)

        settings = qa_settings(preset) | {
            "after": [r.fingerprint for r in after],
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
                self.plan.work.least_evaluated if self.plan else 0,
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
        """The dev questions evaluation answers without a budget: a seeded sample (work.py: dev_sample) of the plan's
        size."""
        assert self.plan is not None
        return stage_work.dev_sample(self.qa_dev, self.plan.work.eval_questions)

    def arms_eval(self, stage: Stage, done: dict[str, StageRecord]) -> StageRecord:
        """Every arm's dense exact match on the dev questions the main evaluation answered, in its order, all arms
        in lockstep until the run's deadline (the run's last stage: behind, fewer questions), each paired with the
        system it is compared with (ablations.py: ablation_rows reads them)."""
        assert self.plan is not None
        preset, table = self.plan.preset, {s.name: s for s in run_stages(self.plan.preset, self.plan.work)}
        fine_tuned = {
            name: (self.stages.output(name, "best"), self.stages.output(table[name].reads[1], "index"))
            for name in stage.reads[1:]  # each arm's QA stage: its model, and the index it fine-tuned over
        }
        answered = EvalRecord.from_dict(done[MAIN_QA].result).questions
        offered = stage_work.dev_order(self.qa_dev)[: answered.evaluated if answered else len(self.qa_dev)]
        timing = self.timed(stage.name)
        deadline = None if timing is None else timing.deadline

        def work(folder: Path, resume: bool) -> dict:
            least = self.plan.work.least_evaluated if self.plan else 0
            result = stage_work.arms_exact_match(fine_tuned, self.qa_dev, offered, preset, folder, deadline, least)
            ours = {name: arm_of(name).compared_with(preset.pretrain) for name in fine_tuned}
            pair = lambda a, b: paired_exact_match(predictions(self.run_dir, a), predictions(self.run_dir, b))  # noqa: E731
            return result | {"paired": {name: pair(ours[name], name).to_dict() for name in fine_tuned}}

        after = [done[name].fingerprint for name in stage.reads]
        settings = {"after": after, "questions": len(offered), "until": deadline.at if deadline else None}
        return self.stages.run(stage.name, settings, work)

    def measure(self, name: str, pretrained: StageRecord, index: StageRecord, preset: Preset) -> StageRecord:
        """An arm's zero-shot recall on every dev question and its masked-LM gain on the held-out sentences the main
        run scored: Table 2's columns, paired with the main run's (ablations.py: measure_rows)."""
        sentences = ExamplesRecord.from_dict(self.stages.records["examples"].result).scored_sentences
        arm = arm_of(name)
        ours = arm.compared_with(preset.pretrain)

        def work(folder: Path, resume: bool) -> dict:
            corpus, index_folder = self.stages.output("corpus"), self.stages.output(index, "index")
            measured = stage_work.arm_measures(
                corpus, self.stages.output(pretrained), index_folder, self.qa_dev, preset, sentences, folder
            )
            records = {n: s.result for n, s in self.stages.records.items()} | {name: measured}
            mine = measured_by(f"qa_{arm.name}", records, self.run_dir)
            return measured | {"paired": paired_measures(measured_by(ours, records, self.run_dir), mine)}

        settings = {
            "after": [pretrained.fingerprint, index.fingerprint],
            "sentences": sentences,
            "compared_with": ours,
            "scoring": stage_work.SCORING,
            "data": describe_input(str(self.qa_files[-1])),
        }
        return self.stages.run(name, settings, work)

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
        return trained_preset(preset, kind_of(stage), steps["trained"]) if steps is not None else preset

    def run(self) -> Path:
        """The stages before the plan, the plan, then every stage of the table (stage_table.py) in its order."""
        done = self.before_plan()
        assert self.plan is not None
        for stage in run_stages(self.plan.preset, self.plan.work):
            done[stage.name] = self.run_stage(stage, done)
        report = self.report(complete=True)
        assert report is not None  # the plan exists by now
        self.echo(f"[pipeline] report: {report} (and {report.with_suffix('.html').name})")
        return report

    def before_plan(self) -> dict[str, StageRecord]:
        """The corpus, the warm start, with QA data its index over the whole corpus (QA is calibrated on it, then
        measured against it), with a budget this machine's costs; then the plan."""
        corpus = self.corpus()
        warm = self.warm_start()
        done = {"corpus": corpus, "warm_start": warm}
        if self.qa_train:
            retriever = self.stages.output("warm_start", "retriever")
            done["baseline_index"] = self.index("baseline_index", retriever, self.base_preset, [warm, corpus])
        calibration = (
            self.calibration(corpus, warm, done.get("baseline_index")) if self.options.budget_minutes else None
        )
        work = Workload(
            corpus.result["blocks"], len(self.qa_train), len(self.qa_dev), self.options.ablations, len(self.qa_held_out)
        )
        self.plan = self.make_plan(work, calibration)
        self.echo(f"[pipeline] plan: {self.plan.describe()}")
        return done

    def retrievers(self, done: dict[str, StageRecord]) -> dict[str, tuple[StageRecord, Path]]:
        """The retrievers QA starts from one of and the evaluation measures, in stage order: label -> (its index
        stage, the retriever that built it)."""
        built = INDEXES_BUILT_BY.items()
        return {
            label: (done[i], self.stages.output(trainer, "retriever")) for i, (label, trainer) in built if i in done
        }

    def run_stage(self, stage: Stage, done: dict[str, StageRecord]) -> StageRecord:
        """One stage of the table, from the records of the stages before it (`done`). An arm's trainers replay the
        steps of the main stage it is compared with (`trained`); the main ones are sized by the run's clock."""
        assert self.plan is not None
        preset, reads = self.plan.preset, [done[name] for name in stage.reads]
        if stage.kind == "ict":
            return self.ict(*self.sized("ict"), done["warm_start"], done["corpus"])
        if stage.kind == "realm" and stage.arm is None:
            realm_preset, timed = self.sized("realm")
            return self.pretrain("realm", realm_preset, reads[0], done["warm_start"], timed)
        realm_trained = self.trained("realm", self.sized("realm")[0]) if stage.arm else preset
        if stage.kind == "realm":
            return self.pretrain(stage.name, stage.preset(realm_trained), reads[0], done["warm_start"])
        if stage.name.endswith("_index"):
            return self.index(stage.name, self.stages.output(reads[0], "retriever"), preset, reads)
        if stage.name.startswith("measure_"):
            return self.measure(stage.name, reads[0], reads[1], stage.preset(realm_trained))
        if stage.name == "qa_start":
            return self.qa_start(preset, self.retrievers(done))
        if stage.name == "examples":
            return self.examples(preset, done["realm"])
        if stage.name == ARMS_EVAL:
            return self.arms_eval(stage, done)
        chosen = done["qa_start"]
        began_from = QAStart.from_dict(chosen.result)
        index_stage, retriever_folder = self.retrievers(done)[began_from.retriever]
        index_folder = self.stages.output(index_stage, "index")
        reader = self.stages.output(QA_READERS[began_from.reader], "reader")
        if stage.name == "read":
            return self.read(*self.sized("read"), retriever_folder.parent, index_folder, reader, chosen)
        if stage.name == "eval":
            return self.evaluate(preset, done["qa"], self.retrievers(done), index_folder)
        if stage.name == "qa":
            after = [chosen, done["read"]] if "read" in done else [chosen]
            reader = self.stages.output(done["read"], "reader") if "read" in done else reader
            qa_preset, timed = self.sized("qa")
            return self.finetune("qa", retriever_folder.parent, index_folder, qa_preset, after, reader, timed)
        assert stage.kind == "qa" and stage.arm is not None, stage.name
        qa_trained = self.trained("qa", self.sized("qa")[0])
        pretrained, arm_index = reads  # the arm without REALM pretraining: REALM's start and its index
        # ... with the main arm's reader start (REALM's): the retriever alone differs
        realm_reader = self.stages.output("realm", "reader") if not stage.changes else None
        start, index = self.stages.output(pretrained), self.stages.output(arm_index, "index")
        return self.finetune(stage.name, start, index, qa_trained, [arm_index], realm_reader)
