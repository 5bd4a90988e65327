"""The gpu preset: the cpu preset's recipe with larger batches, the same examples seen; `realm pipeline` takes it
where CUDA is."""

from __future__ import annotations

import math

import pytest
import torch

from realm.cli.main import build_parser
from realm.config import default_preset, get_preset


def test_the_gpu_preset_is_the_cpu_recipe_with_larger_batches():
    cpu, gpu = get_preset("cpu"), get_preset("gpu")
    assert (gpu.corpus, gpu.retriever, gpu.index) == (cpu.corpus, cpu.retriever, cpu.index)  # the same model and blocks
    for name in ("pretrain", "ict", "qa"):
        a, b = getattr(cpu, name), getattr(gpu, name)
        assert b.batch_size > a.batch_size
        assert b.lr == pytest.approx(a.lr * math.sqrt(b.batch_size / a.batch_size), rel=0.01)  # Adam's square-root rule
    p, q = cpu.pretrain, gpu.pretrain
    assert q.steps * q.batch_size == p.steps * p.batch_size  # the same sentences, in fewer steps
    assert q.null_warmup_steps * q.batch_size == p.null_warmup_steps * p.batch_size
    assert q.retriever_lr == pytest.approx(p.retriever_lr * 2, rel=0.01) and q.num_candidates == 8
    assert (q.masking, q.reader_warmup, q.reader_loss, q.doc_tower) == (
        p.masking,
        p.reader_warmup,
        p.reader_loss,
        p.doc_tower,
    )
    assert (gpu.qa.epochs, gpu.qa.beam, gpu.qa.top_k) == (cpu.qa.epochs, cpu.qa.beam, cpu.qa.top_k)
    assert gpu.pipeline_budget_minutes == cpu.pipeline_budget_minutes  # a GPU user's minutes buy GPU training


def test_the_pipeline_takes_the_gpu_preset_where_cuda_is(monkeypatch):
    args = build_parser().parse_args(["pipeline"])
    assert args.preset is None  # chosen when it runs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_preset() == "gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_preset() == "cpu"
    assert build_parser().parse_args(["pipeline", "--preset", "paper"]).preset == "paper"
    assert build_parser().parse_args(["train", "ict", "--corpus", "c", "--out", "o"]).preset == "cpu"


def test_the_planners_thresholds_count_examples_so_the_gpu_preset_is_held_to_the_same_reading():
    from realm.pipeline.estimate import qa_min_steps, reader_warmup_steps

    cpu, gpu = get_preset("cpu"), get_preset("gpu")
    assert (reader_warmup_steps(cpu.pretrain), qa_min_steps(cpu.qa)) == (1000, 100)  # steps of 8 (docs/log)
    assert reader_warmup_steps(gpu.pretrain) * gpu.pretrain.batch_size == 1000 * 8
    assert qa_min_steps(gpu.qa) * gpu.qa.batch_size == 100 * 8
    assert gpu.pretrain.null_warmup_steps >= reader_warmup_steps(gpu.pretrain)  # the whole recipe reads as the cpu one
