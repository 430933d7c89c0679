"""miro.core.layers: what a model's forward pass calls: `Linear` over any weight type (linear.py), attention over the
paged KV cache, RoPE tables, the pointwise kernels (RMSNorm, gated activations), the encoder's kernels and pooling.

Nothing is imported here, so that a module needing only RoPE's or pooling's parameters loads no numba."""
