"""Inverse Cloze Task (ORQA, Lee et al. 2019): the warm start of REALM's retriever.

A pseudo-query is one sentence of a block; its positive is the block with that sentence removed (90%
of the time; kept 10% so the retriever still learns word matching); the other blocks of the batch are
the negatives. Both towers train:

    loss = CrossEntropy(softmax_j Embed_input(q_i) · Embed_doc(c_j), target j = i)

Under torchrun each process uses its share of the global batch as its negatives."""

from __future__ import annotations

import torch
from torch import nn

from realm.models.retriever import Retriever, inner_products


class ICTModel(nn.Module):
    def __init__(self, retriever: Retriever):
        super().__init__()
        self.retriever = retriever

    def logits(self, query: dict[str, torch.Tensor], docs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, B) f(q_i, c_j) in fp32."""
        return inner_products("bd,cd->bc", self.retriever.query_tower(**query), self.retriever.doc_tower(**docs))

    def forward(
        self, query: dict[str, torch.Tensor], docs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(query, docs)  # (B, B): the diagonal holds the positives
        target = torch.arange(len(logits), device=logits.device)
        loss = nn.functional.cross_entropy(logits, target)
        return loss, (logits.argmax(-1) == target).float().mean().detach()
