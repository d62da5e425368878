"""The models scripts/gpu_check.sh runs: prints the directories to compare greedily with the CPU
path on stdout (the tiny random Llama and Qwen2 of the test suite, and the default model when it
is installed), and ``decode DIR`` on stderr: the model of the decode benchmark (argument 2 when
given, else the default model, else a random model of its shape: decode speed depends on the
shape, not the values). Works offline: without the default model the tokenizer is trained here.

    python scripts/gpu_models.py WORK_DIR [MODEL_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from model_dirs import offline_tokenizer_dir, tiny_model_dir  # noqa: E402

from chatpage.engine.load.loader import ModelLoadError, load_model  # noqa: E402

# SmolLM2-135M-Instruct's shape (the default model), untied
DEFAULT_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192)


def main(argv: list[str]) -> int:
    work = Path(argv[0])
    work.mkdir(parents=True, exist_ok=True)
    try:
        default = load_model(None, progress=lambda _m: None).directory
    except ModelLoadError as e:
        print(f"gpu_models: the default model is not installed ({e}); its checks are left out",
              file=sys.stderr)
        default = None
    tokenizer = default or offline_tokenizer_dir(work)
    dirs = [tiny_model_dir(kind, work / kind, tokenizer) for kind in ("llama", "qwen2")]
    if default is not None:
        dirs.append(default)
    decode = argv[1] if len(argv) > 1 and argv[1] else default
    if decode is None:
        decode = tiny_model_dir("llama", work / "default-shape", tokenizer, **DEFAULT_SHAPE)
    for d in dirs:
        print(d)
    print(f"decode {decode}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
