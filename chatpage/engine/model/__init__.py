"""The model and its kernels: architectures, attention, fused ops, weight formats, the runner,
the paged KV cache, CUDA graphs and the native ops (csrc/)."""
