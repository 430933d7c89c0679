"""miro's defaults, in one place: Engine's and BatchWorker's keyword arguments, submit's, the CLI's options
and the workers started by `rq worker` (MIRO_* environment variables) all read them from here.

No imports beyond the standard library, so that any module (and a command that never loads a model) can
read them cheaply.
"""

KV_CACHE_MEMORY = "1GiB"  # KV cache size when neither num_kv_blocks nor kv_cache_memory is given
BLOCK_SIZE = 16  # tokens per KV-cache block (a multiple of 16: the attention kernel takes keys 16 at a time)
# how K and V are stored: float16 (llama.cpp's default too) halves the bytes attention reads and doubles the
# tokens a budget holds; the default model's logits stay within 0.02 of float32 transformers' with it
KV_CACHE_DTYPES = ("float16", "float32")
KV_CACHE_DTYPE = "float16"
# sequences decoded together; None: from the KV cache, a seat per TOKENS_PER_SEAT tokens it holds, between
# 64 and 128 (benchmarks/batch_choices.py seats: 128 seats 1.06x 64 on the default model and cache, 256 too many
# for 1 GiB: it preempts)
MAX_NUM_SEQS = None
MAX_NUM_SEQS_RANGE = (64, 128)
TOKENS_PER_SEAT = 256
MAX_NUM_BATCHED_TOKENS = 512  # tokens per step (prefill chunks and decode tokens together)
# embeddings (core/engine/embedder.py): whole inputs packed into one forward pass up to this many tokens (TEI's
# max_batch_tokens, llama.cpp's n_ubatch), and the inputs an embedding engine holds at once
EMBED_BATCH_TOKENS = 4096
EMBED_MAX_NUM_SEQS = 256
# the order waiting requests of one priority are admitted in: "prefix": the one with the longest prompt prefix
# in the prefix cache first (looking at the next ADMISSION_LOOKAHEAD; benchmarks/batch_choices.py admission:
# 5.2x on prompts sharing long documents, 1.01x on ShareGPT), or "arrival"
ADMISSION_ORDERS = ("prefix", "arrival")
ADMISSION_ORDER = "prefix"
ADMISSION_LOOKAHEAD = 64

# a request's tokens and logprobs bitwise the same whatever runs beside it: native weights are so by
# construction, f32 ones take the invariant GEMM (layers/gemm.py, faster than OpenBLAS on 2 cores)
BATCH_INVARIANT = True

WEIGHT_CHOICES = ("auto", "f32", "native", "bf16", "i16")
WEIGHTS = "auto"
WEIGHT_MEMORY_FRACTION = 0.5  # of the machine's RAM: auto's budget for a float32 copy of the weights

# submitting a batch
OUTPUT = "./miro-results"  # where the workers write the part files
JOB_TIMEOUT_S = 3600  # a request waits in the worker's continuous batch, so RQ's 180 s is short
PRIORITIES = (
    "high",
    "normal",
    "low",
)  # a batch's priority, most urgent first (worker/fleet/intake/routing.py: its queues)
PRIORITY = "normal"
# a batch's completion window, as OpenAI's Batch API's: past it, what has not run expires (worker/fleet/lifecycle/expiry.py)
COMPLETION_WINDOW = "24h"

# a worker
FLUSH_ROWS = 256  # a part file once this many rows wait...
FLUSH_SECONDS = 5.0  # ...or once the oldest has waited this long
IDLE_POLL_S = 0.2  # an idle worker looks for a job this often (taking one from several queues cannot block)
HEARTBEAT_SLACK_S = 60  # a job whose heartbeat is this late is abandoned and queued again
SHUTDOWN_GRACE_S = 30.0  # after SIGTERM, for the requests in flight to finish before the rest are requeued
RUN_SHUTDOWN_GRACE_S = 5.0  # the same for `miro run`: the user is waiting, so a few seconds
WAIT_FOR_REDIS_S = 30.0  # how long a worker tries to reach Redis at start-up (fleets start workers first) or mid-run
LAST_TAKE_TTL_S = 86400  # how long a worker's record of the job it last took stays (worker/process/taking.py)

# `miro results` and `miro run` merge and write a batch's results this many rows (of its part files) at a time
# (worker/fleet/output/part_slices.py), so their memory is a slice's, not the batch's
RESULTS_SLICE_ROWS = 50_000
# an embedding batch's rows each carry a vector (1.5 KB at 384 dimensions, held several times over while a slice is
# merged and written), so its slices are this many times smaller (benchmarks/results_memory.py --embed: 200,000
# 384-dimension vectors merge at 462 MB peak RSS in slices of 10,000 rows, 1,165 MB in slices of 50,000)
RESULTS_EMBED_SLICE_DIVISOR = 5
# `miro serve` writes a batch's output and error files, results.parquet and Anthropic's results in slices this many
# times smaller: a long-running server that does so for batch after batch keeps the memory it grew to
# (benchmarks/serve_results_memory.py: 500,000 requests at +84 MiB over idle, against +566 MiB in slices of
# 50,000 rows made Python dicts whole)
RESULTS_SERVER_SLICE_DIVISOR = 5

# once a batch ends its finished and cancelled requests' RQ job keys go (worker/fleet/lifecycle/release.py): this many jobs per
# Lua call, so Redis is never busy long; a batch its ender left half-released is finished by a sweep this much later
RELEASE_CHUNK = 1000
RELEASE_GRACE_S = 30.0
# ...and its record, counters and per-request index (release.py) stay this long after, as OpenAI keeps a batch's
# files 30 days by default: `miro status`, `results` and `--resume` work until then
BATCH_TTL_S = 30 * 86400

# the page's charts (worker/fleet/observe/series.py): each worker appends a point per SERIES_STEP_S to short Redis streams,
# a day of them at most, gone a day after the last
SERIES_STEP_S = 5
SERIES_POINTS = 17280  # a day at 5 s
SERIES_TTL_S = 86400
SERIES_RATE_SPAN_S = 30.0  # a rate from counters spans at least this (they move when part files are written)
SERIES_MAX_POINTS = 360  # the most points one chart is sent (a longer series is thinned evenly)
SERIES_WINDOW_S = 3600  # the fleet charts' span, unless asked for another

# `miro serve`
SERVER_SWEEP_S = 1.0  # how often it expires due batches and files and writes the result files of ended batches
FILE_EXPIRY_RANGE_S = (3600, 2592000)  # expires_after.seconds, as OpenAI's: 1 hour to 30 days

# `miro generate`
GENERATE_MAX_TOKENS = 256

# a batch's requests wait in storage (worker/fleet/intake/spool.py) and are made into RQ jobs a chunk at a time (feed.py),
# so Redis holds what is in flight: enough queued on a batch's queue for every seat of the workers serving it, twice
# over, plus a margin; a feeder writes at most FEED_CHUNKS_PER_CALL chunks per call, so a worker's round stays short
SPOOL_CHUNK = 1000  # requests per stored chunk file, and per job-writing Lua script
# requests per RQ job the feeder writes (a group job, worker/fleet/intake/job_writer.py): RQ's own bookkeeping of a job
# (about 40 Redis commands from taking it to finishing it) is then shared by that many requests
REQUESTS_PER_JOB = 32
FEED_MARGIN = 1000
FEED_SEATS_FACTOR = 2
FEED_CHUNKS_PER_CALL = 4
FEED_BATCHES_PER_CALL = 8
FEED_LOCK_TTL_MS = 30_000
