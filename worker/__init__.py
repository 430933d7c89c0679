"""miro.worker: the RQ side, in three folders by role (DESIGN.md, "worker/").

- `fleet/`: the control-plane library the CLI, the HTTP server and the worker process call (datasets and
  their lines, batch and worker records, submit, cancel and retry, status figures, results, storage, keys,
  Lua scripts, RQ's private parts). It imports neither of the others.
- `process/`: the RQ worker process (`BatchWorker`, and the one-request job function). It imports the library.
- `api/`: `miro serve`'s HTTP server. It imports the library only.

Two names here are public entry points, re-exported lazily so that `miro-submit` does not load the engine
and numba: `BatchWorker` (`rq worker -w miro.worker.BatchWorker`) and `jobs`, so that the job function name
every queued job carries, `miro.worker.jobs.generate` (submit's JOB_FUNCTION), finds
`miro.worker.process.jobs.generate` through RQ's import_attribute.
"""


def __getattr__(name):
    if name == "BatchWorker":
        from miro.worker.process.batch_worker import BatchWorker

        return BatchWorker
    if name == "jobs":
        from miro.worker.process import jobs

        return jobs
    raise AttributeError(f"module 'miro.worker' has no attribute {name!r}")
