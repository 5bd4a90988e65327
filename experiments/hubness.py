"""Hubness of masked queries: do masked sentences collapse onto a few "hub" blocks at top-1?

200 sentences of the corpus's non-SQuAD documents (seed 0), one capitalised span of 1-3 words (not the first
word) replaced by one [MASK] per wordpiece, as salient-span masking makes pretraining queries. For each retriever
(a model and the index its document tower built) it prints the number of distinct top-1 blocks, the most common
top-1 block and its share of the queries, and how often the sentence's own document is top-1, for:

    centred      the library's pretraining retrieval: [MASK] left out of mean pooling, the query centred on the
                 mean masked query (the model's own mask_center after pretraining; for a retriever never
                 pretrained, the mean of 1,024 other sentences masked the same way, as pretraining starts)
    not centred  [MASK] left out of pooling only
    before       [MASK] averaged into the pooling, no centring (the library before this fix)
    unmasked     the same sentences without masks

With --questions QA.jsonl it also prints dense recall@k of those questions as the library embeds them (no
centring: they hold no [MASK]) and with the alternative of centring every query (the centre subtracted from
the query tower's LayerNorm bias), which is why only masked queries are centred.

    python experiments/hubness.py --retriever minilm=data/exp/index --questions squad-open-dev

    python experiments/hubness.py --retriever minilm=data/exp/index [--retriever runs/x/realm=runs/x/realm/index]
"""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter

from realm.config import get_preset
from realm.data.qa_examples import load_qa
from realm.data.sentences import split_sentences
from realm.eval.retrieval import recall_at_k
from realm.index.mips import MipsIndex
from realm.index.search import Searcher, open_searcher, search_all
from realm.models.retriever import Retriever

CAPITALISED = re.compile(r"(?<=\s)[A-Z][a-z]+(?:\s[A-Z][a-z]+){0,2}\b")
KEEPS_MASKS = -1  # a mask token id no input has: the tower averages [MASK] positions in, as before the fix
CENTER_SAMPLE = 1024


def masked_sample(store, tokenizer, size: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """(masked, unmasked, source doc ids) for `size` sentences with a capitalised span past the first word."""
    doc_ids, texts = split_sentences(store)
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    masked, plain, sources = [], [], []
    for i in order:
        if doc_ids[i].startswith("squad:"):
            continue
        spans = list(CAPITALISED.finditer(texts[i]))
        if not spans or len(texts[i].split()) < 6:
            continue
        span = rng.choice(spans)
        masks = " ".join(["[MASK]"] * len(tokenizer.tokenize(span.group())))
        masked.append(texts[i][: span.start()] + masks + texts[i][span.end() :])
        plain.append(texts[i])
        sources.append(doc_ids[i])
        if len(masked) == size:
            break
    return masked, plain, sources


def top1_stats(searcher: Searcher, queries: list[str], sources: list[str]) -> tuple[int, str, float, float]:
    hits = [row[0] for row in search_all(searcher, queries, 1)]
    counts = Counter(h.block_id for h in hits)
    block, count = counts.most_common(1)[0]
    title = next(h.title for h in hits if h.block_id == block)
    own = sum(h.doc_id == s for h, s in zip(hits, sources))
    return len(counts), title, 100 * count / len(queries), 100 * own / len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--retriever", action="append", required=True, help="MODEL=INDEX (repeatable)")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", help="QA JSONL: recall@k with and without centring every query")
    args = parser.parse_args()
    preset = get_preset("cpu")
    print("| retriever | queries | distinct top-1 | most common top-1 | its share | own document top-1 |")
    print("|---|---|---:|---|---:|---:|")
    for spec in args.retriever:
        model, index_dir = spec.rsplit("=", 1)
        index = MipsIndex(index_dir)
        retriever = Retriever.load(model, index.retriever_config(preset.retriever))
        searcher = open_searcher(index, "dense", retriever)
        tower = retriever.query_tower
        masked, plain, sources = masked_sample(searcher.store, retriever.tokenizer, args.sentences, args.seed)
        own_center = tower.mask_center.clone()
        if not own_center.any():  # never pretrained: centre as pretraining starts, on other masked sentences
            others = masked_sample(searcher.store, retriever.tokenizer, CENTER_SAMPLE, args.seed + 1)[0]
            own_center = retriever.embed_queries(others).mean(0)
        mask_id = tower.mask_token_id
        for label, queries, token, center in (
            ("masked, centred", masked, mask_id, own_center),
            ("masked, not centred", masked, mask_id, 0 * own_center),
            ("masked, [MASK] averaged in (before)", masked, KEEPS_MASKS, 0 * own_center),
            ("unmasked", plain, mask_id, own_center),
        ):
            tower.mask_token_id = token
            tower.mask_center.copy_(center)
            distinct, title, share, own = top1_stats(searcher, queries, sources)
            print(f"| {model} | {label} | {distinct} | {title} | {share:.1f}% | {own:.1f}% |")
        tower.mask_token_id = mask_id
        if args.questions:
            examples = load_qa(args.questions)
            bias = tower.layer_norm.bias.data.clone()
            for label, shift in (("questions as embedded", 0 * own_center), ("every query centred", own_center)):
                tower.layer_norm.bias.data = bias - shift
                hits = search_all(searcher, [e.question for e in examples], 20)
                recall = recall_at_k(examples, hits, (1, 5, 20))
                print(f"{model}: {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in recall.items()))
            tower.layer_norm.bias.data = bias


if __name__ == "__main__":
    main()
