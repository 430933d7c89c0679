"""The engine's defaults, in one place: Engine's keyword arguments, the CLI's options and the workers
started by `rq worker` (MIRO_* environment variables) all read them from here.

No imports beyond the standard library, so that any module (and a command that never loads a model) can
read them cheaply.
"""

KV_CACHE_MEMORY = "1GiB"  # KV cache size when neither num_kv_blocks nor kv_cache_memory is given
BLOCK_SIZE = 16  # tokens per KV-cache block
MAX_NUM_SEQS = 64  # sequences decoded together
MAX_NUM_BATCHED_TOKENS = 512  # tokens per step (prefill chunks and decode tokens together)

WEIGHT_CHOICES = ("auto", "f32", "native")
WEIGHTS = "auto"
WEIGHT_MEMORY_FRACTION = 0.5  # of the machine's RAM: auto's budget for a float32 copy of the weights
