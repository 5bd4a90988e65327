"""How well does a REALM reader read one block? What an ideal retriever would give, and what a wrong block costs.

For each salient span of the held-out sentences (each masked in turn) that a block of another document holds, the
reader of a `train pretrain` output reads, one at a time:
    - the null document alone (no retrieval);
    - the holder: of the blocks of other documents that hold the span, the one the run's query tower scores highest
      (the holder warm-up's choice, recipes/warmup.py): the reading an ideal retriever would give;
    - the distractor: the retriever's best candidate that does not hold the span (of its top 3, trivial ones dropped).
Masked-token accuracy of each, and the paired differences with 95% intervals resampling sentences. The marginal's
gain is bounded by the first difference, on the share of spans the retriever finds.

    python experiments/reading_ceiling.py --corpus runs/cand45/corpus --run marginal=runs/ctl45 \
        --run candidates=runs/cand45/realm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from realm.config import get_preset
from realm.eval.intervals import bootstrap_interval
from realm.eval.mlm import masked_queries, sentence_points
from realm.index.search import retrieve
from realm.models.realm import NULL_BLOCK, RealmModel, make_batch, pad_queries
from realm.pipeline.work import held_out_scoring
from realm.recipes.warmup import best_holders

BATCH = 16
DISTRACTOR_POOL = 3  # the retriever's top candidates a distractor is taken from


@torch.no_grad()
def one_block_correct(model: RealmModel, queries, blocks: np.ndarray, store) -> tuple[np.ndarray, np.ndarray]:
    """(B, 1) block ids -> correct masked tokens per query reading that block alone, and the null document alone."""
    batch = make_batch(queries, blocks, store, model.retriever.tokenizer, store.config)
    batch = batch.to(next(model.parameters()).device)
    _, stats = model(batch)  # p(null | x) ~ 0 (see main): the marginal is the block's reading where there is one
    return stats["correct"].sum(1).cpu().numpy(), stats["null_correct"].sum(1).cpu().numpy()


def score_run(corpus: Path, run: Path, preset, limit: int | None) -> dict[str, np.ndarray]:
    """Per span with a holder: sentence index, masked tokens, and correct tokens with null / holder / distractor."""
    model, held_out, store, index, finder = held_out_scoring(corpus, run, preset)
    model.eval()
    model.null_score.data.fill_(-30.0)  # learned_weight: p(null | x) = sigmoid(-30), all mass on the block read
    tokenizer, doc_ids = model.retriever.tokenizer, np.array(store.column("doc_id"), dtype=object)
    tokens, masks = preset.retriever.query_max_tokens, preset.pretrain.max_masks
    items = list(masked_queries(held_out, tokenizer, tokens, masks, limit, every_span=True))  # (sentence, query)
    columns: dict[str, list] = {name: [] for name in ("sentence", "tokens", "null", "holder", "distractor")}
    for start in range(0, len(items), BATCH):
        rows, queries = zip(*items[start : start + BATCH])
        sources = [held_out.doc_ids[i] for i in rows]
        spans = [str(tokenizer.decode(q.targets)) for q in queries]
        query, *_ = pad_queries(list(queries), tokenizer.pad_token_id)
        with torch.no_grad():
            vectors = model.retriever.query_vectors(query)
        holders = best_holders(finder, index, vectors, spans, sources)  # (B, 1)
        top = retrieve(model, index, query, doc_ids, sources, DISTRACTOR_POOL)  # (B, 3)
        distractors = np.array(
            [[next((int(z) for z in row if z >= 0 and not finder.retrieved(span, [int(z)])), NULL_BLOCK)]
             for row, span in zip(top, spans)],
            dtype=np.int64,
        )  # fmt: skip
        with_holder, null = one_block_correct(model, list(queries), holders, store)
        with_distractor, _ = one_block_correct(model, list(queries), distractors, store)
        keep = (holders[:, 0] >= 0) & (distractors[:, 0] >= 0)
        columns["sentence"] += [r for r, k in zip(rows, keep) if k]
        columns["tokens"] += [len(q.targets) for q, k in zip(queries, keep) if k]
        columns["null"] += null[keep].tolist()
        columns["holder"] += with_holder[keep].tolist()
        columns["distractor"] += with_distractor[keep].tolist()
    return {name: np.array(values) for name, values in columns.items()} | {"all_spans": np.array(len(items))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR (a `train pretrain` output)")
    parser.add_argument("--limit", type=int, help="the first N held-out sentences (default: all)")
    args = parser.parse_args()
    preset = get_preset("cpu")
    print(
        "| run | spans with a holder and a distractor (of all) | null document | holder alone | distractor alone "
        "| holder - null [95%] | distractor - null [95%] |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, run in (spec.split("=", 1) for spec in args.run):
        s = score_run(args.corpus, Path(run), preset, args.limit)
        tokens = s["tokens"].sum()
        accuracy = {key: 100 * s[key].sum() / tokens for key in ("null", "holder", "distractor")}
        cells = []
        for key in ("holder", "distractor"):
            points = sentence_points(s["sentence"], s[key] - s["null"], s["tokens"].sum())
            low, high = bootstrap_interval(points)
            cells.append(f"{points.mean():+.2f} [{low:+.2f}, {high:+.2f}]")
        print(
            f"| {name} | {len(s['tokens'])} ({int(s['all_spans'])}) | {accuracy['null']:.2f} | {accuracy['holder']:.2f} "
            f"| {accuracy['distractor']:.2f} | {cells[0]} | {cells[1]} |"
        )


if __name__ == "__main__":
    main()
