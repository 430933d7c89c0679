"""miro.core.engine: the engine and what it owns: requests and sequences, the scheduler, the KV cache and its blocks,
the model runner, and the outputs (detokenisation and stops apart from the engine, in output_processor.py)."""
