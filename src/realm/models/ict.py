"""Inverse Cloze Task (ORQA, Lee et al. 2019): the warm start of REALM's retriever.

A pseudo-query is one sentence of a block; its positive is the block with that sentence removed (90%
of the time; kept 10% so the retriever still learns word matching); the other blocks of the batch are
the negatives. Both towers train:

    loss = CrossEntropy(softmax_j Embed_input(q_i) · Embed_doc(c_j), target j = i)

Under torchrun each process uses its share of the global batch as its negatives."""

from __future__ import annotations

import torch
from torch import nn

from realm.models.retriever import Retriever


class ICTModel(nn.Module):
    def __init__(self, retriever: Retriever):
        super().__init__()
        self.retriever = retriever

    def forward(
        self, query: dict[str, torch.Tensor], docs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.retriever.query_tower(**query)  # (B, D)
        d = self.retriever.doc_tower(**docs)  # (B, D)
        logits = (q @ d.T).float()  # (B, B): the diagonal holds the positives
        target = torch.arange(len(q), device=logits.device)
        loss = nn.functional.cross_entropy(logits, target)
        return loss, (logits.argmax(-1) == target).float().mean().detach()
