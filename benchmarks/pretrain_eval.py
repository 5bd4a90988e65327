"""Does retrieval help the language model? Masked-span accuracy on held-out sentences of the corpus.

Held-out sentences come from documents the trainers never saw as X (they stay in the knowledge corpus
Z, minus the trivial retrievals). One salient span per sentence is masked, with the same seeded masks
for every model. Rows:
    (a) warm-start reader (MiniLM, fresh MLM head), null document only
    (b) the same training budget of masked-LM with the null document only (`--num-candidates 1`)
    (c) REALM pretraining, with retrieval from the run's last index version (and, for reference, its
        reader with the null document only)
The baseline is (a), measured in the same run.

    python benchmarks/pretrain_eval.py --corpus data/dev/corpus --null-run runs/dev/mlm_null --realm-run runs/dev/realm
"""

from __future__ import annotations

import argparse
from pathlib import Path

from realm.config import get_preset
from realm.data.blocks import BlockStore
from realm.data.sentences import SentenceSet, build_sentences
from realm.eval.mlm import masked_span_accuracy
from realm.index.mips import MipsIndex
from realm.models.mlm_reader import Reader
from realm.models.realm import RealmModel
from realm.models.retriever import Retriever


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--null-run", required=True, help="output of `realm train pretrain --num-candidates 1`")
    parser.add_argument("--realm-run", required=True, help="output of `realm train pretrain`")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--limit", type=int, help="at most this many held-out sentences")
    args = parser.parse_args()
    preset = get_preset(args.preset)
    store = BlockStore(args.corpus)
    held_out = SentenceSet(build_sentences(store, progress=False), preset.pretrain.held_out_fraction, held_out=True)
    print(
        f"{len(held_out)} held-out sentences from {len(set(held_out.doc_ids))} documents "
        f"(held-out fraction {preset.pretrain.held_out_fraction})"
    )
    k = preset.pretrain.num_candidates
    realm_run = Path(args.realm_run)

    def evaluate(retriever: str, reader: str, index: MipsIndex | None) -> dict:
        model = RealmModel(Retriever.load(retriever, preset.retriever), Reader.load(reader))
        return masked_span_accuracy(
            model,
            held_out,
            store,
            index,
            k,
            preset.retriever.query_max_tokens,
            preset.pretrain.max_masks,
            limit=args.limit,
        )

    rows = {
        "(a) warm-start reader, null document only": evaluate("minilm", "minilm", None),
        "(b) masked-LM, null document only, same budget": evaluate("minilm", str(Path(args.null_run) / "reader"), None),
        "(c) REALM reader, null document only": evaluate(str(realm_run / "retriever"), str(realm_run / "reader"), None),
        f"(c) REALM, retrieval ({k} candidates incl. null)": evaluate(
            str(realm_run / "retriever"), str(realm_run / "reader"), MipsIndex(realm_run / "index")
        ),
    }
    base = rows["(a) warm-start reader, null document only"]["token_accuracy"]
    print("\n| model | token acc. % | whole-span acc. % | vs (a) | mean p(null) | retrieval utility |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        ratio = f"{r['token_accuracy'] - base:+.2f} pts"
        print(
            f"| {name} | {r['token_accuracy']:.2f} | {r['span_accuracy']:.2f} | {ratio} | {r['p_null']:.3f} | "
            f"{r['utility']:+.3f} |"
        )


if __name__ == "__main__":
    main()
