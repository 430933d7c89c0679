"""miro.worker: the RQ side (dataset validation, batch records, submission, the BatchWorker, Parquet sink)."""


def __getattr__(name):
    # `rq worker -w miro.worker.BatchWorker` finds the class here; importing it lazily keeps
    # `miro-submit` from loading the engine and numba.
    if name == "BatchWorker":
        from .batch_worker import BatchWorker

        return BatchWorker
    raise AttributeError(f"module 'miro.worker' has no attribute {name!r}")
