"""BERT's optimiser and its step (clipping, schedule, cleared gradients)."""

from __future__ import annotations

import torch
from torch import nn


def bert_optimizer(
    model: nn.Module, lr: float, weight_decay: float = 0.01, prefix_lrs: dict[str, float] | None = None
) -> torch.optim.AdamW:
    """BERT's default optimiser: AdamW, eps 1e-6, no weight decay on biases and LayerNorm. Parameters whose
    name starts with a key of `prefix_lrs` get that learning rate (first match); each group records its
    prefix ("" for the rest) so a schedule can treat it apart. The fused kernel updates each tensor in one pass
    (45M MiniLM parameters: 40 ms a step against 140 ms for the per-op `foreach` update, on 2 CPU cores)."""
    prefix_lrs = prefix_lrs or {}
    groups: dict[tuple[bool, str], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            no_decay = param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name
            prefix = next((p for p in prefix_lrs if name.startswith(p)), "")
            groups.setdefault((no_decay, prefix), []).append(param)
    return torch.optim.AdamW(
        [
            {
                "params": params,
                "weight_decay": 0.0 if no_decay else weight_decay,
                "lr": prefix_lrs.get(prefix, lr),
                "prefix": prefix,
            }
            for (no_decay, prefix), params in sorted(groups.items())
        ],
        lr=lr,
        eps=1e-6,
        fused=True,
    )


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, max_grad_norm: float = 1.0) -> None:
    """Clip (BERT: global norm 1.0), step the optimiser and the schedule, clear the gradients."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
