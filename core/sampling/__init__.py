"""miro.core.sampling: what a request asks of the sampler (params.py), the sampler itself, and structured output
(a constraint as requested, its grammar, and the token mask it applies)."""
