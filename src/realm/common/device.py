"""Where and in what precision to compute: the device, bf16 where the hardware has it, autocast."""

from __future__ import annotations

import os
import platform
from pathlib import Path

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


def describe_machine() -> dict:
    """What a run's figures were measured on, for its records: the processor, its cores, whether it has native
    bf16 matmul (AVX-512-BF16/AMX, which the cpu preset's speed depends on) and the GPU, if any."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_bf16_matmul": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }
