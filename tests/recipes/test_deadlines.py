"""Trainers that stop at a deadline, on a fake clock: a flat phase (REALM's reader warm-up) ends by time and leaves
the retrieval phase its share, the decaying phase is sized to the time left and re-sized once from its own steps,
the schedule stays one that fixed steps replay, and a killed run resumed keeps its deadline."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_pretrain import TINY_PRESET, _metrics

from realm.common.deadline import Deadline
from realm.training.schedule import LinearSchedule, TimedSchedule, TimedSteps


class FakeClock:
    """time.time() for a trainer: moves only when a step (or a test) moves it."""

    def __init__(self, now: float = 1_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def simulate(timed: TimedSteps, schedule: LinearSchedule, seconds, on_flat_end=None) -> tuple[int, float]:
    """A trainer's loop on the fake clock of `timed`'s deadline: step `n` takes `seconds(n)`. Returns (steps, end
    time)."""
    clock = timed.deadline.clock
    assert isinstance(clock, FakeClock)
    timer, step = TimedSchedule(timed, schedule, on_flat_end=on_flat_end), 0
    while step < schedule.total:
        timer.before_step(step)
        clock.now += seconds(step)
        step += 1
    return step, clock.now


def test_a_decaying_phase_one_and_a_half_times_slower_than_estimated_ends_on_time():
    """Sized at its start at the estimate (1 s a step: 300 steps), re-sized after its first timed steps at the pace
    they kept (1.5 s): it ends within a step of the deadline, not 1.5x late."""
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now + 300, clock), step_seconds=1.0)
    schedule = LinearSchedule(warmup=10, total=300)
    steps, end = simulate(timed, schedule, lambda step: 1.5)
    assert timed.deadline.at - 1.5 <= end <= timed.deadline.at
    assert steps == schedule.total == 200 and schedule.sizings == 2
    assert schedule.decay_from == 24  # flat while it is timed, then one linear decay to 0 at the last step
    assert schedule.factor("", 23) == 1.0 and schedule.factor("", 24) == 1.0 and schedule.factor("", 200) == 0.0
    rates = [schedule.factor("", step) for step in range(24, 201)]
    assert all(a > b for a, b in zip(rates, rates[1:]))  # strictly decaying
    assert rates[1] - rates[2] == pytest.approx(rates[-2] - rates[-1])  # linearly


def test_steps_that_slow_to_one_and_a_half_times_mid_warmup_end_on_time_with_the_retrieval_share_kept():
    """REALM's shape: 200 flat warm-up steps planned, then 50 retrieval steps (estimated 2 s each: 100 s reserved).
    The warm-up slows to 1.5x at step 50 and is cut by time; the retrieval phase still gets its 100 s."""
    clock = FakeClock()
    began = clock.now
    timed = TimedSteps(Deadline(began + 300, clock), step_seconds=2.0, reserved_steps=50)
    schedule = LinearSchedule(warmup=5, total=250, decay_from=200, starts={"towers": 200}, flat_until=200)
    ended = []

    def slower(step: int) -> float:
        return 2.0 if step >= schedule.flat_until else (1.0 if step < 50 else 1.5)

    steps, end = simulate(timed, schedule, slower, on_flat_end=ended.append)
    assert ended == [schedule.flat_until] and schedule.flat_until < 200  # cut by time (50 + 100 steps = 200 s)
    assert schedule.flat_until == 50 + 100
    assert steps - schedule.flat_until == 50  # the retrieval phase's share, whole
    assert timed.deadline.at - 2.0 <= end <= timed.deadline.at


def test_a_warmup_faster_than_planned_keeps_its_planned_length_and_the_retrieval_steps_get_the_time():
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now + 300, clock), step_seconds=2.0, reserved_steps=50)
    schedule = LinearSchedule(warmup=5, total=250, decay_from=200, flat_until=200)
    steps, end = simulate(timed, schedule, lambda step: 0.5 if step < schedule.flat_until else 2.0)
    assert schedule.flat_until == 200 and steps == 200 + 100  # 100 s of warm-up: 200 s left, 100 retrieval steps
    assert end == timed.deadline.at


def test_what_recurs_between_steps_is_counted_where_it_falls():
    """QA scores its held-out questions at each epoch's end (20 s each, every 50 steps): the steps leave room."""
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now + 500, clock), step_seconds=1.0, epoch_steps=50, scoring_seconds=20.0)
    schedule = LinearSchedule(warmup=100, total=1_000)
    timer, step = TimedSchedule(timed, schedule), 0
    while step < schedule.total:
        timer.before_step(step)
        clock.now += 1.0
        step += 1
        if step % 50 == 0 and step < schedule.total:
            clock.now += 20.0
            timer.between("scoring", 50, 20.0)
    assert timed.deadline.at - 21.0 <= clock.now <= timed.deadline.at
    assert schedule.total == 500 - 7 * 20  # the 7 scorings before the last step took their time from the steps


def test_checkpoints_are_timed_before_the_steps_are_re_sized():
    """QA's shape on 2 cores (2026-11-29, the bare `realm pipeline`): steps of 2.5 s, an 8 s checkpoint every 50
    steps. Re-sized after 24 steps, before any checkpoint was timed, the steps ignored 16 checkpoints and ended
    93 s late; timed until the first checkpoint, they end within a step and a checkpoint of the deadline."""
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now + 2_000, clock), step_seconds=2.7, epoch_steps=900, scoring_seconds=55.0)
    schedule = LinearSchedule(warmup=100, total=772)
    timer, step = TimedSchedule(timed, schedule, recurs={"checkpoint": 50}), 0
    while step < schedule.total:
        timer.before_step(step)
        clock.now += 2.5
        step += 1
        if step % 50 == 0:
            with timer.timing("checkpoint", 50):
                clock.now += 8.0
    assert schedule.decay_from == 50 and schedule.sizings == 2  # re-sized once the first checkpoint was timed
    assert timed.deadline.at - 2.5 - 8.0 <= clock.now <= timed.deadline.at + 8.0, clock.now - timed.deadline.at
    assert schedule.factor("", 60) == 0.61  # still warming up (ORQA's 100 steps): the rates are those of before


def test_a_run_past_its_deadline_still_trains_its_least_steps():
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now - 60, clock), step_seconds=1.0, least_steps=100)
    schedule = LinearSchedule(warmup=10, total=500)
    steps, _ = simulate(timed, schedule, lambda step: 1.0)
    assert steps == 100


def test_without_a_deadline_the_schedule_is_the_fixed_one():
    schedule = LinearSchedule(warmup=2, total=10, decay_from=4, flat_until=4)
    timer = TimedSchedule(None, schedule)
    for step in range(10):
        timer.before_step(step)
    assert (schedule.total, schedule.flat_until, schedule.decay_from, schedule.sizings) == (10, 4, 4, 0)


# -- the REALM trainer on the fake clock ------------------------------------------------------------------------
WARMUP_PRESET = dataclasses.replace(
    TINY_PRESET, pretrain=dataclasses.replace(TINY_PRESET.pretrain, steps=40, null_warmup_steps=30, checkpoint_every=5)
)


def timed_pretraining(monkeypatch, clock: FakeClock, seconds):
    """train_pretrain with each step moving `clock` by `seconds(step, retrieving)` (`step` counted from 0 across a
    resume; `retrieving`: a step past the reader warm-up)."""
    import realm.recipes.pretrain as recipe

    realm_step = recipe.realm_step

    def timed_step(trained, model, batch, optimizer, scheduler, *args):
        out = realm_step(trained, model, batch, optimizer, scheduler, *args)
        clock.now += seconds(scheduler.last_epoch - 1, batch.candidate_ids.shape[1] > 1)
        return out

    monkeypatch.setattr(recipe, "realm_step", timed_step)
    return recipe


def test_realm_pretraining_slowing_mid_warmup_ends_by_its_deadline_and_replays_with_fixed_steps(
    tmp_path, tiny_corpus, monkeypatch
):
    """Warm-up steps of 1 s slow to 1.5 s at step 10; the warm-up ends before the step that would take from the
    retrieval phase's 20 s (10 steps of 2 s), which it gets whole."""
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now + 50, clock), step_seconds=2.0, reserved_steps=10)
    recipe = timed_pretraining(
        monkeypatch, clock, lambda step, retrieving: 2.0 if retrieving else 1.0 + 0.5 * (step >= 10)
    )
    run = tmp_path / "timed"
    recipe.train_pretrain(tiny_corpus.folder, run, "random", "random", WARMUP_PRESET, progress=False, timed=timed)
    record = json.loads((run / "steps.json").read_text())
    trained = record["trained"]
    assert record["planned"]["null_warmup_steps"] == 30 and trained["null_warmup_steps"] == 23  # cut by time
    assert trained["steps"] - trained["null_warmup_steps"] == 10  # the retrieval phase's share, whole
    assert timed.deadline.at - 2.0 <= clock.now <= timed.deadline.at + 1e-9
    assert record["deadline"]["at"] == timed.deadline.at
    timed = _metrics(run)
    assert timed[-1]["step"] == trained["steps"] and timed[-1]["lr"] == 0.0

    # the same steps as fixed ones, no deadline: the same schedule, step for step
    monkeypatch.undo()
    fixed = dataclasses.replace(
        WARMUP_PRESET,
        pretrain=dataclasses.replace(WARMUP_PRESET.pretrain, **trained),  # steps, warm-up, decay_from
    )
    replay = tmp_path / "replay"
    recipe.train_pretrain(tiny_corpus.folder, replay, "random", "random", fixed, progress=False)
    assert [row["lr"] for row in _metrics(replay)] == pytest.approx([row["lr"] for row in timed])
    assert [row["loss"] for row in _metrics(replay)] == pytest.approx([row["loss"] for row in timed], rel=1e-4)


def test_a_killed_run_resumed_keeps_the_deadline_of_the_run_it_continues(tmp_path, tiny_corpus, monkeypatch):
    """Killed after the step-15 checkpoint (mid warm-up) and resumed 20 s later with the same deadline: the time
    lost comes out of the warm-up, the retrieval phase keeps its share, and the run still ends by the deadline."""
    clock = FakeClock()
    timed = TimedSteps(Deadline(clock.now + 60, clock), step_seconds=2.0, reserved_steps=10)
    recipe = timed_pretraining(monkeypatch, clock, lambda step, retrieving: 2.0 if retrieving else 1.0)
    save_checkpoint = recipe.save_checkpoint

    def kill_after_15(out, step, *args, **kwargs):
        save_checkpoint(out, step, *args, **kwargs)
        if step == 15:
            raise KeyboardInterrupt("kill -9 after the step-15 checkpoint")

    monkeypatch.setattr(recipe, "save_checkpoint", kill_after_15)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        recipe.train_pretrain(tiny_corpus.folder, run, "random", "random", WARMUP_PRESET, progress=False, timed=timed)
    monkeypatch.setattr(recipe, "save_checkpoint", save_checkpoint)
    clock.now += 20.0  # down for 20 s
    recipe.train_pretrain(
        tiny_corpus.folder, run, "random", "random", WARMUP_PRESET, resume=True, progress=False, timed=timed
    )
    trained = json.loads((run / "steps.json").read_text())["trained"]
    assert trained["null_warmup_steps"] == 20  # 15 s + 20 s down + 5 s: 20 s left, 10 retrieval steps
    assert trained["steps"] == 30 and clock.now == timed.deadline.at
    assert [row["step"] for row in _metrics(run)] == list(range(1, 31))


def test_a_schedule_settled_by_a_deadline_is_saved_with_the_scheduler():
    from realm.training.optim import bert_optimizer
    from realm.training.schedule import linear_schedule

    model = torch.nn.Linear(2, 2)
    scheduler = linear_schedule(bert_optimizer(model, 1e-3), warmup=2, total=100, flat_until=50)
    scheduler.schedule.total, scheduler.schedule.flat_until, scheduler.schedule.sizings = 70, 30, 2
    state = json.loads(json.dumps(scheduler.state_dict()))  # as trainer.json holds it
    fresh = linear_schedule(bert_optimizer(model, 1e-3), warmup=2, total=100, flat_until=50)
    fresh.load_state_dict(state)
    assert (fresh.schedule.total, fresh.schedule.flat_until) == (70, 30)
    assert fresh.lr_lambdas[0](69) == scheduler.lr_lambdas[0](69) > 0 == fresh.lr_lambdas[0](70)


@pytest.mark.parametrize(
    ("command", "section", "trained"),
    [
        ("pretrain", "pretrain", {"steps": 33, "null_warmup_steps": 23, "decay_from": 25}),
        ("qa", "qa", {"steps": 360, "lr_warmup": 100, "decay_from": 100}),
        ("ict", "ict", {"steps": 150, "decay_from": 24}),
    ],
)
def test_what_a_trainer_recorded_replays_from_the_command_line(command, section, trained):
    """steps.json's trained lengths are a trainer's flags: `realm train <command>` with them replays the run."""
    from realm.cli.main import build_parser
    from realm.cli.options import resolve_preset

    required = {"qa": ["--index", "i", "--train", "t", "--dev", "d"]}
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in trained.items()]
    args = build_parser().parse_args(
        ["train", command, *required.get(command, ["--corpus", "c"]), "--out", "o", *flags]
    )
    config = getattr(resolve_preset(args, section), section)
    assert {key: getattr(config, key) for key in trained} == trained
