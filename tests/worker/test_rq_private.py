"""RQ's private API that worker/fleet/records/rq_private.py relies on: these fail first, and say what changed, when an RQ
upgrade moves it."""

import inspect

from rq.job import Job
from rq.queue import Queue
from rq.worker.base import BaseWorker

from miro.worker.fleet.records import rq_private


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_private_methods_miro_calls_still_take_what_it_passes():
    assert parameters(BaseWorker._finalize_success)[:5] == ["self", "job", "queue", "execution", "return_value"], (
        "RQ's BaseWorker._finalize_success changed: see worker/fleet/records/rq_private.py finalize_success"
    )
    assert parameters(BaseWorker._finalize_failure)[:5] == ["self", "job", "queue", "execution", "exc_info"], (
        "RQ's BaseWorker._finalize_failure changed: see worker/fleet/records/rq_private.py finalize_failure"
    )
    assert parameters(BaseWorker.handle_exception)[:2] == ["self", "job"], (
        "RQ's BaseWorker.handle_exception changed: BatchWorker.handle_exception overrides it"
    )
    enqueue = parameters(Queue._enqueue_job)
    assert enqueue[:3] == ["self", "job", "pipeline"] and "at_front" in enqueue, (
        "RQ's Queue._enqueue_job changed: see worker/fleet/records/rq_private.py enqueue_job"
    )


def test_a_jobs_exc_info_is_still_the_private_attribute_miro_clears():
    job = Job.__new__(Job)  # no Redis needed to set an attribute
    rq_private.clear_exc_info(job)
    assert job._exc_info == "" and "_exc_info" in inspect.getsource(Job), (
        "RQ's Job no longer keeps _exc_info: see worker/fleet/records/rq_private.py clear_exc_info"
    )


def test_a_workers_queue_order_is_still_kept_in_ordered_queues(redis_url):
    import redis

    conn = redis.Redis.from_url(redis_url)
    first, second = Queue("order-a", connection=conn), Queue("order-b", connection=conn)
    worker = BaseWorker([first], connection=conn)
    assert worker._ordered_queues == worker.queues, (
        "RQ's BaseWorker no longer keeps _ordered_queues beside queues: see worker/fleet/records/rq_private.py set_queues"
    )
    rq_private.set_queues(worker, [second, first])
    assert worker.queues == worker._ordered_queues == [second, first]


def test_rqs_bootstrap_installs_no_signal_handlers(redis_url, rq_command_poll):
    """BatchWorker.work installs its own after bootstrap() (none at all in `miro run`, whose Interruption
    handles the signals): RQ's bootstrap must not put RQ's back."""
    import signal

    import redis

    conn = redis.Redis.from_url(redis_url)
    worker = BaseWorker([Queue("bootstrap", connection=conn)], connection=conn)

    def ours(signum, frame):
        pass

    previous = {signum: signal.signal(signum, ours) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.bootstrap()
        assert signal.getsignal(signal.SIGINT) is ours and signal.getsignal(signal.SIGTERM) is ours, (
            "RQ's BaseWorker.bootstrap now installs signal handlers: see BatchWorker.install_stop_handlers"
        )
    finally:
        worker.teardown()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_taken_job_waits_in_the_intermediate_queue_and_requeue_taken_puts_it_back(redis_url):
    """`miro run --resume` (control.requeue_abandoned) finds the jobs a killed run had taken, and not started,
    on the queue's intermediate list, where RQ's dequeue and miro's TAKE_NEXT_JOB move them."""
    import redis
    from rq.serializers import JSONSerializer

    conn = redis.Redis.from_url(redis_url)
    queue = Queue("taken", connection=conn, serializer=JSONSerializer)
    for job_id in ("first", "second"):
        queue.enqueue("miro.worker.jobs.generate", job_id=job_id)
    conn.lmove(queue.key, queue.intermediate_queue.key, "LEFT", "RIGHT")  # what taking a job does
    assert queue.job_ids == ["second"] and queue.intermediate_queue.get_job_ids() == ["first"], (
        "RQ's intermediate queue moved: see worker/fleet/records/rq_private.py requeue_taken"
    )
    rq_private.requeue_taken(queue)
    assert queue.job_ids == ["first", "second"] and queue.intermediate_queue.get_job_ids() == []
