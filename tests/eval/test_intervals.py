"""Bootstrap intervals: they cover the mean, narrow with more questions, and a paired difference cancels
what two systems share."""

from __future__ import annotations

import numpy as np
import pytest

from realm.eval.intervals import bootstrap_interval, paired_difference


def test_the_interval_matches_the_normal_approximation_of_a_proportion():
    rng = np.random.default_rng(1)
    correct = (rng.random(1500) < 0.33).astype(float) * 100  # exact match in percent, 1,500 questions
    low, high = bootstrap_interval(correct)
    mean, se = correct.mean(), correct.std() / np.sqrt(len(correct))
    assert low < mean < high
    assert low == pytest.approx(mean - 1.96 * se, abs=0.4) and high == pytest.approx(mean + 1.96 * se, abs=0.4)
    small = bootstrap_interval(correct[:150])
    assert small[1] - small[0] > 2.5 * (high - low)  # ten times fewer questions: about sqrt(10) times wider
    assert bootstrap_interval(correct) == (low, high)  # seeded: the same interval every time


def test_a_paired_difference_cancels_the_questions_both_systems_get_right():
    rng = np.random.default_rng(2)
    a = (rng.random(1000) < 0.4).astype(float)
    b = a.copy()
    flips = rng.choice(1000, 30, replace=False)
    b[flips[:25]] = 0.0  # b loses 25 questions a gets, gains at most 5
    b[flips[25:]] = 1.0
    difference, (low, high) = paired_difference(a, b)
    assert difference == pytest.approx(a.mean() - b.mean())
    assert 0 < low <= difference <= high  # a real difference: the interval excludes zero
    unpaired_width = 2 * 1.96 * np.sqrt(a.var() / 1000 + b.var() / 1000)
    assert high - low < unpaired_width / 3  # what both share cancels out
    assert paired_difference(a, a) == (0.0, (0.0, 0.0))
    with pytest.raises(ValueError, match="same questions"):
        paired_difference(a, b[:-1])
    with pytest.raises(ValueError, match="no scores"):
        bootstrap_interval([])
