"""Loads the csrc extension (native paged-attention ops). Until it is built, nothing is loaded."""

from __future__ import annotations

import torch


def available(device: torch.device) -> bool:
    """True when the native ops are loaded for ``device``."""
    return False


def status() -> str:
    """"native" when the kernels are in use, else why the torch reference runs."""
    return "reference: native kernels not built"
