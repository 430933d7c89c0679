"""RQ's private API that worker/rq_private.py relies on: these fail first, and say what changed, when an RQ
upgrade moves it."""

import inspect

from rq.job import Job
from rq.queue import Queue
from rq.worker.base import BaseWorker

from miro.worker import rq_private


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_private_methods_miro_calls_still_take_what_it_passes():
    assert parameters(BaseWorker._finalize_success)[:5] == ["self", "job", "queue", "execution", "return_value"], \
        "RQ's BaseWorker._finalize_success changed: see worker/rq_private.py finalize_success"
    assert parameters(BaseWorker._finalize_failure)[:5] == ["self", "job", "queue", "execution", "exc_info"], \
        "RQ's BaseWorker._finalize_failure changed: see worker/rq_private.py finalize_failure"
    assert parameters(BaseWorker.handle_exception)[:2] == ["self", "job"], \
        "RQ's BaseWorker.handle_exception changed: BatchWorker.handle_exception overrides it"
    enqueue = parameters(Queue._enqueue_job)
    assert enqueue[:3] == ["self", "job", "pipeline"] and "at_front" in enqueue, \
        "RQ's Queue._enqueue_job changed: see worker/rq_private.py enqueue_job"


def test_a_jobs_exc_info_is_still_the_private_attribute_miro_clears():
    job = Job.__new__(Job)  # no Redis needed to set an attribute
    rq_private.clear_exc_info(job)
    assert job._exc_info == "" and "_exc_info" in inspect.getsource(Job), \
        "RQ's Job no longer keeps _exc_info: see worker/rq_private.py clear_exc_info"
