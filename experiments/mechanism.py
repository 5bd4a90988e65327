"""The mechanism check at full size (twin_corpus.py): on a twin corpus of real sentences, does REALM's
masked-LM loss alone raise the twin's recall@1 and make retrieval beat the null document? With MiniLM (the cpu
preset's towers and reader) or the tiny random models of the CI test; the query tower's projection starts as a
random rotation of the document tower's, so the twin starts at chance. Figures with 95% intervals over the masked
spans, for the pairs trained on and for held-out pairs; `--detach` scores blocks with a detached f(x, z), the
control that must not learn.

    python experiments/mechanism.py --pairs 160 --reader-steps 150 --realm-steps 300 --out runs/mechanism.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
from twin_corpus import (
    MechanismConfig,
    lead_sentences,
    run_mechanism_check,
    twin_queries,
    write_twin_corpus,
)

import realm.models.realm as realm_model
from realm.common.io import write_json_atomic
from realm.config import EncoderShape, get_preset
from realm.data.sources import SQUAD_PARAGRAPHS
from realm.models.mlm_reader import Reader
from realm.models.realm import RealmModel
from realm.models.retriever import Retriever

TINY = EncoderShape(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, dropout=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=SQUAD_PARAGRAPHS, help="documents whose first sentences are used")
    parser.add_argument("--pairs", type=int, default=160)
    parser.add_argument("--model", choices=["minilm", "random"], default="minilm")
    parser.add_argument("--reader-steps", type=int, default=150)
    parser.add_argument("--realm-steps", type=int, default=300)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4, help="the reader (its fresh head at 10x with minilm)")
    parser.add_argument("--retriever-lr", type=float, default=1e-4)
    parser.add_argument("--detach", action="store_true", help="the control: f(x, z) detached from the loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    preset = get_preset("cpu")
    if args.model == "random":
        preset = dataclasses.replace(preset, retriever=dataclasses.replace(preset.retriever, shape=TINY, dropout=0.0))
    retriever = Retriever.load(args.model, preset.retriever)
    torch.manual_seed(args.seed + 1)  # the query projection, a random rotation of the document tower's
    torch.nn.init.orthogonal_(retriever.query_tower.projection.weight)
    model = RealmModel(retriever, Reader.load(args.model, preset.retriever.shape))
    if args.detach:
        scores = realm_model.inner_products
        realm_model.inner_products = lambda *a: scores(*a).detach()  # type: ignore[assignment]
    cfg = MechanismConfig(
        reader_steps=args.reader_steps,
        realm_steps=args.realm_steps,
        num_candidates=args.candidates,
        lr=args.lr,
        retriever_lr=args.retriever_lr,
        head_lr_multiplier=10.0 if args.model == "minilm" else 1.0,
        seed=args.seed,
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = write_twin_corpus(lead_sentences(args.corpus, args.pairs), Path(tmp), model.retriever.tokenizer, preset)
        twins = twin_queries(store, model.retriever.tokenizer, preset)
        started = time.monotonic()
        result = run_mechanism_check(model, store, twins, cfg)
    result |= {"seconds": round(time.monotonic() - started, 1), "blocks": len(store), "args": vars(args)}
    write_json_atomic(Path(args.out), result)
    for split in ("towers", "held_out"):
        for when in ("before", "after"):
            m = result[when][split]
            print(
                f"{split:8s} {when:6s} spans {m['spans']:4d}  twin recall@1 {m['twin_recall@1']:6.2f} "
                "[{:.1f}, {:.1f}]".format(*m["twin_recall@1_95ci"])
                + f"  retrieval gain {m['retrieval_gain']:+6.2f} "
                + "[{:+.2f}, {:+.2f}]".format(*m["retrieval_gain_95ci"])
            )
    print(json.dumps({k: result[k] for k in ("loss_first", "loss_last", "seconds", "blocks")}))


if __name__ == "__main__":
    main()
