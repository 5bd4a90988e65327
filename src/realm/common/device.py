"""Where and in what precision to compute: the device, bf16 where the hardware has it, autocast."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` picks bf16 on GPUs with bf16 and on CPUs with native bf16 matmul (oneDNN), else fp32."""
    if name == "fp32":
        return torch.float32
    if name == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32


def autocast(dtype: torch.dtype, device: torch.device):
    """bf16 autocast where the embedder would use bf16 (CPUs with AVX-512-BF16/AMX, GPUs); else a no-op."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
