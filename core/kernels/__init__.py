"""miro.core.kernels: the numba kernels behind Linear, by weight type and CPU tier. weight_types.py is the one table
that says, for each GGML type, its blocks, its dequantization, its activation format and its kernels per tier."""
