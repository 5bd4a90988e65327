"""Evaluations that end by the clock: dev questions answered (every system the same ones) and held-out sentences
scored in a seeded order until the stage's allotment ends, on a fake clock."""

from __future__ import annotations

from realm.common.deadline import Deadline, TimeLimit
from realm.data.qa_examples import QAExample
from realm.eval.answerer import Answer
from realm.eval.qa import AnsweredQuestion


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_time_limit_takes_what_the_measured_pace_fits():
    clock = FakeClock()
    limit = TimeLimit(Deadline(1_100.0, clock), least=10)
    assert limit.fits(0, 64) == 64 and limit.fits(9, 64) == 64  # the least, whatever the clock
    clock.now += 50.0  # 50 items in 50 s: 1 s an item, 50 s left
    assert limit.fits(50, 64) == 50
    clock.now += 49.5
    assert limit.fits(99, 64) == 0  # half a second left: not one more
    late = TimeLimit(Deadline(900.0, clock), least=3)  # a run already late scores its least, then stops
    assert late.fits(0, 2) == 2 and late.fits(2, 2) == 2
    clock.now += 1.0
    assert late.fits(4, 2) == 0


def _answerers_on(clock: FakeClock, seconds: dict[str, float], slows_after: int, monkeypatch) -> dict:
    """Fake systems whose answering advances `clock` by `seconds[kind]` a question, 1.5x slower after the
    `slows_after`th question each has answered."""
    from realm.pipeline import work

    answered = dict.fromkeys(seconds, 0)

    def answer_questions(kind, examples, depth):
        for _ in examples:
            clock.now += seconds[kind] * (1.5 if answered[kind] >= slows_after else 1.0)
            answered[kind] += 1
        return [AnsweredQuestion(e, Answer(e.answers[0], 1.0, []), 0, "exact_match") for e in examples]

    monkeypatch.setattr(work, "answer_questions", answer_questions)
    return {kind: kind for kind in seconds}


def test_the_evaluation_answers_until_its_allotment_ends_every_system_the_same_questions(monkeypatch):
    from realm.pipeline.work import EVAL_CHUNK, answer_until

    clock = FakeClock()
    questions = [QAExample(f"question {i}?", (str(i),)) for i in range(5_000)]
    per_question = {"dense": 0.11, "bm25": 0.10, "hybrid": 0.02}  # NQ's measured seconds, on 2 cores
    answerers = _answerers_on(clock, per_question, slows_after=600, monkeypatch=monkeypatch)
    began = clock.now
    answered, seconds = answer_until(answerers, questions, TimeLimit(Deadline(began + 600.0, clock), least=300))
    took = clock.now - began
    assert 600.0 - 1.5 * sum(per_question.values()) <= took <= 600.0  # slowed mid-way, still on time
    first = [a.example for a in answered["dense"]]
    assert first == questions[: len(first)] and 1_500 < len(first) < 3_000
    assert all([a.example for a in rows] == first for rows in answered.values())  # paired: the same questions
    assert set(seconds) == set(per_question)  # each system's own seconds (time.monotonic)
    # all of them where they fit; the least where the run is already late
    clock.now, few = 0.0, questions[:500]
    assert len(answer_until(answerers, few, TimeLimit(Deadline(1e9, clock), least=300))[0]["bm25"]) == 500
    late, _ = answer_until(answerers, questions, TimeLimit(Deadline(clock.now - 1.0, clock), least=300))
    assert len(late["hybrid"]) == 300 + (-300 % EVAL_CHUNK)  # whole chunks to the least, then no more
    assert answer_until(answerers, few, None)[0]["dense"][-1].example is few[-1]


def test_the_dev_sample_is_the_first_of_the_seeded_order_in_file_order():
    from realm.pipeline.work import dev_order, dev_sample

    questions = [QAExample(f"question {i}?", (str(i),)) for i in range(1_496)]
    order = dev_order(questions)
    assert order == dev_order(questions) and sorted(order, key=questions.index) == questions
    assert set(map(id, dev_sample(questions, 400))) == set(map(id, order[:400]))  # what the clock lets it answer
