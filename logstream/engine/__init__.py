"""The model engine: the model directory's weights and tokenizer, the streaming forward over
sinks and a ring cache per stream, CUDA graphs, the allocator, and the kernels.
"""
