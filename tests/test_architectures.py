"""The architectures beyond Llama: each layer's sliding window read from the config
(``layer_windows``)."""

from __future__ import annotations

import pytest

from chatpage.engine.model_config import layer_windows


def _config(name: str, **kw):
    import transformers

    return getattr(transformers, name)(num_hidden_layers=6, **kw)


@pytest.mark.parametrize(
    ("name", "kw", "want"),
    [
        ("LlamaConfig", {}, [0] * 6),
        ("MistralConfig", {"sliding_window": 24}, [24] * 6),
        ("MistralConfig", {"sliding_window": None}, [0] * 6),
        ("Phi3Config", {"sliding_window": 40}, [40] * 6),
        ("Gemma2Config", {"sliding_window": 16}, [16, 0] * 3),
        ("Gemma3TextConfig", {"sliding_window": 16}, [16] * 5 + [0]),
        ("Gemma3TextConfig", {"sliding_window": 16, "sliding_window_pattern": 3}, [16, 16, 0] * 2),
        ("Qwen2Config", {"sliding_window": 32}, [0] * 6),  # use_sliding_window is off by default
        (
            "Qwen2Config",
            {"sliding_window": 32, "use_sliding_window": True, "max_window_layers": 4},
            [0] * 4 + [32] * 2,
        ),
        ("Qwen3Config", {"sliding_window": 32, "use_sliding_window": False}, [0] * 6),
        (
            "SmolLM3Config",
            {"sliding_window": 8, "use_sliding_window": True, "no_rope_layer_interval": 3},
            [0, 0, 8, 0, 0, 8],
        ),
    ],
)
def test_layer_windows_from_transformers_configs(name, kw, want):
    assert layer_windows(_config(name, **kw)) == want


class _Raw:
    """A config as its config.json spells it, without transformers' derived ``layer_types``."""

    def __init__(self, **kw) -> None:
        self.num_hidden_layers = 6
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"model_type": "gemma2", "sliding_window": 10}, [10, 0] * 3),
        ({"sliding_window": 10, "sliding_window_pattern": 6}, [10] * 5 + [0]),
        ({"sliding_window": 10, "use_sliding_window": False}, [0] * 6),
        (
            {"sliding_window": 10, "use_sliding_window": True, "max_window_layers": 2},
            [0, 0] + [10] * 4,
        ),
        ({"sliding_window": 10}, [10] * 6),
        ({"sliding_window": 0}, [0] * 6),
    ],
)
def test_layer_windows_from_older_spellings(kw, want):
    assert layer_windows(_Raw(**kw)) == want


def test_bad_layer_types_are_named():
    with pytest.raises(ValueError, match="layer_types has 2 entries for 6 layers"):
        layer_windows(_Raw(sliding_window=4, layer_types=["full_attention"] * 2))
    with pytest.raises(ValueError, match="unsupported layer type 'chunked_attention'"):
        layer_windows(_Raw(sliding_window=4, layer_types=["chunked_attention"] * 6))
