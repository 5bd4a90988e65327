"""Where a QA fine-tuning step's time goes: the recipe's own step (batch, forward, backward, optimiser), timed by
phase, then one step under `torch.profiler` with the operators grouped (matmuls, attention softmax, the rest),
and the optimiser alone: clip + AdamW step over the model's parameters, fused (ours) vs per-op `foreach`.

    python benchmarks/profile_step.py --index data/load/index --qa squad-open-train
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from realm.common.device import autocast
from realm.config import get_preset
from realm.data.qa_examples import load_qa
from realm.index.mips import MipsIndex
from realm.models.orqa import QAModel
from realm.recipes.finetune_qa import make_qa_batch, qa_questions
from realm.training.optim import bert_optimizer, optimizer_step
from realm.training.schedule import linear_schedule

MATMULS = {"aten::mm", "aten::addmm", "aten::bmm"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True, help="an index built by MiniLM's document tower")
    parser.add_argument("--qa", required=True, help="QA training questions (JSONL)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps before the profiled one")
    args = parser.parse_args()
    preset = get_preset("cpu")
    cfg = preset.qa
    index = MipsIndex(args.index, device="cpu")
    store = index.corpus()
    model = QAModel.load("minilm", index.retriever_config(preset.retriever), cfg.span_hidden, cfg.max_span_width)
    model.train()
    examples = load_qa(args.qa)
    optimizer = bert_optimizer(model, cfg.lr)
    scheduler = linear_schedule(optimizer, 10, 1000)

    def step(i: int) -> dict[str, float]:
        marks = [time.perf_counter()]
        part = examples[i * cfg.batch_size : (i + 1) * cfg.batch_size]
        questions = qa_questions(part, model.retriever.tokenizer, preset.retriever.query_max_tokens, None)
        batch = make_qa_batch(model, questions, index, store, cfg.top_k, cfg.beam)
        marks.append(time.perf_counter())
        with autocast(torch.bfloat16, torch.device("cpu")):
            loss, _ = model(batch)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer_step(model, optimizer, scheduler)
        marks.append(time.perf_counter())
        return dict(zip(("data", "forward", "backward", "optimiser"), (b - a for a, b in zip(marks, marks[1:]))))

    for i in range(args.steps):
        phases = step(i)
        print(f"step {i}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in phases.items()))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(args.steps)
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        group = "matmuls" if event.key in MATMULS else "softmax" if "softmax" in event.key else "the rest"
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total / 1000
    total = sum(groups.values())
    print(
        f"profiled step: {total:.0f} ms of operator self time; "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in groups.items())
    )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    for name, options in (
        ("fused (bert_optimizer)", {"fused": True}),
        ("foreach (torch's default)", {"foreach": True}),
    ):
        adam = torch.optim.AdamW(params, lr=1e-5, eps=1e-6, **options)
        times = []
        for _ in range(6):
            started = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            adam.step()
            times.append(time.perf_counter() - started)
        count = sum(p.numel() for p in params) / 1e6
        print(f"optimiser alone, {name}: {min(times[2:]) * 1000:.0f} ms a step for {count:.0f}M parameters")


if __name__ == "__main__":
    main()
