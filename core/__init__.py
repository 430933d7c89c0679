"""miro.core: the inference engine (no Redis here)."""
