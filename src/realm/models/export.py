"""The retriever's towers for where users already are: sentence-transformers folders and ONNX graphs.

Each tower computes what models/retriever.py's Tower computes, so f(x, z) = Embed_input(x) · Embed_doc(z) from an
export equals `realm search`'s score on an index built by the same document tower:

    OUT/query/  Embed_input(x): a question, [CLS] x [SEP], at most query_max_tokens wordpieces
    OUT/doc/    Embed_doc(z):   a (title, body) pair, [CLS] title [SEP] body [SEP], at most max_block_tokens

    sentence-transformers:  Transformer (BERT) -> Pooling (mean or cls) -> Dense (the projection) -> LayerNorm;
                            SentenceTransformer(OUT/query).encode(questions), .encode([[title, body], ...])
    onnx:                   model.onnx, inputs input_ids, attention_mask, token_type_ids (int64, (B, L)), output
                            sentence_embedding (float32, (B, D)); the tokenizer beside it; model_int8.onnx with
                            --int8 (onnxruntime's dynamic quantization: int8 weights, activations quantized per batch)

The masked-query behaviour of pretraining (mean pooling without [MASK], `mask_center`) is in the ONNX graph; the
sentence-transformers pipeline has no such module, and questions and documents hold no [MASK], so neither moves
them. The pooling `pooler` (BERT's tanh pooled output) has no sentence-transformers module: that export refuses it.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from realm.common.io import write_dir_atomic
from realm.models.retriever import Retriever, Tower, pool

ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ONNX_OUTPUT = "sentence_embedding"
ONNX_META = "realm_onnx.json"


def _towers(retriever: Retriever, max_block_tokens: int) -> dict[str, tuple[Tower, int]]:
    return {
        "query": (retriever.query_tower, retriever.config.query_max_tokens),
        "doc": (retriever.doc_tower, max_block_tokens),
    }


def export_sentence_transformers(retriever: Retriever, out: Path, max_block_tokens: int) -> None:
    """OUT/query and OUT/doc as sentence-transformers folders (built with its own modules, so its loader reads
    them whatever its version wrote), scored by dot product."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, LayerNorm, Pooling, Transformer

    if retriever.config.pooling not in ("mean", "cls"):
        raise ValueError(f"pooling {retriever.config.pooling!r} has no sentence-transformers module (mean or cls)")

    def write(tmp: Path) -> None:
        for name, (tower, max_tokens) in _towers(retriever, max_block_tokens).items():
            bert_dir = tmp / f"{name}.bert"
            tower.bert.save_pretrained(str(bert_dir))
            retriever.tokenizer.save_pretrained(str(bert_dir))
            transformer = Transformer(str(bert_dir), max_seq_length=max_tokens)
            pooling = Pooling(tower.bert.config.hidden_size, retriever.config.pooling)
            dense = Dense(
                tower.projection.in_features, tower.projection.out_features, activation_function=nn.Identity()
            )
            dense.linear.load_state_dict(tower.projection.state_dict())
            norm = LayerNorm(tower.layer_norm.normalized_shape[0])
            norm.norm.load_state_dict(tower.layer_norm.state_dict())
            model = SentenceTransformer(
                modules=[transformer, pooling, dense, norm], device="cpu", similarity_fn_name="dot"
            )
            model.save(str(tmp / name))
            shutil.rmtree(bert_dir)

    write_dir_atomic(out, write)


class ExportedTower(nn.Module):
    """A Tower through Hugging Face's own BertModel forward (eager attention), which the ONNX exporter traces; the
    Tower's packed encoder is a CPU training kernel with data-dependent buckets."""

    mask_center: torch.Tensor  # (D,) a buffer

    def __init__(self, tower: Tower):
        super().__init__()
        self.bert = copy.deepcopy(tower.bert).float().eval()
        self.bert.config._attn_implementation = "eager"
        self.projection = copy.deepcopy(tower.projection).float()
        self.layer_norm = copy.deepcopy(tower.layer_norm).float()
        self.register_buffer("mask_center", tower.mask_center.detach().float().clone())
        self.pooling = tower.pooling
        self.mask_token_id = tower.mask_token_id

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        bert = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        is_mask = input_ids == self.mask_token_id  # (B, L)
        pooled = pool(bert.last_hidden_state, attention_mask * (~is_mask).long(), self.pooling, self.bert)  # (B, H)
        embedded = self.layer_norm(self.projection(pooled))  # (B, D)
        return embedded - is_mask.any(1, keepdim=True).to(embedded.dtype) * self.mask_center


def export_onnx(retriever: Retriever, out: Path, max_block_tokens: int, int8: bool = False) -> None:
    """OUT/query and OUT/doc, each model.onnx (and model_int8.onnx), its tokenizer and realm_onnx.json."""

    for logger in ("onnxscript", "onnx_ir", "torch.onnx._internal.exporter._registration"):
        logging.getLogger(logger).setLevel(logging.ERROR)  # the exporter's passes, node by node

    def write(tmp: Path) -> None:
        for name, (tower, max_tokens) in _towers(retriever, max_block_tokens).items():
            folder = tmp / name
            folder.mkdir()
            pairs = ["a title", "a body of text"] if name == "doc" else None
            sample = retriever.tokenizer(
                ["a question", "a longer second question"], pairs, padding=True, return_tensors="pt"
            )  # (2, L) each: a batch of two rows of different lengths
            batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=max_tokens)
            with warnings.catch_warnings():  # the exporter's notes on its own internals, not on this graph
                warnings.filterwarnings("ignore", message=".*(LeafSpec|axis name).*")
                torch.onnx.export(
                    ExportedTower(tower).eval(),
                    tuple(sample[key] for key in ONNX_INPUTS),
                    str(folder / "model.onnx"),
                    input_names=list(ONNX_INPUTS),
                    output_names=[ONNX_OUTPUT],
                    dynamic_shapes={key: {0: batch, 1: length} for key in ONNX_INPUTS},
                    dynamo=True,  # torch's maintained exporter (onnxscript)
                    external_data=False,  # the weights inside the one file
                    verbose=False,
                )
            if int8:
                from onnxruntime.quantization import QuantType, quantize_dynamic

                root, level = logging.getLogger(), logging.getLogger().level
                root.setLevel(logging.ERROR)  # the quantizer logs each tensor it skips, and advice, to the root logger
                try:
                    quantize_dynamic(folder / "model.onnx", folder / "model_int8.onnx", weight_type=QuantType.QInt8)
                finally:
                    root.setLevel(level)
            retriever.tokenizer.save_pretrained(str(folder))
            meta = {
                "tower": name,
                "inputs": list(ONNX_INPUTS),
                "output": ONNX_OUTPUT,
                "max_length": max_tokens,
                "text": "[CLS] question [SEP]" if name == "query" else "[CLS] title [SEP] body [SEP] (a text pair)",
                "score": "dot product of the query and doc embeddings",
            }
            (folder / ONNX_META).write_text(json.dumps(meta, indent=2) + "\n")

    write_dir_atomic(out, write)
