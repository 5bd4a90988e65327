"""`realm pipeline`: the time budget, stage skipping/resuming, and a whole run on tiny random models."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from conftest import DOCS, TINY_CORPUS, TINY_EMBED, TINY_QA, TINY_RETRIEVER

from realm.config import ICTConfig, IndexConfig, Preset, PretrainConfig, ReadingConfig, StageCosts, get_preset
from realm.data.qa_examples import load_qa
from realm.index.mips import current_version, read_meta
from realm.models.retriever import Retriever
from realm.pipeline.calibrate import FINAL_SECONDS
from realm.pipeline.estimate import (
    Workload,
    costed_for,
    pretrain_step_seconds,
    qa_min_steps,
    reader_warmup_steps,
    scale_preset,
)
from realm.pipeline.plan import PipelineOptions, plan_pipeline
from realm.pipeline.run import Pipeline
from realm.pipeline.stage_table import ARMS_EVAL, BEFORE_PLAN
from realm.pipeline.stages import STAGES, Stages, describe_input
from realm.pipeline.work import EXAMPLE_POOL, dev_order


def test_budget_scales_every_training_stage_to_fit():
    cpu = get_preset("cpu")
    work = Workload(blocks=16_772, qa_train=9_074, qa_dev=1_496)
    unscaled = plan_pipeline(cpu, work, None)
    assert unscaled.scale == 1.0 and unscaled.preset == cpu
    plan = plan_pipeline(cpu, work, 60)
    assert plan.estimated_minutes == pytest.approx(60, abs=1)
    assert plan.scale < 1
    assert plan.preset.ict.steps == round(cpu.ict.steps * plan.scale)
    assert plan.preset.pretrain.steps == round(cpu.pretrain.steps * plan.scale)
    assert cpu.qa.total_steps(9_074) == 681  # 0.6 of an epoch of 9,074 questions at batch 8 (1,135 steps)
    assert plan.preset.qa.steps == round(681 * plan.scale)
    assert plan.preset.reading.steps == round(cpu.reading.total_steps(9_074) * plan.scale) > 0  # two passes
    assert plan.preset.pretrain.retriever_frozen_steps == round(cpu.pretrain.retriever_frozen_steps * plan.scale)
    assert plan.preset.pretrain.null_warmup_steps == round(cpu.pretrain.null_warmup_steps * plan.scale)
    assert 0 < plan.preset.pretrain.refresh_every < cpu.pretrain.refresh_every
    longer = plan_pipeline(cpu, work, 600)
    assert longer.preset.pretrain.steps > cpu.pretrain.steps  # a bigger budget buys more steps
    # a warm-up cut short of what the reader needs to read: the plan says which budget keeps it
    assert (
        reader_warmup_steps(cpu.pretrain) == 1000
    )  # 1,000 steps of 8 sentences (pipeline/estimate.py: WARMUP_FINDING)
    assert plan.preset.pretrain.null_warmup_steps < 1000 and plan.reading_minutes is not None
    kept = plan_pipeline(cpu, work, plan.reading_minutes)
    assert kept.preset.pretrain.null_warmup_steps >= 1000 and kept.reading_minutes is None
    assert f"a budget of about {math.ceil(plan.reading_minutes)} min" in plan.describe()
    assert longer.reading_minutes is None and "warm-up" not in longer.describe()
    with_ablations = plan_pipeline(cpu, dataclasses.replace(work, ablations=True), 60)
    assert with_ablations.preset.pretrain.steps < plan.preset.pretrain.steps  # the same budget, more runs
    with pytest.raises(ValueError, match="too small"):
        plan_pipeline(cpu, work, 5)
    embeds = {s.name: s.fixed_seconds > 0 for s in with_ablations.stages if s.name.endswith("index")}
    # a fixed document tower is embedded once (the REALM stage's first index); the runs that train it, anew (the
    # off-the-shelf index is built before planning: counted in the spent seconds)
    assert embeds == {
        "ict_index": False,
        "realm_index": False,
        "realm_uniform_index": False,
        "realm_trained_index": True,
        "realm_frozen_index": True,
    }
    with pytest.raises(ValueError, match="need QA"):
        Workload(blocks=10, ablations=True)


def test_each_stage_is_allotted_what_is_left_less_the_stages_after_it_each_kind_of_step_at_its_own_pace():
    from realm.pipeline.pace import PACE_BOUND, time_stage

    cpu = get_preset("cpu")
    cpu = dataclasses.replace(cpu, reading=dataclasses.replace(cpu.reading, epochs=2.0))  # with the reading stage
    work = Workload(blocks=16772, qa_train=9074, qa_dev=1496, qa_held_out=500)
    plan = dataclasses.replace(plan_pipeline(cpu, work, 90, spent_seconds=120.0), began=0.0)
    planned = {s.name: s for s in plan.stages}
    ict, realm = planned["ict"], planned["realm"]
    slack = 90 * 60 - 60 * plan.estimated_minutes  # what the plan's rounding left unspent
    first = time_stage(plan, cpu, "ict", {"calibration": 120.0}, {}, {}, now=120.0)
    assert first.allotted == pytest.approx(ict.seconds + slack, abs=1.0)  # the first: what the plan gave it
    assert first.scale == pytest.approx(plan.scale, rel=0.01) and first.timed.deadline.at == 120.0 + first.allotted
    # ICT's steps ran 1.4x slower than calibrated: REALM is paced by its own steps, and takes the overrun
    ict_steps = ict.steps * ict.step_seconds
    took = {"calibration": 120.0, "ict": ict.fixed_seconds + 1.4 * ict_steps}
    now = sum(took.values())
    timing = time_stage(plan, cpu, "realm", took, {"ict": ict}, {"ict": 1.4 * ict_steps}, now)
    assert timing.pace.steps == {"ict": pytest.approx(1.4)} and timing.pace.of("realm") == 1.0
    after = [s for s in plan.stages if s.name not in ("ict", "realm")]
    rest = sum(s.seconds for s in after) + cpu.costs.fixed_seconds
    assert timing.allotted == pytest.approx(90 * 60 - now - rest)
    assert timing.allotted == pytest.approx(realm.seconds + slack - 0.4 * ict_steps, abs=1.0)
    assert timing.scale < plan.scale and timing.timed.deadline.at == pytest.approx(now + timing.allotted)
    assert timing.timed.step_seconds == cpu.costs.query_tower_pretrain_step  # a retrieval step, sized
    sized = scale_preset(cpu, timing.scale, work.qa_train).pretrain
    assert timing.timed.reserved_steps == sized.steps - sized.null_warmup_steps
    # REALM as the plan estimated it, then QA: what is left less the evaluation, the examples and the end
    took["realm"], ran, stepping = realm.seconds, {"ict": ict, "realm": realm}, {"ict": 1.4 * ict_steps}
    stepping["realm"] = realm.steps * realm.step_seconds
    now += realm.seconds
    # the reading stage (recipes/reading.py): what is left less QA and what follows it, sized at its own step
    read = planned["read"]
    timing = time_stage(plan, cpu, "read", took, ran, stepping, now)
    before_read = sum(planned[name].seconds for name in ("read", "qa_start", "ict_index", "realm_index"))
    assert timing.allotted == pytest.approx(before_read + slack - 0.4 * ict_steps, abs=1.0)
    assert timing.timed.step_seconds == cpu.costs.read_step and timing.scale < plan.scale
    assert scale_preset(cpu, plan.scale, work.qa_train).reading.steps == read.steps > 0
    took["read"], ran["read"], stepping["read"] = read.seconds, read, read.steps * read.step_seconds
    now += read.seconds
    timing = time_stage(plan, cpu, "qa", took, ran, stepping, now)
    assert timing.pace.steps == {"ict": pytest.approx(1.4), "realm": 1.0, "read": 1.0}
    assert timing.pace.other == pytest.approx(1.0)
    skipped = before_read - read.seconds  # the stages between REALM and the reading stage this test did not run
    assert timing.allotted == pytest.approx(planned["qa"].seconds + skipped + slack - 0.4 * ict_steps, abs=1.0)
    scoring = timing.timed.scoring_seconds
    assert scoring == pytest.approx(500 * cpu.costs.qa_question) and timing.timed.epoch_steps == 1135
    assert timing.timed.deadline.at < now + timing.allotted - scoring  # the last scoring and recalls after the steps
    assert timing.timed.least_steps == qa_min_steps(cpu.qa)
    # a stage ten times slower (a shared machine for a minute, a cut and resume) moves its pace by PACE_BOUND at most
    stalled = {"calibration": 120.0, "ict": ict.fixed_seconds + 10 * ict_steps}
    timing = time_stage(plan, cpu, "realm", stalled, {"ict": ict}, {"ict": 10 * ict_steps}, sum(stalled.values()))
    assert timing.pace.steps["ict"] == PACE_BOUND


def test_under_ablations_a_stage_shares_the_runs_delay_with_the_arms_that_replay_its_steps():
    """The 120-minute --ablations run of 7a2364d: REALM's steps ran 1.37x slower than calibrated, and QA, allotted
    what was left less the four QA arms at the plan's steps, got 0.18 of its steps (the arms then replayed those, and
    the run would have ended far inside its budget). QA and its replays now share what is left, at one scale."""
    from realm.pipeline.pace import time_stage
    from realm.pipeline.stage_table import estimate

    cpu = get_preset("cpu")
    work = Workload(blocks=16772, qa_train=9074, qa_dev=1496, qa_held_out=500, ablations=True)
    plan = dataclasses.replace(plan_pipeline(cpu, work, 120, spent_seconds=140.0), began=0.0)
    planned = {s.name: s for s in plan.stages}
    assert "read" not in planned and "reading" not in plan.describe()  # the arms compare REALM's reader, unread
    realm = planned["realm"]
    stepping = {"realm": 1.37 * realm.steps * realm.step_seconds}
    took = {"calibration": 140.0, "realm": realm.fixed_seconds + stepping["realm"]}
    took |= {name: planned[name].seconds for name in ("realm_index", "qa_start")}
    now = sum(took.values())
    timing = time_stage(plan, cpu, "qa", took, {"realm": realm}, stepping, now)
    replays = [name for name in planned if name.startswith("qa_") and name != "qa_start"]
    assert len(replays) == 4  # the retriever, masking, document tower and index arms
    at = {s.name: s for s in estimate(scale_preset(cpu, timing.scale, work.qa_train), plan.work)}
    arms = sum(timing.pace.seconds(at[name]) for name in replays)
    assert timing.allotted == pytest.approx(timing.pace.seconds(at["qa"]), rel=0.02)  # its share; the arms' after it
    names = list(planned)
    others = [name for name in names[names.index("qa") + 1 :] if name not in replays]
    rest = sum(timing.pace.seconds(planned[name]) for name in others) + cpu.costs.fixed_seconds
    assert now + timing.allotted + arms + rest == pytest.approx(120 * 60, abs=5.0)  # all of what is left, no more
    assert 0.5 * plan.scale < timing.scale < plan.scale  # the delay spread over five, not taken by one
    # QA's steps ran 1.5x slower than calibrated, so it trained fewer in its share; the arms replay those: the
    # evaluation after it (which answered only its least, 300 questions, in the rerun at e5effc9) gets its plan's time
    trained = dataclasses.replace(at["qa"], steps=round(at["qa"].steps / 1.5))
    stepping["qa"] = 1.5 * trained.steps * trained.step_seconds
    took["qa"] = trained.fixed_seconds + stepping["qa"]
    now += took["qa"]
    evaluation = time_stage(plan, cpu, "eval", took, {"realm": realm, "qa": trained}, stepping, now)
    assert evaluation.allotted == pytest.approx(planned["eval"].seconds, rel=0.05)
    assert evaluation.sample == pytest.approx(plan.work.evaluated, rel=0.1)  # not its least (300)
    plain = dataclasses.replace(plan_pipeline(cpu, dataclasses.replace(work, ablations=False), 120), began=0.0)
    alone = time_stage(plain, cpu, "qa", {"calibration": 140.0}, {}, {}, 140.0)
    assert alone.allotted > 0 and "qa_ict" not in {s.name for s in plain.stages}  # no arms: as before


def test_a_few_slow_seconds_do_not_set_the_pace_and_under_ablations_the_evaluation_and_arms_share_one_sample(
    tmp_path,
):
    """The 55-minute --ablations run at 77fed70: ~40 estimated seconds of loading and scoring before the evaluation
    took 1.5x; the pace of all non-step work read 1.50x (0.96x once the evaluation had run) and, applied to the
    arms' indexes, measures and scoring, cut the evaluation to its least. A short timing counts little beside the
    prior. The 120-minute run at 6e8ce53 began its evaluation 5.9 min behind, held to the plan's 1,496 questions with
    four arms answering them after it: it would have ended near 1.08 of its budget. The evaluation's sample is sized
    with the arms' exact match on it, and the arms answer what the evaluation answered: behind, both shrink."""
    from realm.pipeline.estimate import StageEstimate
    from realm.pipeline.pace import OTHER_PRIOR_SHARE, RunClock, run_pace, time_stage
    from realm.pipeline.records import DevQuestions, EvalRecord
    from realm.pipeline.stages import StageRecord

    short = {"qa_start": StageEstimate("qa_start", 0, 0.0, 4.0), "qa": StageEstimate("qa", 100, 1.0, 36.0)}
    took, stepping = {"qa_start": 6.0, "qa": 100.0 + 54.0}, {"qa": 100.0}  # 60 s of the 40 estimated
    assert run_pace(short, took, stepping).other == pytest.approx(1.5)
    prior = OTHER_PRIOR_SHARE * 55 * 60  # 165 s at 1.0x
    assert run_pace(short, took, stepping, prior).other == pytest.approx((60 + prior) / (40 + prior))  # 1.10

    record = json.loads((Path(__file__).parent / "records" / "plan_default_a3b6601.json").read_text())
    cpu = dataclasses.replace(get_preset("cpu"), costs=StageCosts(**record["costs"]))  # this machine's, measured
    cpu = dataclasses.replace(cpu, ict=dataclasses.replace(cpu.ict, steps=0))  # as the CLI runs it here: no ICT
    c = cpu.costs
    work = Workload(blocks=16772, qa_train=9074, qa_dev=1496, qa_held_out=500, ablations=True)
    plan = dataclasses.replace(plan_pipeline(cpu, work, 55, spent_seconds=136.0), began=0.0)
    planned = {s.name: s for s in plan.stages}
    arms = [name for name in planned if name.startswith("qa_") and name != "qa_start"]
    assert len(arms) == 4 and plan.work.evaluated > 300
    ran = {name: planned[name] for name in ("realm", "qa")}
    stepping = {name: e.steps * e.step_seconds for name, e in ran.items()}
    took = {"calibration": 136.0} | {name: planned[name].seconds for name in ("realm", "realm_index", "qa_start")}
    for late, clamped in ((-150.0, False), (120.0, True)):  # QA ended early, or late: the evaluation is behind
        took["qa"] = planned["qa"].seconds + late
        now = sum(took.values())
        timing = time_stage(plan, cpu, "eval", took, ran, stepping, now)
        names = list(planned)
        rest = sum(timing.pace.seconds(planned[n]) for n in names[names.index("eval") + 1 :])
        rest += c.fixed_seconds * timing.pace.other
        left = 55 * 60 - now - rest  # what the evaluation was allotted before, the arms' EM at the plan's sample
        arm_em = len(arms) * c.qa_question * timing.pace.other  # per question answered
        assert timing.allotted == pytest.approx(left + (plan.work.evaluated - timing.sample) * arm_em)
        assert (timing.sample > plan.work.evaluated) != clamped  # ahead: every arm answers more questions
        zero_shot = planned["eval"].fixed_seconds - plan.work.evaluated * c.qa_systems_question
        own = (zero_shot + timing.sample * c.qa_systems_question) * timing.pace.other
        assert (timing.sample == 300) == clamped and (timing.allotted < own) == clamped
        if not clamped:  # its share of what is left answers the sample, the arms' the same questions after it
            assert timing.allotted == pytest.approx(own, abs=c.qa_systems_question + arm_em)
    # the arms answer what the evaluation answered (run.py: dev_sample), and the clock estimates them so
    answered = EvalRecord({}, DevQuestions(512, 1496)).to_dict()
    records = {"eval": StageRecord("eval", "f", 60.0, 0.0, answered)}
    clock = RunClock(plan, cpu, tmp_path, records, print)
    assert clock.work.evaluated == 512 and RunClock(plan, cpu, tmp_path, {}, print).work == plan.work
    from realm.pipeline.stage_table import estimate

    at_512 = {e.name: e for e in estimate(scale_preset(cpu, plan.scale, work.qa_train), clock.work)}
    took["qa"], took["eval"] = planned["qa"].seconds, at_512["eval"].seconds  # every stage as estimated
    now = sum(took.values())
    timing = time_stage(plan, cpu, "examples", took, ran, stepping, now, clock.work)
    assert timing.pace.other == pytest.approx(1.0)
    rest = sum(at_512[name].seconds for name in names[names.index("examples") + 1 :]) + c.fixed_seconds
    assert timing.allotted == pytest.approx(55 * 60 - now - rest)
    assert at_512["qa_ict"].seconds == planned["qa_ict"].seconds  # fine-tuning alone; the arms answer last
    assert at_512[ARMS_EVAL].seconds == pytest.approx(
        planned[ARMS_EVAL].seconds - len(arms) * (plan.work.evaluated - 512) * c.qa_question
    )
    assert names[-1] == ARMS_EVAL  # the run's last stage: a run behind answers fewer questions there
    assert dataclasses.replace(work, eval_questions=800).least_evaluated == 300


def test_the_evaluation_and_the_examples_score_the_sample_that_fits_what_is_left():
    from realm.pipeline.estimate import MIN_EVAL_QUESTIONS, MIN_SCORED_SENTENCES, SCORED_SENTENCES
    from realm.pipeline.pace import time_stage

    cpu = get_preset("cpu")
    work = Workload(blocks=16772, qa_train=9074, qa_dev=1496, qa_held_out=500, held_out_sentences=2_000)
    plan = dataclasses.replace(plan_pipeline(cpu, work, 90, spent_seconds=120.0), began=0.0)
    before_eval = [s.name for s in plan.stages][: [s.name for s in plan.stages].index("eval")]
    on_time = {name: e.seconds for name, e in ((s.name, s) for s in plan.stages) if name in before_eval}
    on_time["calibration"] = 120.0
    timing = time_stage(plan, cpu, "eval", on_time, {}, {}, now=sum(on_time.values()))
    assert timing.sample == pytest.approx(plan.work.evaluated, abs=5)  # on time: the plan's sample
    late = time_stage(plan, cpu, "eval", on_time, {}, {}, now=sum(on_time.values()) + 600)
    assert late.sample == MIN_EVAL_QUESTIONS  # ten minutes late: the least the plan states
    early = time_stage(plan, cpu, "eval", on_time, {}, {}, now=sum(on_time.values()) - 1200)
    assert early.sample == 1496  # twenty minutes early: all of them
    on_time["eval"] = next(s.seconds for s in plan.stages if s.name == "eval")
    examples = time_stage(plan, cpu, "examples", on_time, {}, {}, now=90 * 60 - 60 - 700 * cpu.costs.scored_sentence)
    assert examples.sample == 700 - EXAMPLE_POOL
    assert time_stage(plan, cpu, "examples", on_time, {}, {}, now=90 * 60).sample == MIN_SCORED_SENTENCES
    assert time_stage(plan, cpu, "examples", on_time, {}, {}, now=0.0).sample == SCORED_SENTENCES


# A GPU-like machine (issue 61's H200 at the cpu preset's shapes): 60-90 ms pretraining steps, 0.24 s QA steps
GPU_LIKE = StageCosts(
    source="a GPU-like profile",
    embed_blocks_per_second=1400.0,
    tag_blocks_per_second=400.0,
    null_pretrain_step=0.06,
    query_tower_pretrain_step=0.09,
    qa_step=0.24,
    read_step=0.08,  # 16 reader rows against QA's 40 and its query tower
    read_question=0.002,
    read_startup=5.0,
    qa_question=0.02,
    qa_systems_question=0.04,
    recall_question=0.002,
    scored_sentence=0.03,
    pretrain_startup=5.0,
    qa_startup=5.0,
)


def test_a_long_start_is_not_read_as_slow_steps():
    """The GPU run of issue 57: REALM's start (process, models, builder, first index) took longer than estimated
    while its steps kept their pace; pacing the whole stage as one cut QA to x0.00-x0.11 with 40% of the budget
    left. Starts and steps are paced apart, and each kind of step by its own, so QA keeps its steps."""
    from realm.pipeline.pace import time_stage

    gpu_like = dataclasses.replace(get_preset("cpu"), costs=GPU_LIKE)
    work = Workload(blocks=20_307, qa_train=8_574, qa_dev=1_496, qa_held_out=500)
    spent = 90.0
    plan = dataclasses.replace(plan_pipeline(gpu_like, work, 7, spent_seconds=spent), began=0.0)
    realm = {s.name: s for s in plan.stages}["realm"]
    realm_steps = realm.steps * realm.step_seconds
    took = {"calibration": spent, "realm": realm.fixed_seconds + 30.0 + realm_steps}  # a start 30 s longer
    took |= {s.name: s.seconds for s in plan.stages if s.name in ("realm_index", "qa_start")}
    timing = time_stage(plan, gpu_like, "qa", took, {"realm": realm}, {"realm": realm_steps}, sum(took.values()))
    assert timing.pace.steps == {"realm": pytest.approx(1.0)} and timing.pace.other > 1
    assert timing.scale is not None
    assert scale_preset(gpu_like, timing.scale, work.qa_train).qa.steps >= 0.8 * plan.preset.qa.steps


def test_the_plan_trains_first_and_samples_what_measures_it():
    """Synthetic machines: a GPU-like one (60 ms steps, long starts), a bf16 CPU and an AVX2 CPU (6 s steps, slow
    embedding). Training steps get TRAINING_SHARE of the budget wherever measuring everything does not fit beside
    it; evaluation and held-out scoring are then seeded samples, never below their least."""
    from realm.pipeline.estimate import MIN_EVAL_QUESTIONS, MIN_SCORED_SENTENCES
    from realm.pipeline.plan import TRAINING_SHARE

    cpu = get_preset("cpu")
    cpu = dataclasses.replace(cpu, ict=dataclasses.replace(cpu.ict, steps=0))  # as `realm pipeline` runs it
    work = Workload(blocks=20_307, qa_train=8_574, qa_dev=1_496, qa_held_out=500)
    avx2 = dataclasses.replace(cpu.fp32_costs, null_pretrain_step=1.76, query_tower_pretrain_step=5.55, qa_step=6.35)
    profiles = {"GPU": (GPU_LIKE, 6, 90.0), "bf16 CPU": (cpu.costs, 55, 360.0), "AVX2 CPU": (avx2, 120, 840.0)}
    for name, (costs, budget, spent) in profiles.items():
        plan = plan_pipeline(dataclasses.replace(cpu, costs=costs), work, budget, spent_seconds=spent)
        assert plan.estimated_minutes == pytest.approx(budget, rel=0.01), name
        least = (plan.work.evaluated, plan.work.scored_sentences) == (MIN_EVAL_QUESTIONS, MIN_SCORED_SENTENCES)
        # the share, up to whole steps; or, where the fixed costs leave less, the least measurement and the rest
        assert plan.training_minutes >= 0.99 * TRAINING_SHARE * budget or least, name
        assert least == (name == "GPU"), name  # six minutes: the start, tagging and the report take half
        assert MIN_EVAL_QUESTIONS <= plan.work.evaluated < work.qa_dev, name  # a sample, sized to what is left
        assert MIN_SCORED_SENTENCES <= plan.work.scored_sentences < 1000, name
        assert plan.preset.qa.steps >= qa_min_steps(cpu.qa) == 100, name
        assert f"EM over {plan.work.evaluated:,} of 1,496 dev questions" in plan.describe()
    roomy = plan_pipeline(cpu, work, 600, spent_seconds=360.0)  # measuring everything fits beside the training
    assert roomy.work.evaluated == work.qa_dev and roomy.work.scored_sentences == 1000
    assert roomy.training_minutes >= TRAINING_SHARE * 600


def test_a_budget_too_small_for_a_reader_is_refused_with_the_minutes_this_machine_needs():
    from realm.pipeline.plan import BudgetTooSmall

    cpu = get_preset("cpu")
    cpu = dataclasses.replace(cpu, ict=dataclasses.replace(cpu.ict, steps=0))  # as `realm pipeline` runs it
    avx2 = dataclasses.replace(cpu, costs=dataclasses.replace(cpu.fp32_costs, qa_step=6.35))  # issue 57's machine
    work = Workload(blocks=20_307, qa_train=8_574, qa_dev=1_496, qa_held_out=500)
    spent = 840.0  # the corpus, the off-the-shelf index (10 min there) and the calibration
    said = []
    for budget, why in ((40, r"it leaves QA fine-tuning \d+ steps, fewer than the 100"), (30, "alone take about")):
        with pytest.raises(BudgetTooSmall, match=why) as refused:
            plan_pipeline(avx2, work, budget, spent_seconds=spent)
        said.append(str(refused.value))
        assert str(refused.value).startswith(f"a budget of {budget} min is too small here: ")
    needed = {int(re.search(r"pass --budget-minutes (\d+) or more", line).group(1)) for line in said}
    assert len(needed) == 1 and needed.pop() == (minutes := 53)  # the same need, whatever budget was tried
    assert plan_pipeline(avx2, work, minutes, spent_seconds=spent).preset.qa.steps >= qa_min_steps(cpu.qa)  # enough
    with pytest.raises(BudgetTooSmall):
        plan_pipeline(avx2, work, minutes - 1, spent_seconds=spent)  # and no fewer
    assert plan_pipeline(avx2, Workload(blocks=20_307), 40, spent_seconds=spent)  # no QA: no reader to refuse for


def test_a_stage_s_steps_are_read_from_its_metrics_without_dev_scoring_or_a_cut(tmp_path):
    from realm.pipeline.stages import stepping_seconds

    rows = [{"step": s, "time": 100.0 + 2.0 * s} for s in range(5, 55, 5)]  # 2 s a step
    rows[-1] = {**rows[-1], "time": rows[-1]["time"] + 60.0, "dev_em": 10.0}  # the last row also scored dev
    rows[5:] = [{**r, "time": r["time"] + 3600.0} for r in rows[5:]]  # cut for an hour, then resumed
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert stepping_seconds(tmp_path) == pytest.approx(2.0 * 50)
    assert stepping_seconds(tmp_path / "none") is None


def test_pretraining_is_costed_by_the_kind_of_step():
    costs = StageCosts(null_pretrain_step=1.0, frozen_pretrain_step=10.0, pretrain_step=100.0)
    cfg = PretrainConfig(steps=10, null_warmup_steps=4, retriever_frozen_steps=6, refresh_every=2)
    # 4 null-document steps, 2 retrieval steps before the towers train (no index builder), then 4 beside it
    assert pretrain_step_seconds(cfg, costs) * 10 == pytest.approx(4 * 1 + 2 * 10 + 4 * 100)
    frozen_index = dataclasses.replace(cfg, refresh_every=0)
    assert pretrain_step_seconds(frozen_index, costs) * 10 == pytest.approx(4 * 1 + 6 * 10)
    null_only = dataclasses.replace(cfg, num_candidates=1)
    assert pretrain_step_seconds(null_only, costs) == pytest.approx(1.0)
    no_warmup = dataclasses.replace(cfg, null_warmup_steps=0, retriever_frozen_steps=0)
    assert pretrain_step_seconds(no_warmup, costs) == pytest.approx(100.0)
    query_tower = dataclasses.replace(costs, query_tower_pretrain_step=5.0)
    fixed = dataclasses.replace(cfg, doc_tower="fixed")  # no builder, whatever refresh_every says
    assert pretrain_step_seconds(fixed, query_tower) * 10 == pytest.approx(4 * 1 + 6 * 5)


def test_a_machine_without_bf16_matmul_plans_with_fp32_costs(tmp_path, monkeypatch):
    import torch

    cpu = get_preset("cpu")
    assert costed_for(cpu, torch.bfloat16) is cpu
    assert costed_for(cpu, torch.float32).costs == cpu.fp32_costs
    slow, fast = cpu.fp32_costs, cpu.costs
    assert slow.embed_blocks_per_second < fast.embed_blocks_per_second
    assert all(
        getattr(slow, f) >= getattr(fast, f)
        for f in (
            "ict_step",
            "pretrain_step",
            "frozen_pretrain_step",
            "null_pretrain_step",
            "qa_step",
            "qa_question",
            "qa_systems_question",
        )
    )
    assert all(c.qa_question < c.qa_systems_question <= 3 * c.qa_question for c in (slow, fast))
    work = Workload(blocks=12_000, qa_train=9_000, qa_dev=1_500)
    plans = {}
    for dtype in (torch.bfloat16, torch.float32):
        monkeypatch.setattr(Preset, "compute_dtype", lambda self, device, dtype=dtype: dtype)  # the one place
        options = PipelineOptions(run_dir=tmp_path / str(dtype), budget_minutes=120, progress=False)
        plans[dtype] = Pipeline(options, cpu).make_plan(work)
        assert json.loads((options.run_dir / "plan.json").read_text())["compute_dtype"] == str(dtype)[len("torch.") :]
    assert plans[torch.float32].scale < plans[torch.bfloat16].scale  # fewer steps fill the same two hours
    with pytest.raises(
        ValueError,
        match="embedding, tagging and evaluation alone .* cpu preset, costed with the preset's fp32 constants",
    ):
        plan_pipeline(costed_for(cpu, torch.float32), work, 15)  # 2 index builds at 45 blocks/s, evaluation: gone
    for plan in plans.values():
        assert plan.estimated_minutes == pytest.approx(120, rel=0.01)


def test_a_run_keeps_its_plan_when_stage_costs_are_measured_anew(tmp_path):
    cpu = get_preset("cpu")
    work = Workload(blocks=12_000, qa_train=9_000, qa_dev=1_500, ablations=True)
    options = PipelineOptions(run_dir=tmp_path, budget_minutes=150, progress=False)
    first = Pipeline(options, cpu).make_plan(work)

    def double_qa(costs: StageCosts) -> StageCosts:
        return dataclasses.replace(costs, qa_step=2 * costs.qa_step)

    slower = dataclasses.replace(cpu, costs=double_qa(cpu.costs), fp32_costs=double_qa(cpu.fp32_costs))
    again = Pipeline(options, slower).make_plan(work)  # a newer version's costs: finished stages stay valid
    assert again.scale == first.scale
    trainers = [(plan.preset.ict, plan.preset.pretrain, plan.preset.qa) for plan in (first, again)]
    assert trainers[0] == trainers[1]
    fresh = Pipeline(dataclasses.replace(options, run_dir=tmp_path / "other"), slower).make_plan(work)
    assert fresh.scale < first.scale  # a new run plans with the new costs
    rebudgeted = Pipeline(dataclasses.replace(options, budget_minutes=200), slower).make_plan(work)
    assert rebudgeted.scale > fresh.scale  # a new budget is a new plan


def test_stages_skip_resume_and_keep_stale_output(tmp_path):
    calls: list[tuple[str, bool]] = []
    said: list[str] = []

    def work(folder: Path, resume: bool) -> dict:
        calls.append((folder.name, resume))
        (folder / "out.txt").write_text("x")
        return {"value": 1}

    stages = Stages(tmp_path, said.append)
    first = stages.run("a", {"n": 1}, work)
    assert first.result == {"value": 1} and calls == [("a", False)]
    assert stages.run("a", {"n": 1}, work).fingerprint == first.fingerprint and len(calls) == 1  # skipped
    (tmp_path / STAGES / "a.json").rename(tmp_path / STAGES / "a.started.json")  # as if killed before finishing
    assert stages.run("a", {"n": 1}, work).resumed
    assert calls[-1] == ("a", True)
    stages.run("a", {"n": 2}, work)  # new settings: a fresh folder, the old one moved aside
    assert calls[-1] == ("a", False)
    stale = [p for p in tmp_path.iterdir() if p.name.startswith("a.stale-")]
    assert len(stale) == 1 and (stale[0] / "out.txt").exists() and (stale[0] / "stage.json").exists()
    assert json.loads((tmp_path / STAGES / "a.json").read_text())["fingerprint"] != first.fingerprint


def test_an_input_is_its_content_not_its_path_or_mtime(tmp_path):
    first = tmp_path / "a.jsonl"
    first.write_text('{"title": "T", "text": "x"}\n')
    copy = tmp_path / "moved" / "b.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(first.read_bytes())  # a re-copied file: new path, new mtime, same bytes
    assert describe_input(str(copy)) == describe_input(str(first))
    copy.write_text('{"title": "T", "text": "y"}\n')
    assert describe_input(str(copy)) != describe_input(str(first))
    with pytest.raises(FileNotFoundError, match="not a file"):
        describe_input(str(tmp_path / "missing.jsonl"))


TINY_PIPELINE = Preset(
    name="cpu",
    corpus=TINY_CORPUS,
    retriever=TINY_RETRIEVER,
    embed=dataclasses.replace(TINY_EMBED, shard_size=1000),
    index=IndexConfig(),
    ict=ICTConfig(steps=2, batch_size=4, lr=1e-3, warmup_steps=1, checkpoint_every=1, log_every=1),
    pretrain=PretrainConfig(
        steps=4,
        batch_size=4,
        lr=1e-3,
        head_lr_multiplier=10,
        warmup_steps=1,
        num_candidates=3,
        max_masks=5,
        doc_tower="fixed",  # as the cpu preset: the ablations add a run that trains it
        refresh_every=2,
        checkpoint_every=2,
        log_every=1,
        held_out_fraction=0.7,  # the test half of the held-out documents: tokyo
    ),
    qa=dataclasses.replace(TINY_QA, epochs=1),
    reading=ReadingConfig(epochs=1.0, batch_size=2, depth=4, lr=1e-3, checkpoint_every=2, log_every=1),
)
ARM_QA = ("qa_ict", "qa_uniform", "qa_trained", "qa_frozen")  # the arms' QA stages (cpu: a fixed document tower)
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("Where was Bach born?", "Eisenach"),
    ("When did Armstrong walk on the Moon?", "1969"),
    ("What is the capital of Japan?", "Tokyo"),
    ("Into which sea does the Nile flow?", "Mediterranean Sea"),
    ("Where did Bach die?", "Leipzig"),
]


@pytest.fixture
def tiny_run(tmp_path: Path) -> PipelineOptions:
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": q, "answer": [a]}) + "\n" for q, a in QUESTIONS))
    return PipelineOptions(
        inputs=(str(docs),),
        run_dir=tmp_path / "run",
        warm_start="random",
        qa_train=qa,
        qa_dev=qa,
        ablations=True,
        progress=False,
    )


def test_pipeline_runs_every_stage_then_skips_them(tiny_run):
    said: list[str] = []
    report = Pipeline(tiny_run, TINY_PIPELINE, said.append).run()
    run = tiny_run.run_dir
    # the runner ran the stages in the order of the table the planner estimated (pipeline/stage_table.py)
    records = [json.loads(p.read_text()) for p in (run / STAGES).glob("*.json") if not p.stem.endswith(".started")]
    ran = [r["name"] for r in sorted(records, key=lambda r: r["finished"]) if r["name"] not in BEFORE_PLAN]
    assert ran == [s["name"] for s in json.loads((run / "plan.json").read_text())["stages"]]
    for stage in (
        "corpus",
        "warm_start",
        "ict",
        "realm",
        "baseline_index",
        "ict_index",
        "realm_index",
        "qa_start",
        "qa",
        "eval",
        "qa_ict",
        "realm_uniform",
        "realm_uniform_index",
        "qa_uniform",
        "realm_trained",
        "realm_trained_index",
        "qa_trained",
        "realm_frozen",
        "realm_frozen_index",
        "qa_frozen",
        "examples",
        "measure_uniform",
        "measure_trained",
        "measure_frozen",
        ARMS_EVAL,
    ):
        assert (run / STAGES / f"{stage}.json").is_file(), stage
        config = json.loads((run / stage / "config.json").read_text())  # every stage saves the config it ran with
        assert config["config"] and config["version"], stage
    assert json.loads((run / "ict" / "config.json").read_text())["config"]["recipe"] == "ict"  # the trainer's own
    assert json.loads((run / "eval" / "config.json").read_text())["config"]["stage"] == "eval"
    text = report.read_text()
    for section in (
        "## Configuration",
        "## Stages",
        "## Training curves",
        "## Where QA fine-tuning started",
        "## Retrieval recall",
        "## Open-QA exact match",
        "## Ablations",
        "## Table 2 in miniature",
        "## Worked examples",
    ):
        assert section in text
    assert "In progress" not in text and "pending" not in text
    assert "Retrieval gain in masked-token accuracy, paired over the same masks" in text
    # Table 2's columns before fine-tuning: each arm's recall on every dev question and its masked-LM gain on the
    # sentences the main run scored, paired with what it is compared with
    scored_main = json.loads((run / STAGES / "examples.json").read_text())["result"]["scored_sentences"]
    for arm in ("uniform", "trained", "frozen"):
        measured = json.loads((run / STAGES / f"measure_{arm}.json").read_text())["result"]
        assert measured["scored_sentences"] == scored_main and "recall@5" in measured["zero_shot"], arm
        ranks = json.loads((run / f"measure_{arm}" / "zero_shot_ranks.json").read_text())["REALM"]
        assert len(ranks) == len(QUESTIONS), arm
    table2 = text.split("## Table 2 in miniature")[1].split("##")[0]
    masking = next(line for line in table2.splitlines() if line.startswith("| masking |"))
    assert masking.count("[") == 2 and "| None |" not in masking  # both paired differences, with their intervals
    retriever = next(line for line in table2.splitlines() if line.startswith("| retriever |"))
    assert retriever.count("[") == 1  # recall against REALM's start; no masked-LM model of the start's own
    assert (run / "plots" / "realm.png").is_file() and "data:image/png;base64," in (run / "report.html").read_text()
    results = (run / "results.md").read_text()  # numbers only: what docs/results.md records
    assert "## Ablations" in results and "## Open-QA exact match" in results and "## Training curves" not in results
    realm = json.loads((run / STAGES / "realm.json").read_text())["result"]
    assert realm["steps"] == TINY_PIPELINE.pretrain.steps
    for stage in ("realm", "realm_frozen"):  # the fixed document tower's index, and the stale one, never refresh
        assert json.loads((run / STAGES / f"{stage}.json").read_text())["result"]["index_version"] == 1, stage
    trained = json.loads((run / "realm_trained" / "config.json").read_text())["config"]["pretrain"]
    assert trained["doc_tower"] == "trained" and trained["refresh_every"] == 2
    # the ICT document tower is embedded once, by the REALM stage: every later index of it copies that
    reused = {
        stage: json.loads((run / STAGES / f"{stage}.json").read_text())["result"]["reused_from"]
        for stage in ("baseline_index", "ict_index", "realm_index", "realm_uniform_index", "realm_trained_index")
    }
    assert reused["ict_index"] and reused["realm_index"] and reused["realm_uniform_index"]
    assert (run / reused["ict_index"]).is_dir()  # relative to the run: a record holds no path of this machine
    assert reused["baseline_index"] is None and reused["realm_trained_index"] is None  # other document towers
    for stage in ("realm_uniform", "realm_frozen"):  # each trainer's first index: the ICT tower's
        assert read_meta(run / stage / "index", 1).reused_from, stage
    examples = json.loads((run / STAGES / "examples.json").read_text())["result"]
    shown = examples["examples"]
    gains = [e["p_with_top_block"] - e["p_without_retrieval"] for e in shown]
    assert len(shown) == min(3, examples["held_out_sentences"]) > 0  # the test half has 2 here
    assert gains == sorted(gains, reverse=True)  # where the top block helped most, first
    scored = json.loads((run / STAGES / "examples.json").read_text())["result"]["with_retrieval"]
    gain = f"| retrieval gain, paired | {scored['retrieval_gain']:+.2f} points"
    assert gain in (run / "realm" / "README.md").read_text()  # the REALM model's card holds what the report says
    evaluation = json.loads((run / STAGES / "eval.json").read_text())["result"]
    assert set(evaluation) == {
        "questions",
        "dense",
        "bm25",
        "hybrid",
        "paired",
        "zero_shot/off-the-shelf",
        "zero_shot/ICT",
        "zero_shot/REALM",
        "realm_vs_start",
        "answer_coverage",
        "question_set",
        "outcomes",
    }
    outcomes = evaluation["outcomes"]  # per question, compact: what `realm results --check` pairs two runs on
    assert len(outcomes["rows"]) == len(QUESTIONS) and set(outcomes) == {"rows", "dense", "bm25", "hybrid"}
    assert all(len(outcomes[s]) == len(QUESTIONS) and set(outcomes[s]) <= {"0", "1"} for s in ("dense", "hybrid"))
    assert evaluation["realm_vs_start"]["start"] == "ICT" and "recall@5" in evaluation["realm_vs_start"]
    ranks = json.loads((run / "eval" / "zero_shot_ranks.json").read_text())
    assert set(ranks) == {"off-the-shelf", "ICT", "REALM"} and all(len(r) == len(QUESTIONS) for r in ranks.values())
    assert 0 < evaluation["answer_coverage"]["percent"] <= 100
    headline = text.split("## ")[0]  # before the first section: the budget line, EM and what REALM added
    assert "**Open-QA exact match**" in headline and "REALM's retriever changed dev EM by" in headline
    assert "Zero-shot recall@5 on the dev questions, REALM's retriever minus its start (ICT)" in headline
    for kind in ("dense", "bm25", "hybrid"):
        assert (run / "eval" / f"predictions_{kind}.jsonl").read_text().count("\n") == len(QUESTIONS)
    assert set(evaluation["paired"]) == {"dense - bm25", "hybrid - bm25", "hybrid - dense"}
    qa_table = text.split("## Open-QA exact match")[1].split("##")[0]
    assert "95% interval" in qa_table and "not retrieved" in qa_table and "| hybrid - bm25 |" in qa_table
    ablations = text.split("## Ablations")[1].split("##")[0]
    rows = [line for line in ablations.splitlines() if line.startswith(("| retriever |", "| masking |", "| index |"))]
    assert len(rows) == 3 and all(" vs " in row and "| 38.20 |" in row for row in rows)
    rows += [line for line in ablations.splitlines() if line.startswith("| document tower |")]  # not the paper's
    assert len(rows) == 4 and "fixed (query tower trained) vs trained, index refreshed" in rows[-1]
    assert all(
        re.search(r"\| \[[+-]\d+\.\d, [+-]\d+\.\d\] \| \d+\.\d\d \|", row) for row in rows
    )  # interval, detectable
    for runs in ("realm_runs.png", "qa_runs.png"):  # the ablations' learning curves, a colour per run
        assert (run / "plots" / runs).is_file(), runs

    said.clear()
    Pipeline(tiny_run, TINY_PIPELINE, said.append).run()  # everything matches: nothing runs again
    assert not [line for line in said if line.endswith(": running") or line.endswith(": resuming")]

    start = json.loads((run / STAGES / "qa_start.json").read_text())["result"]  # the ablations measure REALM's own
    assert start["retriever"] == "REALM" and start["reader"] == "REALM" and start["fixed"]
    assert set(start["recall@5"]) == {"off-the-shelf", "ICT", "REALM"}
    assert json.loads((run / "qa" / "config.json").read_text())["config"]["reader"].endswith("realm/reader")

    said.clear()
    changed = dataclasses.replace(TINY_PIPELINE, ict=dataclasses.replace(TINY_PIPELINE.ict, steps=3))
    report = Pipeline(dataclasses.replace(tiny_run, ablations=False), changed, said.append).run()
    ran = {line.split()[1].rstrip(":") for line in said if line.endswith(": running")}
    assert {"ict", "realm", "qa_start", "read", "qa", "examples"} <= ran
    assert "corpus" not in ran and "warm_start" not in ran
    start = json.loads((run / STAGES / "qa_start.json").read_text())["result"]  # the best retriever, a tie the later
    recall = start["recall@5"]
    assert not start["fixed"] and start["reader"] == "warm start" and recall[start["retriever"]] == max(recall.values())
    assert [label for label in recall if recall[label] == max(recall.values())][-1] == start["retriever"]
    qa_config = json.loads((run / "qa" / "config.json").read_text())["config"]
    # without --ablations the reading stage trains the start's reader first, and QA fine-tunes from it
    assert qa_config["reader"].endswith("read/reader")
    assert json.loads((run / "read" / "config.json").read_text())["config"]["reader"].endswith("warm_start/reader")
    read = json.loads((run / STAGES / "read.json").read_text())["result"]
    assert read["read_questions"] == read["found"]["from_retrieval"] > 0 and read["steps_trained"]
    assert "How the reader was trained: the reading stage: " in report.read_text()
    assert f"Retriever: **{start['retriever']}** (the highest" in report.read_text()
    held_out = len(QUESTIONS) // 5  # held out of fine-tuning: the start and the query tower are chosen on them
    tower = json.loads((run / STAGES / "qa.json").read_text())["result"]["query_tower"]
    assert (
        start["questions"] == tower["questions"] == held_out
        and qa_config["train_questions"] == len(QUESTIONS) - held_out
    )
    kept = "the fine-tuned one" if tower["kept"] == "fine-tuned" else "the start's"
    assert f"Query tower after fine-tuning: **{kept}" in report.read_text()
    # the report ends with the lines that ask and serve this run: the fine-tuned model over its start's index
    serve = re.search(r"^realm serve --model (\S+) --index (\S+) --retriever (\w+)", report.read_text(), re.M)
    assert serve and Path(serve[1]) == run / "qa" / "best" and serve[3] == TINY_PIPELINE.qa.retriever
    assert (Path(serve[2]) / "CURRENT").is_file() and Path(serve[2]).parent.name.endswith("index")
    index = Path(serve[2])
    built_by = read_meta(index, current_version(index)).doc_tower_fingerprint  # the model's own document tower
    assert built_by == Retriever.load(serve[1], TINY_RETRIEVER).doc_fingerprint()


def test_without_ict_realm_starts_from_the_warm_start_and_its_index(tiny_run):
    """Also: a corpus in DPR's passage TSV (id, text, title; csv quoting) runs through the pipeline."""
    no_ict = dataclasses.replace(TINY_PIPELINE, ict=dataclasses.replace(TINY_PIPELINE.ict, steps=0))
    assert scale_preset(no_ict, 3.0, len(QUESTIONS)).ict.steps == 0  # a budget never adds an ICT stage
    tsv = tiny_run.run_dir.parent / "psgs.tsv"
    with tsv.open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerows([("id", "text", "title"), *((d["id"], d["text"], d["title"]) for d in DOCS)])
    options = dataclasses.replace(tiny_run, ablations=False, inputs=(str(tsv),))
    report = Pipeline(options, no_ict, lambda _: None).run()
    run = tiny_run.run_dir
    assert json.loads((run / STAGES / "corpus.json").read_text())["result"]["documents"] == len(DOCS)
    assert not (run / STAGES / "ict.json").exists() and not (run / STAGES / "ict_index.json").exists()
    realm = json.loads((run / "realm" / "config.json").read_text())["config"]
    assert Path(realm["retriever_model"]) == run / "warm_start" / "retriever"
    assert read_meta(run / "realm" / "index", 1).reused_from  # the off-the-shelf index's embeddings, not rebuilt
    start = json.loads((run / STAGES / "qa_start.json").read_text())["result"]
    assert set(start["recall@5"]) == {"off-the-shelf", "REALM"}
    text = report.read_text()
    assert "| ICT | none: REALM starts from the warm start |" in text and "pending" not in text


def test_a_stopped_run_has_a_report_of_what_finished(tiny_run, monkeypatch):
    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(Pipeline, "evaluate", killed)
    with pytest.raises(RuntimeError, match="killed"):
        Pipeline(dataclasses.replace(tiny_run, ablations=False), TINY_PIPELINE, lambda _: None).run()
    text = (tiny_run.run_dir / "report.md").read_text()  # written after each stage, the last after `qa`
    assert "In progress" in text and "## Training curves" in text and "## Open-QA exact match" not in text
    stages = text.split("## Stages")[1].split("##")[0]
    assert "| qa |" in stages and "| eval |" in stages and stages.count("pending") == 2  # eval, examples: not yet


def test_curves_are_smoothed_with_a_debiased_moving_average(tmp_path):
    from realm.pipeline.curves import ema, plot_curves

    assert ema([3.0] * 5) == pytest.approx([3.0] * 5)  # debiased: no pull toward 0 at the start
    noisy = [float(i % 2) for i in range(200)]  # 0, 1, 0, 1, ...
    smoothed = ema(noisy, span=20)
    assert max(smoothed[50:]) - min(smoothed[50:]) < 0.1 < max(noisy) - min(noisy)
    assert ema([0.0] * 20 + [1.0] * 100)[-1] == pytest.approx(1.0, abs=1e-3)  # it follows a change
    rows = [{"step": i, "loss": 5.0 - i / 50 + (i % 3), "dev_em": 10.0} for i in range(1, 60)]
    assert plot_curves("qa", rows, tmp_path / "qa.png").stat().st_size > 1000


def test_a_budget_is_planned_from_costs_measured_here_and_a_rerun_keeps_its_plan(tiny_run, monkeypatch):
    preset = dataclasses.replace(TINY_PIPELINE, costs=StageCosts(fixed_seconds=0.0))
    options = dataclasses.replace(tiny_run, ablations=False, budget_minutes=5)
    said: list[str] = []
    pipeline = Pipeline(options, preset, said.append)
    corpus, warm = pipeline.corpus(), pipeline.warm_start()
    warm_index = pipeline.index("baseline_index", tiny_run.run_dir / "warm_start" / "retriever", preset, [warm, corpus])
    calibration = pipeline.calibration(corpus, warm, warm_index)  # QA timed on the whole corpus's index
    assert calibration is not None
    measured = calibration["measured"]
    kinds = ("ict_step", "null_pretrain_step", "retrieval_pretrain_step", "qa_step", "qa_question")
    assert all(0 < measured[k] < 5 for k in kinds), measured  # seconds, from the trainers' own step logs
    assert measured["tag_blocks_per_second"] > 0 and measured["embed_blocks_per_second"] > 0
    work = Workload(
        corpus.result["blocks"], len(pipeline.qa_train), len(QUESTIONS), qa_held_out=len(pipeline.qa_held_out)
    )
    plan = pipeline.make_plan(work, calibration)
    stages = {s.name: s for s in plan.stages}
    assert stages["ict"].step_seconds == measured["ict_step"]
    assert stages["qa"].step_seconds == measured["qa_step"]
    assert stages["read"].step_seconds == measured["read_step"] > 0  # the reading stage, timed like the others
    read_fixed = measured["read_startup"] + work.qa_train * measured["read_question"]
    assert stages["read"].fixed_seconds == pytest.approx(read_fixed) and measured["read_question"] > 0
    assert measured["qa_systems_question"] > measured["qa_question"]  # the three systems, the first one's included
    # the sample of dev questions the plan sized, with three systems; zero-shot recall of each retriever on all
    evaluated, recall = plan.work.evaluated, 3 * work.qa_dev * measured["recall_question"]  # off-the-shelf, ICT, REALM
    assert stages["eval"].fixed_seconds == pytest.approx(evaluated * measured["qa_systems_question"] + recall)
    # the query tower alone is what the fixed document tower's retrieval steps run
    null = plan.preset.pretrain.null_warmup_steps
    expected = (
        null * measured["null_pretrain_step"]
        + (plan.preset.pretrain.steps - null) * measured["retrieval_pretrain_step"]
    )
    assert stages["realm"].steps * stages["realm"].step_seconds == pytest.approx(expected, rel=1e-6)
    tagging, embedding = (work.blocks / measured[k] for k in ("tag_blocks_per_second", "embed_blocks_per_second"))
    assert stages["realm"].fixed_seconds == pytest.approx(tagging + embedding + measured["pretrain_startup"])
    assert all(measured[k] >= 0 for k in ("ict_startup", "pretrain_startup", "qa_startup"))
    # what follows training: the held-out sentences the plan sized and the worked examples' pool, at the measured pace
    # (measured where the calibration's sample holds a few held-out sentences; the tiny corpus may not)
    per_sentence = measured.get("scored_sentence", preset.costs.scored_sentence)
    assert plan.preset.costs.scored_sentence == per_sentence > 0
    sentences = plan.work.held_out_sentences  # with a salient span, from the calibration sample's share
    assert sentences == round(measured["held_out_sentences_per_block"] * work.blocks)
    read = min(EXAMPLE_POOL, sentences) + min(plan.work.scored_sentences, sentences)
    assert stages["examples"].fixed_seconds == pytest.approx(read * per_sentence)
    assert "baseline_index" not in stages
    assert plan.preset.costs.fixed_seconds == pytest.approx(FINAL_SECONDS)
    spent = sum(
        json.loads((tiny_run.run_dir / STAGES / f"{s}.json").read_text())["seconds"]
        for s in ("corpus", "warm_start", "baseline_index", "calibration")
    )
    assert plan.spent_seconds == pytest.approx(spent)  # what came before the plan counts against the budget
    assert plan.estimated_minutes == pytest.approx(5, rel=0.02) and plan.scale > 1
    recorded = json.loads((options.run_dir / "plan.json").read_text())
    assert recorded["calibration"] == measured and recorded["costs"]["ict_step"] == measured["ict_step"]
    assert "measured on this machine" in recorded["costs"]["source"]

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after planning")

    monkeypatch.setattr(Pipeline, "ict", stop)
    said.clear()
    with pytest.raises(RuntimeError, match="stopped after planning"):
        Pipeline(options, preset, said.append).run()  # the same command again: nothing measured, the same plan
    assert "[pipeline] calibration: up to date" in " ".join(said)
    replanned = json.loads((options.run_dir / "plan.json").read_text())
    assert replanned["scale"] == plan.scale
    assert list(replanned["stage_timings"]) == ["ict"]  # the first training stage, timed as it began
    assert replanned["stage_timings"]["ict"]["scale"] == pytest.approx(plan.scale, rel=0.2)  # about as planned
    assert replanned["began"] == plan.began and replanned["ends_at"] == plan.began + 5 * 60  # the run's deadline
    assert any("measured on this machine" in line and "x" in line for line in said if "plan:" in line)


def test_a_pretraining_step_not_measured_keeps_its_ratio_to_the_measured_kind():
    from realm.pipeline.calibrate import measured_costs

    cpu = get_preset("cpu")  # a fixed document tower: calibration times the query tower's retrieval step
    measured = {"ict_step": 0.5, "retrieval_pretrain_step": 2 * cpu.costs.query_tower_pretrain_step, "blocks": 384}
    costs = measured_costs(cpu, measured, "bfloat16")
    assert costs.ict_step == 0.5 and costs.query_tower_pretrain_step == measured["retrieval_pretrain_step"]
    assert costs.pretrain_step == pytest.approx(2 * cpu.costs.pretrain_step)  # beside the builder: the same ratio
    assert costs.frozen_pretrain_step == pytest.approx(2 * cpu.costs.frozen_pretrain_step)
    assert costs.qa_step == cpu.costs.qa_step and costs.source == "the costs measured on this machine in bfloat16"
    trained = dataclasses.replace(cpu, pretrain=dataclasses.replace(cpu.pretrain, doc_tower="trained"))
    costs = measured_costs(trained, {"retrieval_pretrain_step": cpu.costs.frozen_pretrain_step / 2}, "float32")
    assert costs.frozen_pretrain_step == cpu.costs.frozen_pretrain_step / 2
    assert costs.pretrain_step == pytest.approx(cpu.costs.pretrain_step / 2)


def test_a_setting_a_stage_reads_reruns_that_stage(tiny_run):
    """Each recipe's settings (what it writes to config.json) are its stage's fingerprint: pretraining reads the
    index settings for its first index, so changing one re-runs it, and the stages before it are kept."""
    options = dataclasses.replace(tiny_run, qa_train=None, qa_dev=None, ablations=False)
    Pipeline(options, TINY_PIPELINE, lambda _: None).run()
    realm = json.loads((options.run_dir / "realm" / "config.json").read_text())["config"]
    assert realm["index"] == dataclasses.asdict(TINY_PIPELINE.index)  # what the recipe read, as it recorded it
    changed = dataclasses.replace(TINY_PIPELINE, index=dataclasses.replace(TINY_PIPELINE.index, hnsw_ef_search=7))
    said: list[str] = []
    Pipeline(options, changed, said.append).run()
    assert "[pipeline] realm: settings changed; the old output is kept in" in " ".join(said)
    assert not any(line.startswith(("[pipeline] corpus: running", "[pipeline] ict: running")) for line in said)
    realm = json.loads((options.run_dir / "realm" / "config.json").read_text())["config"]
    assert realm["index"]["hnsw_ef_search"] == 7


def test_every_ablated_run_trains_as_long_as_the_run_it_is_compared_with(tiny_run, monkeypatch):
    """The main REALM and QA stages are sized as they begin (by their deadline, in a budgeted run); the ablations
    replay the steps those trained (their steps.json). Sized on their own, the later stages of a run ahead of its
    plan trained longer (a 2-hour run gave them 5-30% more steps), which the paired comparison would have counted as
    the ablation's effect."""

    def sized(self, stage):  # the main stages get twice the plan's steps, as a run ahead of its plan would
        return scale_preset(self.base_preset, 2.0 if stage in ("realm", "qa") else 1.0, self.plan.work.qa_train), None

    monkeypatch.setattr(Pipeline, "sized", sized)
    Pipeline(tiny_run, TINY_PIPELINE, lambda _: None).run()

    def config(stage: str, section: str) -> dict:
        return json.loads((tiny_run.run_dir / stage / "config.json").read_text())["config"][section]

    realm = config("realm", "pretrain")
    assert realm["steps"] == 2 * TINY_PIPELINE.pretrain.steps
    keys = ("steps", "null_warmup_steps", "decay_from")
    for variant in ("uniform", "trained", "frozen"):
        assert {k: config(f"realm_{variant}", "pretrain")[k] for k in keys} == {k: realm[k] for k in keys}
    trained_qa = json.loads((tiny_run.run_dir / "qa" / "steps.json").read_text())["trained"]
    for variant in ("ict", "uniform", "trained", "frozen"):
        ablated = config(f"qa_{variant}", "qa")
        assert (ablated["steps"], ablated["lr_warmup"], ablated["decay_from"]) == tuple(trained_qa.values())


def test_the_report_names_the_reader_warmup_and_loss_of_pretraining():
    from realm.pipeline.report import pretraining_setting

    cpu = get_preset("cpu").pretrain
    assert (
        "first 1000 on the null document and a block (copy+context warm-up, 24 words each side of the sentence), "
        in pretraining_setting(cpu)
    )
    assert pretraining_setting(cpu).endswith("reader loss marginal+candidates")
    # a budget that cuts the warm-up short of what the held-out gain needed says so
    short = pretraining_setting(dataclasses.replace(cpu, null_warmup_steps=234, steps=304))
    assert (
        "first 234 on the null document and a block (copy+context warm-up, 24 words each side of the sentence) "
        "(fewer than the 1,000 the held-out gain needed" in short
    )
    # with the plan's figure: the budget that would give the warm-up its full length
    costed = pretraining_setting(dataclasses.replace(cpu, null_warmup_steps=234, steps=304), reading_minutes=208.2)
    assert "twelfth-part.md: a budget of about 209 min gives it them)" in costed
    assert "a budget of about" not in short and "a budget of about" not in pretraining_setting(cpu, 208.2)
    papers = dataclasses.replace(cpu, reader_warmup="null", reader_loss="marginal")
    assert "first 1000 on the null document alone" in pretraining_setting(papers)
    assert pretraining_setting(papers).endswith("reader loss marginal")


def test_a_budgeted_ablations_run_compares_the_questions_both_answered_and_its_last_stage_gives(tiny_run, monkeypatch):
    """With a budget the main evaluation answers dev in its seeded order until its clock runs out: 320 against the
    plan's sample of 300 once made the report's paired comparison refuse the arms, after the first ablated stage
    (`realm: error: ... do not hold the same questions in the same order`), and a rerun failed again one stage
    further. The arms answer the questions the main evaluation answered, in the run's last stage (arms_eval), all
    in lockstep until the deadline: the 120-minute run at 6e8ce53 fell ~19 min behind over its arms, and nothing
    after them could give. Late here, the arms answer their least (300, in chunks of 64: 320) of the 400 the main
    evaluation answered, the same ones, and the rows pair over those. Training steps fixed here (the budget sizes
    only the evaluations), so that the test is quick."""
    dev = tiny_run.run_dir.parent / "dev.jsonl"
    asked = [(f"{q[:-1]} ({i})?", a) for i in range(67) for q, a in QUESTIONS][:400]
    dev.write_text("".join(json.dumps({"question": q, "answer": [a]}) + "\n" for q, a in asked))
    options = dataclasses.replace(tiny_run, qa_dev=dev, budget_minutes=30)

    def sized(self, stage):  # the preset's steps, no deadline: the training stages as in an unbudgeted run
        self.timed(stage)
        return self.base_preset, None

    planned, timed = Pipeline.make_plan, Pipeline.timed

    def make_plan(self, work, calibration=None):  # a budget too tight for all of dev: the plan samples 300
        plan = planned(self, work, calibration)
        return dataclasses.replace(plan, work=dataclasses.replace(plan.work, eval_questions=300))

    def late(self, stage):  # the run fell behind by its last stage
        timing = timed(self, stage)
        return dataclasses.replace(timing, allotted=-60.0) if stage == ARMS_EVAL and timing else timing

    monkeypatch.setattr(Pipeline, "sized", sized)
    monkeypatch.setattr(Pipeline, "make_plan", make_plan)
    monkeypatch.setattr(Pipeline, "timed", late)
    report = Pipeline(options, TINY_PIPELINE, lambda _: None).run()
    run = options.run_dir
    main_answered = (run / "eval" / "predictions_dense.jsonl").read_text().splitlines()
    assert len(main_answered) == 400  # its clock allowed all of dev (30 minutes)
    answered = {arm: (run / ARMS_EVAL / f"{arm}.jsonl").read_text().splitlines() for arm in ARM_QA}
    questions = {arm: [json.loads(line)["question"] for line in lines] for arm, lines in answered.items()}
    assert all(q == questions["qa_ict"] for q in questions.values()) and len(questions["qa_ict"]) == 320
    assert set(questions["qa_ict"]) < {json.loads(line)["question"] for line in main_answered}
    order = [e.question for e in dev_order(load_qa(dev))]
    assert set(questions["qa_ict"]) == set(order[:320])  # the first of the evaluation's seeded order
    record = json.loads((run / STAGES / f"{ARMS_EVAL}.json").read_text())["result"]
    assert record["questions"]["evaluated"] == 320 and record["questions"]["offered"] == 400
    ablations = report.read_text().split("## Ablations")[1].split("##")[0]
    rows = [line for line in ablations.splitlines() if line.startswith(("| retriever |", "| masking |", "| index |"))]
    assert len(rows) == 3 and all(row.rstrip().endswith("| 320 |") for row in rows)  # paired over what both answered


def test_compare_on_shared_questions_pairs_each_question_once(tmp_path):
    from realm.eval.qa import compare_predictions

    def predictions(name: str, rows: list[tuple[str, bool]]) -> Path:
        path = tmp_path / name
        lines = (json.dumps({"question": q, "references": ["x"], "exact_match": ok}) + "\n" for q, ok in rows)
        path.write_text("".join(lines))
        return path

    # "q" asked twice (the same text and references): the first with the first, the second with the second
    a = predictions("a.jsonl", [("q", True), ("r", True), ("q", False), ("s", True)])
    b = predictions("b.jsonl", [("q", False), ("q", False), ("s", True), ("t", True)])
    paired = compare_predictions(a, b, shared=True)
    assert paired["questions"] == 3 and paired["exact_match_a"] == pytest.approx(100 * 2 / 3, abs=0.01)
    assert paired["exact_match_b"] == pytest.approx(100 / 3, abs=0.01)
    with pytest.raises(ValueError, match="same questions in the same order"):
        compare_predictions(a, b)
    with pytest.raises(ValueError, match="no question in common"):
        compare_predictions(a, predictions("c.jsonl", [("z", True)]), shared=True)


def test_a_recorded_plan_replays_from_its_measured_costs():
    """The README's record (the bare `realm pipeline` at a3b6601: its plan.json's workload, measured costs, budget
    and what the stages before the plan took), planned again by today's code: the same scale, stage estimates,
    sizing and scaled preset. A change of the plan's behaviour (or of the cpu preset) shows here first; where it is
    meant, re-run the record and replace this copy."""
    record = json.loads((Path(__file__).parent / "records" / "plan_default_a3b6601.json").read_text())
    preset = dataclasses.replace(get_preset(record["basis"]["preset"]), costs=StageCosts(**record["costs"]))
    ict = dataclasses.replace(preset.ict, steps=preset.ict.steps if preset.pipeline_ict else 0)  # as the CLI sets it
    preset = dataclasses.replace(preset, ict=ict)
    work = Workload(**record["basis"]["workload"])
    plan = plan_pipeline(preset, work, record["budget_minutes"], spent_seconds=record["spent_seconds"])
    assert plan.scale == pytest.approx(record["scale"], rel=1e-9)
    assert plan.estimated_minutes == pytest.approx(record["estimated_minutes"], rel=1e-9)
    assert [s.name for s in plan.stages] == [s["name"] for s in record["stages"]]
    for ours, recorded in zip(plan.stages, record["stages"]):
        figures = (ours.steps, ours.step_seconds, ours.fixed_seconds, ours.seconds)
        assert figures == pytest.approx(
            tuple(recorded[k] for k in ("steps", "step_seconds", "fixed_seconds", "seconds"))
        )
    assert dataclasses.asdict(plan.work) == record["work"] and plan.reading_minutes == record["reading_minutes"]
    assert plan.preset.to_dict() == record["preset"]


def test_the_evaluation_sample_is_seeded_spread_and_in_file_order():
    from realm.data.qa_examples import QAExample
    from realm.pipeline.work import dev_sample

    questions = [QAExample(f"question {i}?", (str(i),)) for i in range(1_496)]
    sample = dev_sample(questions, 500)
    assert len(sample) == 500 == len(set(sample))
    assert sample == dev_sample(questions, 500)  # the same on every run of the same file
    rows = [int(e.answers[0]) for e in sample]
    assert rows == sorted(rows) and rows[-1] > 1_300 and rows[0] < 100  # in file order, spread over the file
    assert dev_sample(questions, None) == questions == dev_sample(questions, 5_000)


def test_held_out_sentences_are_sampled_over_the_whole_split(tmp_path):
    import pyarrow as pa

    from realm.data.sentences import SentenceSet

    doc_ids = [f"doc {i // 4}" for i in range(4_000)]
    table = pa.table(
        {
            "doc_id": doc_ids,
            "text": [f"sentence {i}" for i in range(4_000)],
            "span_starts": [[0]] * 4_000,
            "span_ends": [[8]] * 4_000,
        }
    )
    path = tmp_path / "sentences.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    held_out = SentenceSet(path, 0.5, part="test")
    sample = held_out.sample(300)
    assert len(sample) == 300 and sample.texts == held_out.sample(300).texts
    order = [held_out.texts.index(t) for t in sample.texts]
    assert order == sorted(order) and order[-1] > 0.8 * len(held_out)  # not the first 300 in corpus order
    assert held_out.sample(10_000) is held_out
    shuffled = held_out.shuffled(0)  # what a clock-bound scoring reads: any first n of it spread over the split
    assert sorted(shuffled.texts) == sorted(held_out.texts) and shuffled.texts == held_out.shuffled(0).texts
    first = [held_out.texts.index(t) for t in shuffled.texts[:300]]
    assert max(first) > 0.8 * len(held_out) and min(first) < 0.2 * len(held_out)
    assert [held_out.doc_ids[i] for i in first] == shuffled.doc_ids[:300]  # the columns shuffled together


def test_the_report_leads_with_the_budget_and_warns_outside_its_band():
    from realm.pipeline.report import BUDGET_BAND, budget_line

    cpu = get_preset("cpu")
    plan = dataclasses.replace(plan_pipeline(cpu, Workload(blocks=16_772), 50), began=1_000.0)
    line, warning = budget_line(plan, 1_000.0 + 49.6 * 60, complete=True)
    assert line == "**Took 49.6 min of a 50-minute budget (0.99 of it).**" and warning is None
    line, warning = budget_line(plan, 1_000.0 + 59.0 * 60, complete=True)
    assert "(1.18 of it)" in line and warning is not None and "over its budget" in warning
    assert f"{BUDGET_BAND[0]:.2f}-{BUDGET_BAND[1]:.2f}" in warning
    assert "under its budget" in (budget_line(plan, 1_000.0 + 40 * 60, complete=True)[1] or "")
    line, warning = budget_line(plan, 1_000.0 + 10 * 60, complete=False)
    assert line.startswith("**10.0 min of a 50-minute budget so far**") and warning is None
    unbudgeted = plan_pipeline(cpu, Workload(blocks=16_772), None)
    assert budget_line(unbudgeted, 0.0, complete=True)[0].startswith("No budget")
