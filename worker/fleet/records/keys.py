"""Redis key names of miro (DESIGN.md, "Redis"); RQ's own keys stay RQ's."""

PREFIX = "miro"


def batch(batch_id: str) -> str:
    """Hash: the batch record (id, name, status, model, counters, timestamps, output, input file, queue)."""
    return f"{PREFIX}:batch:{batch_id}"


def batches() -> str:
    """Sorted set: every batch id, scored by its creation time (epoch seconds)."""
    return f"{PREFIX}:batches"


def batch_deadlines() -> str:
    """Sorted set: the batches with a completion window that may still expire, scored by their expires_at (epoch
    seconds); a batch leaves it once it has ended (expiry.py)."""
    return f"{PREFIX}:batch-deadlines"


def batch_expiry_lock(batch_id: str) -> str:
    """String with a TTL: held by the one worker or server expiring the batch now (expiry.py)."""
    return f"{PREFIX}:batch:{batch_id}:expiry-lock"


def ended_batches() -> str:
    """Set: ids of batches whose run has just ended (completed, cancelled, expired), added by the count that settled
    them; `miro serve` writes their output and error files and takes them out."""
    return f"{PREFIX}:ended-batches"


def batch_releases() -> str:
    """Sorted set: ended batches whose RQ job keys have not all been deleted yet, scored by when they ended; added
    by the count that settled them, taken out once release.py has deleted them."""
    return f"{PREFIX}:batch-releases"


def batch_jobs(batch_id: str) -> str:
    """Hash: custom id -> RQ job id, for the jobs --resume enqueued and a batch from before requests were stored (a
    fed job is in no index: its stored chunk lists it, and its id follows from its custom id)."""
    return f"{PREFIX}:batch:{batch_id}:jobs"


def batch_invalid(batch_id: str) -> str:
    """Hash: custom id -> JSON {custom_id, line, error} for each line that failed validation (--skip-invalid)."""
    return f"{PREFIX}:batch:{batch_id}:invalid"


def worker(name: str) -> str:
    """Hash with a TTL: a worker's model, host, pid, KV cache use and throughput, refreshed about every second."""
    return f"{PREFIX}:worker:{name}"


def worker_last_take(name: str) -> str:
    """String with a TTL: "{queue key} {job id}" of the job the worker last took off a queue (scripts.TAKE_NEXT_JOB),
    read after a Redis outage in case the reply to that take was lost (worker/process/taking.py)."""
    return f"{PREFIX}:worker:{name}:last-take"


def workers() -> str:
    """Sorted set: the names of workers that published a hash, scored by their last refresh (epoch seconds), so
    readers find the hashes without scanning the keyspace (workers.py)."""
    return f"{PREFIX}:workers"


def worker_series(name: str) -> str:
    """Stream: a worker's points for the page's charts (KV use, running, waiting, tokens/s, requests), one per
    SERIES_STEP_S, entry ids the step's start in ms; capped and with a TTL (series.py)."""
    return f"{PREFIX}:series:worker:{name}"


def batch_series(batch_id: str) -> str:
    """Stream: a batch's counters (requests finished, tokens) for its page's charts, one point per SERIES_STEP_S
    appended by a worker with its requests in flight; capped and with a TTL (series.py)."""
    return f"{PREFIX}:series:batch:{batch_id}"


def series_workers() -> str:
    """Sorted set: the workers with a series, scored by their last point's time (series.py)."""
    return f"{PREFIX}:series:workers"


def batch_counted(batch_id: str) -> str:
    """Set: custom ids already counted as completed or failed, so a request that ran twice counts once."""
    return f"{PREFIX}:batch:{batch_id}:counted"


def batch_cancel_pending(batch_id: str) -> str:
    """List: job ids `miro cancel` took off the queue and has not yet marked canceled."""
    return f"{PREFIX}:batch:{batch_id}:cancel_pending"


def served_models() -> str:
    """Hash: a name requests may ask for -> the model a worker serves it with (`miro worker --served-model-name`);
    kept, so batches can be submitted for it while no such worker is running."""
    return f"{PREFIX}:served-models"


def file(file_id: str) -> str:
    """Hash: an uploaded or produced file of `miro serve` (id, bytes, created_at, filename, purpose, status)."""
    return f"{PREFIX}:file:{file_id}"


def files() -> str:
    """Sorted set: every file id of `miro serve`, scored by its creation time (epoch seconds)."""
    return f"{PREFIX}:files"


def file_deadlines() -> str:
    """Sorted set: the files of `miro serve` that expire (expires_after), scored by their expires_at (epoch seconds)."""
    return f"{PREFIX}:file-deadlines"


def message_batches() -> str:
    """Sorted set: the ids of batches made through `miro serve`'s Anthropic Message Batches API, by creation time."""
    return f"{PREFIX}:message-batches"


def api_batch(batch_id: str) -> str:
    """Hash: what the OpenAI Batch API adds to a batch (for one made through `miro serve`: input file id, endpoint,
    completion window, metadata, validation errors, result-file expiry; for any batch: its output and error file
    ids, once the server has written them)."""
    return f"{PREFIX}:api-batch:{batch_id}"


def feeding() -> str:
    """Sorted set: batches with stored requests still to make into jobs, scored by creation time (feed.py)."""
    return f"{PREFIX}:feeding"


def batch_feed_lock(batch_id: str) -> str:
    """String with a TTL: held by the one worker, server or submitter feeding the batch now (feed.py)."""
    return f"{PREFIX}:batch:{batch_id}:feed-lock"


def batch_all(batch_id: str) -> list[str]:
    """The batch's record and its per-request keys: what an ended batch keeps until its TTL (release.py)."""
    return [
        batch(batch_id),
        batch_jobs(batch_id),
        batch_invalid(batch_id),
        batch_counted(batch_id),
        batch_cancel_pending(batch_id),
    ]
