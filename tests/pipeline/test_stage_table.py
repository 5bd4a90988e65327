"""The stages of `realm pipeline`, declared once (pipeline/stage_table.py): the planner, the clock, the runner and
the report read one table, and an ablation arm is one entry of it."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from realm.cli.main import main
from realm.config import ABLATIONS_BUDGET_MINUTES, StageCosts, get_preset
from realm.pipeline.ablations import ablations
from realm.pipeline.estimate import Workload
from realm.pipeline.pace import time_stage
from realm.pipeline.plan import plan_pipeline
from realm.pipeline.run import Pipeline
from realm.pipeline.stage_table import ARMS, Arm, arms, estimate, kind_of, run_stages

WORK = Workload(blocks=16_772, qa_train=7_342, qa_dev=1_496, qa_held_out=500)


def test_the_table_orders_the_stages_each_run_takes():
    cpu = get_preset("cpu")  # no ICT in the pipeline's cpu recipe (MiniLM's retriever is the start)
    without_ict = dataclasses.replace(cpu, ict=dataclasses.replace(cpu.ict, steps=0))
    names = [s.name for s in run_stages(without_ict, WORK)]
    assert names == ["realm", "realm_index", "qa_start", "read", "qa", "eval", "examples"]
    assert [s.name for s in run_stages(cpu, Workload(blocks=100))] == ["ict", "realm", "examples"]  # no QA data
    ablated = [s.name for s in run_stages(cpu, dataclasses.replace(WORK, ablations=True))]
    assert ablated == [
        *("ict", "realm", "ict_index", "realm_index", "qa_start", "qa", "eval", "examples"),  # no reading stage
        "qa_ict",
        *("realm_uniform", "realm_uniform_index", "measure_uniform", "qa_uniform"),
        *("realm_trained", "realm_trained_index", "measure_trained", "qa_trained"),  # cpu: a fixed document tower
        *("realm_frozen", "realm_frozen_index", "measure_frozen", "qa_frozen"),
        "arms_eval",  # every arm's exact match last: a run behind answers fewer questions there
    ]
    for stage in run_stages(cpu, dataclasses.replace(WORK, ablations=True)):
        assert kind_of(stage.name) == stage.kind, stage.name  # the report and the pace read the table's kinds
        assert all(r in ablated or r in ("warm_start", "corpus", "baseline_index") for r in stage.reads), stage.name
    assert [s.name for s in estimate(cpu, WORK)] == [s.name for s in run_stages(cpu, WORK)]
    # an arm's stages are costed with its own setting: a trained document tower embeds its index anew
    embeds = {s.name: s.fixed_seconds for s in estimate(cpu, dataclasses.replace(WORK, ablations=True))}
    assert embeds["realm_trained_index"] > 0 == embeds["realm_uniform_index"]


def test_a_stage_the_plan_does_not_hold_is_refused_its_deadline_not_given_the_budget():
    cpu = get_preset("cpu")
    plan = dataclasses.replace(plan_pipeline(cpu, WORK, 70), began=time.time())
    with pytest.raises(ValueError, match="'reranker' is not a stage of this run's plan"):
        time_stage(plan, cpu, "reranker", {}, {}, {}, time.time())


def test_ablating_a_setting_is_one_entry(monkeypatch):
    """An arm added to ARMS is planned (its stages costed with its setting), compared in Table 2 and paced by its
    kind of step, with no other edit."""
    cpu = get_preset("cpu")
    alone = Arm("null", "retrieval", "retrieved blocks", "the null document alone", {"num_candidates": 1}, None)
    monkeypatch.setattr("realm.pipeline.stage_table.ARMS", (*ARMS, alone))
    assert arms(cpu.pretrain)[-1] is alone
    work = dataclasses.replace(WORK, ablations=True)
    planned = {s.name: s for s in estimate(cpu, work)}
    assert list(planned)[-5:] == ["realm_null", "realm_null_index", "measure_null", "qa_null", "arms_eval"]
    arms_eval = next(s for s in run_stages(cpu, work) if s.name == "arms_eval")
    answering = 5 * WORK.evaluated * cpu.costs.qa_question  # every arm answers the evaluation's questions
    assert arms_eval.reads[-1] == "qa_null" and planned["arms_eval"].fixed_seconds == pytest.approx(answering)
    assert planned["realm_null"].step_seconds < planned["realm"].step_seconds  # no retrieval: cheaper steps
    assert kind_of("realm_null") == "realm" and kind_of("qa_null") == "qa" and kind_of("realm_null_index") is None
    rows = {a.what: a for a in ablations(cpu.pretrain, ict=False)}
    assert (rows["retrieval"].ours_stage, rows["retrieval"].other_stage) == ("eval", "qa_null")
    assert rows["retriever"].other == "warm-start retriever (no ICT) (no REALM), REALM's reader"
    assert rows["index"].ours_stage == "qa_trained"  # a fixed document tower: the two arms that train it
    plan = plan_pipeline(cpu, work, 600)
    assert "qa_null" in [s.name for s in plan.stages]


def test_ablations_default_to_the_budget_that_keeps_every_reader_warm_up(monkeypatch, tmp_path):
    """Below ABLATIONS_BUDGET_MINUTES the plan of `--ablations` cuts REALM's reader warm-up short (cpu costs of the
    a3b6601 record); a budget given is kept, and the bare command keeps its own."""
    budgets = []

    def run(self):
        budgets.append(self.options.budget_minutes)
        return tmp_path / "report.md"

    def init(self, options, preset, echo=print):
        self.options = options

    monkeypatch.setattr(Pipeline, "__init__", init)
    monkeypatch.setattr(Pipeline, "run", run)
    base = ["pipeline", "--run-dir", str(tmp_path / "run"), "--quiet", "--preset", "cpu"]
    for extra in (["--ablations"], ["--ablations", "--budget-minutes", "120"], []):
        assert main([*base, *extra]) == 0
    assert budgets == [ABLATIONS_BUDGET_MINUTES, 120, get_preset("cpu").pipeline_budget_minutes]
    cpu = get_preset("cpu")
    no_ict = dataclasses.replace(cpu, ict=dataclasses.replace(cpu.ict, steps=0))
    work = dataclasses.replace(WORK, ablations=True, held_out_sentences=393)
    record = Path(__file__).parent / "records" / "plan_default_a3b6601.json"
    measured = dataclasses.replace(no_ict, costs=StageCosts(**json.loads(record.read_text())["costs"]))
    whole = plan_pipeline(measured, work, ABLATIONS_BUDGET_MINUTES)
    assert whole.reading_minutes is None  # the warm-up whole
    assert "4 ablation arms (retriever, masking, document tower, index), each trained as long" in whole.describe()
    assert plan_pipeline(measured, work, 120).reading_minutes is not None  # cut short
