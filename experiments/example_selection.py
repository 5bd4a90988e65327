"""Which worked examples a pipeline run's report would show, by two rankings: how often the top retrieved block
holds the masked span among the three each picks (docs/log, "The README main command with no ICT").

The report ranks by the probability raise p(y | z_top, x) - p(y | null, x) (`realm.eval.mlm.probability_raise`);
before, by the log ratio log p(y | z_top, x) - log p(y | null, x), which puts first spans no model finds.

    python experiments/example_selection.py runs/base45 runs/noict45 [--pool 100]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from realm.config import get_preset
from realm.eval.mlm import probability_raise, scored_batches  # the report's own scoring pass
from realm.pipeline.work import held_out_scoring


def candidates(run: Path, pool: int) -> list[tuple[float, float, str, bool]]:
    """(log ratio, probability raise, span, top block holds it) for each of the first `pool` held-out sentences."""
    preset = get_preset("cpu")
    model, held_out, store, index, finder = held_out_scoring(run / "corpus", run / "realm", preset)
    k, tokens, masks = preset.pretrain.num_candidates, preset.retriever.query_max_tokens, preset.pretrain.max_masks
    rows = []
    for _, queries, batch, stats in scored_batches(model, held_out, store, index, k, tokens, masks, pool, 16):
        token_lp, valid = stats["token_log_probs"], batch.mask_valid.float()  # (B, K, M), (B, M)
        null, top = (token_lp[:, 0] * valid).sum(-1), (token_lp[:, 1] * valid).sum(-1)  # (B,) log p(y | z, x)
        for b, query in enumerate(queries):
            span, block = model.retriever.tokenizer.decode(query.targets), int(batch.candidate_ids[b, 1])
            holds = block >= 0 and finder.retrieved(span, [block])
            rows.append((float(top[b] - null[b]), probability_raise(float(null[b]), float(top[b])), span, holds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="`realm pipeline` run folders (corpus/, realm/)")
    parser.add_argument("--pool", type=int, default=100, help="held-out sentences searched, as the report's")
    args = parser.parse_args()
    print("| run | top block holds the span (of the pool) | log ratio: of its 3 | probability raise: of its 3 |")
    print("|---|---:|---:|---:|")
    for run in args.runs:
        rows = candidates(run, args.pool)
        by_ratio, by_raise = (sorted(rows, key=lambda r, i=i: -r[i])[:3] for i in (0, 1))
        print(
            f"| {run.name} | {sum(r[3] for r in rows)} of {len(rows)} | {sum(r[3] for r in by_ratio)} "
            f"({', '.join(r[2] for r in by_ratio)}) | {sum(r[3] for r in by_raise)} ({', '.join(r[2] for r in by_raise)}) |"
        )


if __name__ == "__main__":
    main()
