"""Models from the Hugging Face Hub: `chatpage pull REPO[:QUANT]` and `chatpage models`.

Everything goes through ``huggingface_hub`` into its own cache (``HF_HUB_CACHE``), so the files
are shared with transformers, llama.cpp's ``-hf`` and the ``hf`` command; ``HF_ENDPOINT``,
``HF_TOKEN`` and ``HF_HUB_OFFLINE`` mean what they mean there. No torch or Textual here: the
CLI, the TUI's picker and the loader's ``--model REPO[:QUANT]`` all read it.
"""
