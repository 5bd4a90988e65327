"""`realm pipeline --seeds N`: the recipe run once per seed, each trainer seeded with it, and each figure reported
with training's spread (per-seed values, mean, t-interval, the interval for one more run)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from conftest import DOCS
from test_pipeline import TINY_PIPELINE

from realm.eval.intervals import seed_interval, t_quantile
from realm.pipeline.plan import PipelineOptions
from realm.pipeline.run import Pipeline
from realm.pipeline.seeds import read_seeds, seed_dir, seeded, summarise_seeds, write_seeds


def test_the_seed_spread_is_a_t_interval_over_runs():
    mean, sd, (low, high), (next_low, next_high) = seed_interval([50.0, 52.0, 54.0])
    assert (mean, sd) == (52.0, 2.0)
    half = 4.303 * 2.0 / math.sqrt(3)  # t(0.975, 2 df)
    assert (low, high) == pytest.approx((52.0 - half, 52.0 + half))
    assert (next_low, next_high) == pytest.approx((52.0 - half * 2, 52.0 + half * 2))  # sqrt(1 + 1/3) = 2/sqrt(3)
    assert t_quantile(22) == 2.086 and t_quantile(500) == 1.96  # between the table's rows: the wider one
    with pytest.raises(ValueError, match="at least two"):
        seed_interval([50.0])


def test_each_seed_is_a_run_of_its_own_and_the_figures_are_summarised_over_them(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    options = PipelineOptions(inputs=(str(docs),), run_dir=tmp_path / "run", warm_start="random", progress=False)
    runs = []
    for seed in (0, 1):
        run = seed_dir(options.run_dir, seed)
        Pipeline(dataclasses.replace(options, run_dir=run), seeded(TINY_PIPELINE, seed), lambda _: None).run()
        runs.append(run)
    for seed, run in enumerate(runs):  # every trainer seeded alike
        config = json.loads((run / "realm" / "config.json").read_text())["config"]
        assert config["pretrain"]["seed"] == seed
    losses = [json.loads((run / "stages" / "realm.json").read_text())["result"]["loss"] for run in runs]
    assert losses[0] != losses[1]  # other masks, order and dropout
    summary = summarise_seeds(runs)
    gain = summary["figures"]["held-out masked-LM gain"]
    assert len(gain["values"]) == 2 and gain["mean"] == pytest.approx(sum(gain["values"]) / 2, abs=1e-4)
    low, high = gain["mean_95ci"]
    assert low <= gain["mean"] <= high and gain["next_run_95ci"][0] <= low
    out = write_seeds(options.run_dir, summary, "realm pipeline --seeds 2")
    assert read_seeds(options.run_dir)["command"] == "realm pipeline --seeds 2"
    text = out.read_text()
    assert "| held-out masked-LM gain |" in text and "[seed-0](seed-0/results.md)" in text
