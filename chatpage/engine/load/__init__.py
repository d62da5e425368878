"""Loading a model from its files: HF folders (streamed), GGUF files (read, checked, dequantized
or packed as int4) and the packed-weights cache."""
