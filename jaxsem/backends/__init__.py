"""How element work runs: the einsum reference everywhere, fused CUDA kernels on NVIDIA GPUs."""
