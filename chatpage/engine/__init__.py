"""The paged KV-cache engine (PagedAttention): import nothing from ui/ or textual here."""

from chatpage.engine.config import EngineConfig
from chatpage.engine.llm_engine import LLMEngine
from chatpage.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from chatpage.engine.sampling_params import SamplingParams

__all__ = [
    "CompletionOutput",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
