"""Steps/s, tokens/s and model FLOP utilisation of each trainer's step, and re-embedding blocks/s.

For ICT, REALM (retrieval from an index, 1 null + K-1 candidates) and open-QA fine-tuning, a step is timed
as the recipe runs it: batch construction (tokenising, masking, MIPS search, answer labelling) with the
recipe's own functions, then forward, backward and the optimiser step under bf16 autocast. FLOPs are
counted by `torch.utils.flop_counter.FlopCounterMode` over one forward + backward (matmuls and attention;
the optimiser and elementwise work are not counted), so MFU = counted FLOPs / step time / peak, where the
peak is a bf16 matmul measured in the same run (the device's practical limit). Re-embedding uses the
index builder's own path (`build_index`: embed every block of the corpus, publish a version).

    # paper shapes (BERT-base, 288-wordpiece blocks, 96-wordpiece queries), random weights, on a GPU
    python benchmarks/train_throughput.py --corpus data/paper_corpus --preset paper --model random \\
        --qa squad-open-train --ict-batch 256 --realm-batch 32 --qa-batch 16
    # cpu-preset shapes (MiniLM), real weights, larger batches
    python benchmarks/train_throughput.py --corpus data/dev/corpus --preset cpu --model minilm \\
        --qa squad-open-train --ict-batch 512 --realm-batch 64 --candidates 8 --qa-batch 32

Side by side with the code before a change, and with the naive reference, in one invocation:

    python benchmarks/train_throughput.py --corpus data/bench/corpus --preset cpu --model minilm \
        --qa squad-open-train --base 9269e25,cf41f60 --rounds 2

runs the variants as child processes, alternating round by round so machine noise hits all alike: each `base`
revision (its own copy of this script and package, from a temporary git worktree), `this` (this tree) and `naive`
(this tree with Hugging Face's own BertModel forward over padded batches, in fp32: `--naive`). Each trainer's step
time is the lower of its per-round medians; a ratio column per base revision.

Sentences are split without the salient-span tagger (spaCy may be absent), so REALM steps mask random spans
(`random-span`) instead of salient ones; that changes which tokens are masked, not the step's cost.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode
from worktree import ROOT, base_worktree, revision_name

from realm.common.device import autocast, default_device
from realm.config import get_preset
from realm.data.blocks import BlockStore, sentence_starts
from realm.data.qa_examples import AnswerBlocks, load_qa
from realm.data.sentences import split_sentences
from realm.index.build import build_index
from realm.index.embed import BlockEmbedder
from realm.index.mips import MipsIndex
from realm.models.bert import random_bert
from realm.models.ict import ICTModel
from realm.models.mlm_reader import Reader
from realm.models.orqa import QAModel
from realm.models.realm import RealmModel
from realm.models.retriever import Retriever
from realm.models.span_reader import SpanReader
from realm.recipes.finetune_qa import make_qa_batch, qa_questions
from realm.recipes.ict import make_ict_batch
from realm.recipes.pretrain import make_pretrain_batch, masked_queries
from realm.training.data import PREFETCH_ENV, Prefetched, example_rng, prefetch_depth
from realm.training.optim import bert_optimizer, optimizer_step
from realm.training.schedule import linear_schedule


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device) -> float:
    """FLOP/s of a square bf16 matmul (8192 on a GPU, 2048 on a CPU), best of 5: the practical limit."""
    n, repeats = (8192, 20) if device.type == "cuda" else (2048, 5)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):  # the best of 5 timings: on a shared machine, the slower ones measure the neighbours
        synchronize(device)
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 * repeats / best


def use_hf_forward() -> None:
    """The naive reference: every tower and reader runs BertModel.forward over the padded batch."""
    from realm.models import mlm_reader, retriever, span_reader

    def hf_forward(bert, input_ids, attention_mask, token_type_ids):
        return bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    for module in (retriever, mlm_reader, span_reader):
        module.encode = hf_forward  # type: ignore[attr-defined]


def side_by_side(args: argparse.Namespace, passed: list[str]) -> None:
    """Run each base revision / this / naive as child processes, `args.rounds` rounds, and print the step times with
    their ratios to every base."""
    own = [a for a in passed if a not in ("--naive",)]
    revisions = args.base.split(",")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        variants = {
            f"base {revision_name(revision)}": (tree / "benchmarks" / "train_throughput.py", tree / "src", [])
            for revision, tree in ((r, stack.enter_context(base_worktree(r))) for r in revisions)
        }
        depths = {"this": None} if args.prefetch is None else {f"this, {d} ahead": d for d in args.prefetch.split(",")}
        for name in depths:
            variants[name] = (ROOT / "benchmarks" / "train_throughput.py", ROOT / "src", [])
        if not args.without_naive:
            variants["naive (fp32, HF forward, padded)"] = (
                ROOT / "benchmarks" / "train_throughput.py",
                ROOT / "src",
                ["--naive"],
            )
        rows: dict[str, dict[str, list[dict]]] = {name: {} for name in variants}
        for round_ in range(args.rounds):
            for name, (script, src, extra) in variants.items():
                out = Path(tmp) / f"{round_}-{len(rows[name])}-{abs(hash(name))}.json"
                # the variant's package first; what the environment adds (MiniLM, wheels) after it
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])),
                }
                if depths.get(name) is not None:
                    env[PREFETCH_ENV] = str(depths[name])
                command = [sys.executable, str(script), *own, *extra, "--json", str(out)]
                subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
                for row in json.loads(out.read_text())["results"]:
                    rows[name].setdefault(row["trainer"], []).append(row)
                print(f"round {round_ + 1}/{args.rounds}: {name} done", flush=True)
    bases = [f"base {revision_name(revision)}" for revision in revisions]
    ratios = " | ".join(f"vs {revision_name(revision)}" for revision in revisions)
    print(f"| trainer | variant | step s (data + compute) | host share | steps/s | tokens/s | MFU | {ratios} |")
    print("|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(revisions))
    for trainer in rows[bases[0]]:
        for name in variants:
            if trainer not in rows[name]:
                continue
            if trainer == "embed":
                best = max(rows[name][trainer], key=lambda r: r["blocks_per_s"])
                vs = " | ".join(
                    f"{best['blocks_per_s'] / max(r['blocks_per_s'] for r in rows[b][trainer]):.2f}x" for b in bases
                )
                print(f"| embed | {name} | {best['blocks_per_s']} blocks/s | | | | {best['mfu']:.0%} | {vs} |")
                continue
            best = min(rows[name][trainer], key=lambda r: r["step_s"])
            vs = " | ".join(f"{min(r['step_s'] for r in rows[b][trainer]) / best['step_s']:.2f}x" for b in bases)
            share = best["data_s"] / best["step_s"]  # a base revision's rows may predate `host_share`
            print(
                f"| {trainer} | {name} | {best['step_s']:.3f} ({best['data_s']:.3f} + {best['compute_s']:.3f}) | "
                f"{share:.0%} | {best['steps_per_s']:.3f} | {best['tokens_per_s']} | {best['mfu']:.0%} | {vs} |"
            )


def tokens(*inputs: dict[str, torch.Tensor]) -> int:
    """Non-padding tokens over every sequence the model reads in a step."""
    return int(sum(int(x["attention_mask"].sum()) for x in inputs))


def measure(
    name: str,
    model: torch.nn.Module,
    prepare: Callable[[int], object],
    finish: Callable[[object], tuple[object, int]],
    loss_of: Callable[[object], torch.Tensor],
    lr: float,
    device: torch.device,
    dtype: torch.dtype,
    warmup: int,
    steps: int,
    peak: float,
    extra: dict,
) -> dict:
    """Time `steps` full steps after `warmup` untimed ones: the batch (`prepare(step)`, its model-independent half,
    built ahead in a thread as the recipes do, `prefetch_depth`; `finish`, the half built in the step) and
    forward/backward/optimiser. `data_s` is the step's wait for its batch and the half built in it."""
    optimizer = bert_optimizer(model, lr)
    scheduler = linear_schedule(optimizer, 10, 10_000)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def train(batch) -> None:
        with autocast(dtype, device):
            loss = loss_of(batch)
        loss.backward()
        optimizer_step(model, optimizer, scheduler)

    data_s, compute_s, token_counts = [], [], []
    with Prefetched(map(prepare, itertools.count()), prefetch_depth(device)) as prepared:
        for step in range(warmup + steps):
            synchronize(device)
            started = time.perf_counter()
            batch, n_tokens = finish(next(prepared))
            synchronize(device)
            built = time.perf_counter()
            train(batch)
            synchronize(device)
            if step >= warmup:
                data_s.append(built - started)
                compute_s.append(time.perf_counter() - built)
                token_counts.append(n_tokens)
        batch, _ = finish(next(prepared))
    with FlopCounterMode(display=False) as counter:
        with autocast(dtype, device):
            loss = loss_of(batch)
        loss.backward()
    optimizer.zero_grad(set_to_none=True)
    step_s = statistics.median(d + c for d, c in zip(data_s, compute_s))
    flops = counter.get_total_flops()
    result = {
        "trainer": name,
        **extra,
        "prefetch": prefetch_depth(device),
        "steps_per_s": round(1 / step_s, 3),
        "step_s": round(step_s, 4),
        "data_s": round(statistics.median(data_s), 4),
        "compute_s": round(statistics.median(compute_s), 4),
        "tokens_per_s": round(statistics.mean(token_counts) / step_s),
        "tflop_per_step": round(flops / 1e12, 3),
        "tflop_per_s": round(flops / step_s / 1e12, 2),
        "mfu": round(flops / step_s / peak, 4),
        "mfu_compute_only": round(flops / statistics.median(compute_s) / peak, 4),
        "host_share": round(statistics.median(d / (d + c) for d, c in zip(data_s, compute_s)), 3),
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="corpus folder (its block budget sets the block length)")
    parser.add_argument("--qa", help="QA training questions (JSONL) for the QA step; omitted: no QA row")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--model", default="minilm", help="minilm (real weights) or random (the preset's BERT shape)")
    parser.add_argument("--trainers", default="embed,ict,realm,qa")
    parser.add_argument("--ict-batch", type=int)
    parser.add_argument("--realm-batch", type=int)
    parser.add_argument("--candidates", type=int, help="REALM candidates incl. the null document (default: preset)")
    parser.add_argument("--qa-batch", type=int)
    parser.add_argument("--embed-batch", type=int, help="blocks per embedding batch (default: preset)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--naive", action="store_true", help="the naive reference: fp32, HF forward, padded")
    parser.add_argument("--base", help="also measure these revisions (comma-separated), side by side (with --rounds)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--prefetch", help="with --base: this tree at each of these depths (e.g. 0,1,2; $REALM_PREFETCH)"
    )
    parser.add_argument("--without-naive", action="store_true", help="with --base: leave out the naive reference")
    args = parser.parse_args()
    if args.base:
        passed = sys.argv[1:]
        passed = [a for a in passed if a != "--without-naive"]
        for flag in ("--base", "--rounds", "--json", "--prefetch"):  # the children's own options
            if flag in passed:
                at = passed.index(flag)
                del passed[at : at + 2]
        return side_by_side(args, passed)
    if args.naive:
        use_hf_forward()

    preset = get_preset(args.preset)
    if args.naive:
        preset = dataclasses.replace(preset, embed=dataclasses.replace(preset.embed, compute_dtype="fp32"))
    embed_config = dataclasses.replace(preset.embed, **({"batch_size": args.embed_batch} if args.embed_batch else {}))
    device = default_device()
    dtype = preset.compute_dtype(device)
    torch.manual_seed(0)
    store = BlockStore(args.corpus)
    peak = matmul_peak(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    header = {
        "device": name,
        "torch": torch.__version__,
        "preset": preset.name,
        "model": args.model,
        "compute_dtype": str(dtype),
        "bf16_matmul_tflops": round(peak / 1e12, 1),
        "blocks": len(store),
        "max_block_tokens": store.config.max_block_tokens,
    }
    print(json.dumps(header), flush=True)
    results: list[dict] = []
    trainers = args.trainers.split(",")

    retriever = Retriever.load(args.model, preset.retriever).to(device)
    tokenizer = retriever.tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        # Re-embedding: the index builder's own path (embed every block, publish a version), timed; the REALM and
        # QA steps then search the index it published.
        embedder = BlockEmbedder(retriever.doc_tower, tokenizer, store.config, embed_config, device)
        titles, bodies = store.slice(0, min(512, len(store)))
        embedder.embed(titles[: embed_config.batch_size * 2], bodies[: embed_config.batch_size * 2])  # warm-up
        with FlopCounterMode(display=False) as counter:
            embedder.embed(titles, bodies)
        flops_per_block = counter.get_total_flops() / len(titles)
        synchronize(device)
        started = time.perf_counter()
        build_index(
            store,
            embedder,
            retriever.doc_fingerprint(),
            Path(tmp) / "index",
            embed_config,
            preset.index,
            preset.retriever,
            progress=False,
        )
        synchronize(device)
        seconds = time.perf_counter() - started
        if "embed" in trainers:
            row = {
                "trainer": "embed",
                "blocks": len(store),
                "batch": embed_config.batch_size,
                "blocks_per_s": round(len(store) / seconds, 1),
                "tflop_per_s": round(flops_per_block * len(store) / seconds / 1e12, 2),
                "mfu": round(flops_per_block * len(store) / seconds / peak, 4),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
        index = MipsIndex(Path(tmp) / "index", device=device.type)
        del embedder

        if "ict" in trainers:
            cfg = dataclasses.replace(preset.ict, **({"batch_size": args.ict_batch} if args.ict_batch else {}))
            titles, bodies = store.slice(0, len(store))
            usable = [i for i, body in enumerate(bodies) if len(sentence_starts(body)) >= 2]
            model = ICTModel(retriever).train()

            ict_tokenizer = copy.deepcopy(tokenizer)  # the building thread's own

            def prepare_ict(step: int):
                rows = [usable[(step * cfg.batch_size + j) % len(usable)] for j in range(cfg.batch_size)]
                return make_ict_batch(
                    ict_tokenizer,
                    [titles[i] for i in rows],
                    [bodies[i] for i in rows],
                    [example_rng(0, 0, i) for i in rows],
                    cfg.remove_sentence_prob,
                    preset.retriever.query_max_tokens,
                    store.config,
                )

            def finish_ict(built):
                query, docs = built
                return tuple({k: v.to(device) for k, v in x.items()} for x in built), tokens(query, docs)

            results.append(
                measure(
                    "ict",
                    model,
                    prepare_ict,
                    finish_ict,
                    lambda b: model(*b)[0],
                    cfg.lr,
                    device,
                    dtype,
                    args.warmup,
                    args.steps,
                    peak,
                    {"batch": cfg.batch_size},
                )
            )
            del model

        if "realm" in trainers:
            cfg = preset.pretrain
            cfg = dataclasses.replace(
                cfg,
                masking="random-span",
                **({"batch_size": args.realm_batch} if args.realm_batch else {}),
                **({"num_candidates": args.candidates} if args.candidates else {}),
            )
            doc_ids, texts = split_sentences(store)
            sentences = SimpleNamespace(texts=texts, spans=[[]] * len(texts), doc_ids=doc_ids)
            block_doc_ids = np.array(store.column("doc_id"), dtype=object)
            reader = (
                Reader.load("random", preset.retriever.shape) if args.model == "random" else Reader.load(args.model)
            )
            model = RealmModel(retriever, reader).to(device).train()
            order = np.random.default_rng(0).permutation(len(texts))

            realm_tokenizer = copy.deepcopy(tokenizer)  # the building thread's own

            def prepare_realm(step: int):
                rows = order[step * cfg.batch_size : (step + 1) * cfg.batch_size]
                return rows, masked_queries(sentences, rows, 0, cfg, realm_tokenizer, preset.retriever.query_max_tokens)

            def finish_realm(built):
                rows, queries = built
                batch = make_pretrain_batch(
                    model, index, sentences, rows, queries, cfg, store, block_doc_ids, device, dtype
                )
                return batch, tokens(batch.query, batch.docs, batch.reader)

            results.append(
                measure(
                    "realm",
                    model,
                    prepare_realm,
                    finish_realm,
                    lambda b: model(b)[0],
                    cfg.lr,
                    device,
                    dtype,
                    args.warmup,
                    args.steps,
                    peak,
                    {"batch": cfg.batch_size, "candidates": cfg.num_candidates},
                )
            )
            del model, reader

        if "qa" in trainers and args.qa:
            cfg = dataclasses.replace(preset.qa, **({"batch_size": args.qa_batch} if args.qa_batch else {}))
            examples = load_qa(args.qa)
            if args.model == "random":
                span_reader = SpanReader(
                    random_bert(preset.retriever.shape, len(tokenizer), 0),
                    tokenizer,
                    cfg.span_hidden,
                    cfg.max_span_width,
                )
            else:
                span_reader = SpanReader.load(args.model, cfg.span_hidden, cfg.max_span_width)
            model = QAModel(retriever, span_reader).to(device).train()
            k = min(cfg.top_k, len(index.block_ids))

            answers = AnswerBlocks(store.column("body"))
            qa_tokenizer = copy.deepcopy(tokenizer)  # the building thread's own

            def prepare_qa(step: int):
                part = [examples[(step * cfg.batch_size + j) % len(examples)] for j in range(cfg.batch_size)]
                return qa_questions(part, qa_tokenizer, preset.retriever.query_max_tokens, answers)

            def finish_qa(questions):
                batch = make_qa_batch(model, questions, index, store, k, cfg.beam).to(device)
                return batch, tokens(batch.query, batch.reader.inputs)

            results.append(
                measure(
                    "qa",
                    model,
                    prepare_qa,
                    finish_qa,
                    lambda b: model(b)[0],
                    cfg.lr,
                    device,
                    dtype,
                    args.warmup,
                    args.steps,
                    peak,
                    {"batch": cfg.batch_size, "top_k": k, "beam": cfg.beam},
                )
            )
    if args.json:
        Path(args.json).write_text(json.dumps({**header, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
