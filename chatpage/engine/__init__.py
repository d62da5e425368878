"""The paged KV-cache engine (PagedAttention): import nothing from ui/ or textual here.

The names below load on first use (PEP 562), so that importing a light module of the package
(``chatpage.engine.client``, ``sampling_params``, ``chat_template``) does not import torch:
the app paints its first frame before the engine thread loads the model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatpage.engine.config import EngineConfig
    from chatpage.engine.llm_engine import LLMEngine
    from chatpage.engine.outputs import (
        CompletionOutput,
        EngineStats,
        OutputDelta,
        RequestOutput,
        RequestUpdate,
        Usage,
    )
    from chatpage.engine.sampling_params import SamplingParams
    from chatpage.vocab import FinishReason

_HOMES = {
    "CompletionOutput": "chatpage.engine.outputs",
    "EngineConfig": "chatpage.engine.config",
    "EngineStats": "chatpage.engine.outputs",
    "FinishReason": "chatpage.vocab",
    "OutputDelta": "chatpage.engine.outputs",
    "LLMEngine": "chatpage.engine.llm_engine",
    "RequestOutput": "chatpage.engine.outputs",
    "RequestUpdate": "chatpage.engine.outputs",
    "SamplingParams": "chatpage.engine.sampling_params",
    "Usage": "chatpage.engine.outputs",
}

__all__ = [
    "CompletionOutput",
    "EngineConfig",
    "EngineStats",
    "FinishReason",
    "LLMEngine",
    "OutputDelta",
    "RequestOutput",
    "RequestUpdate",
    "SamplingParams",
    "Usage",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'chatpage.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value
