"""miro.worker.process: the RQ worker process (`BatchWorker`; `jobs.generate`, the one-request job function for
RQ's own workers). It imports miro.core and the library, miro.worker.fleet; nothing imports it but
miro.worker's lazy re-exports and the commands that start a worker."""
