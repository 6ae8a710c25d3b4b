"""Rolling-cache kernels: Triton on CUDA, the torch reference on CPU (see dispatch).

Imported as `logstream.kernels` (this folder ships inside the logstream package through the
package-dir mapping in pyproject.toml); never as a top-level `kernels`, a name transformers
probes for HuggingFace's own package. Static tools: see the README's Layout.
"""
