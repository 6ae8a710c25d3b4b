"""Rolling-cache kernels: Triton on CUDA, the torch reference on CPU (see dispatch).

Never a top-level `kernels`: that is HuggingFace's package, which transformers imports.
"""
