"""How far re-embedding can go on this machine: the index builder's embedder against its own linear layers alone,
and against the two fusions eager PyTorch leaves out, on the same blocks in one run.

- `ours`: `BlockEmbedder.embed` as built (bf16 where the CPU has it).
- `+ GELU fused`: the same with each layer's first feed-forward matmul and its GELU one oneDNN call (the post-op
  that inductor's CPU backend uses: `torch.ops.mkldnn._linear_pointwise`).
- `compiled`: BertModel's padded forward under `torch.compile(dynamic=True)` with inductor's freezing (weights
  prepacked, elementwise work fused); the compile time is printed apart.
- `linear layers alone`: every matmul of the forward (Q/K/V, output, both feed-forward ones, 6 layers) over the
  corpus's real tokens, in 1,024-token chunks, nothing else: a ceiling for any fusion.

    python benchmarks/embed_ceiling.py --corpus data/bench/corpus [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch._inductor.config as inductor_config

from realm.config import get_preset
from realm.data.blocks import BlockStore
from realm.index.embed import BlockEmbedder
from realm.models import encoder, retriever
from realm.models.inputs import encode_blocks


class LinearGelu(torch.nn.Module):
    """A BERT intermediate dense layer whose GELU (erf) runs as the matmul's oneDNN post-op."""

    def __init__(self, dense: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias = dense.weight, dense.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "gelu", [], "none")


def hf_forward(bert, input_ids, attention_mask, token_type_ids):
    return bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--rounds", type=int, default=3, help="best of N per variant, variants alternating")
    args = parser.parse_args()
    preset = get_preset("cpu")
    store = BlockStore(args.corpus)
    tower_source = retriever.Retriever.load("minilm", preset.retriever)
    embedder = BlockEmbedder(tower_source.doc_tower, tower_source.tokenizer, store.config, preset.embed)
    titles, bodies = store.slice(0, len(store))
    bert = embedder.tower.bert
    layers = bert.encoder.layer
    ids, _ = encode_blocks(embedder.tokenizer, titles, bodies, store.config)
    tokens = sum(len(row) for row in ids)
    print(f"{len(titles)} blocks, {tokens} tokens, {embedder.dtype}, {torch.get_num_threads()} threads")

    plain_dense = [layer.intermediate.dense for layer in layers]
    gelu = encoder.ACT2FN

    def setup(name: str) -> None:
        fused = name == "+ GELU fused"
        for layer, dense in zip(layers, plain_dense):
            layer.intermediate.dense = LinearGelu(dense) if fused else dense
        encoder.ACT2FN = {bert.config.hidden_act: torch.nn.Identity()} if fused else gelu
        retriever.encode = compiled if name == "compiled" else encoder.encode

    inductor_config.freezing = True
    compiled = torch.compile(hf_forward, dynamic=True)
    reference = embedder.embed(titles, bodies)
    setup("compiled")
    started = time.perf_counter()
    embedder.embed(titles[:256], bodies[:256])
    print(f"compiled: first 256 blocks {time.perf_counter() - started:.1f} s, compiling included")

    x = torch.randn(1024, bert.config.hidden_size, dtype=embedder.dtype)  # a chunk of tokens
    h = torch.randn(1024, bert.config.intermediate_size, dtype=embedder.dtype)  # its feed-forward activations
    weights = [
        w.weight
        for layer in layers
        for w in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value)
        + (layer.attention.output.dense, layer.intermediate.dense, layer.output.dense)
    ]

    @torch.inference_mode()
    def linears_alone() -> None:
        for _ in range(-(-tokens // len(x))):
            for w in weights:
                torch.nn.functional.linear(x if w.shape[1] == x.shape[1] else h, w)

    variants = ["ours", "+ GELU fused", "compiled", "linear layers alone"]
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    agree: dict[str, float] = {}
    for _ in range(args.rounds):
        for name in variants:
            setup(name if name != "linear layers alone" else "ours")
            started = time.perf_counter()
            if name == "linear layers alone":
                linears_alone()
            else:
                out = embedder.embed(titles, bodies)
                agree[name] = float(np.abs(out - reference).max())
            seconds[name].append(time.perf_counter() - started)
    setup("ours")
    base = len(titles) / min(seconds["ours"])
    print("\n| variant | blocks/s | vs ours | max abs difference to ours |\n|---|---:|---:|---:|")
    for name in variants:
        rate = len(titles) / min(seconds[name])
        difference = f"{agree[name]:.4f}" if name in agree else ""
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {difference} |")


if __name__ == "__main__":
    main()
