"""Rolling-cache kernels: Triton on CUDA, the torch reference on CPU (see dispatch)."""
