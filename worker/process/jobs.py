"""What a job's payload means to the engine (the prompt text; the engine requests of a job: one for a
generation, one per input of an embedding), how a finished or failed request is counted, and the RQ job
function `generate`, named `miro.worker.jobs.generate` in every job, embeddings' too (miro.worker re-exports
this module as `jobs`; the rows themselves are fleet/rows.py's).

`generate` serves RQ's own workers (`rq worker -w rq.SimpleWorker`, which keeps one process and so one
resident model): it runs its request (or each request of a group job in turn), writes the rows durably, then moves
the batch counters.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
import time
from typing import TYPE_CHECKING

from miro.core import defaults
from miro.core.errors import RequestError
from miro.core.engine.outputs import EmbeddingRequestOutput, RequestOutput
from miro.worker.fleet.records.payload import JobPayload, is_group, payloads_of
from miro.worker.fleet.intake.routing import model_name
from miro.worker.fleet.output import fingerprint
from miro.worker.fleet.output.fingerprint import OutputStamp
from miro.worker.fleet.output.rows import embedding_rows, error_row, result_rows
from miro.worker.fleet.output.sink import ParquetSink

if TYPE_CHECKING:  # the engine (numba, the kernels) loads only where a request runs, not in submit or status
    from miro.core import Engine

_engines: dict[str, Engine] = {}


def engine_for(model: str) -> Engine:
    """One resident engine per model per process."""
    from miro.core import Engine

    if model not in _engines:
        _engines[model] = Engine.from_model(
            model, max_num_seqs=1, kv_cache_memory=os.environ.get("MIRO_KV_CACHE_MEMORY", defaults.KV_CACHE_MEMORY)
        )
    return _engines[model]


_stamps: dict[str, OutputStamp] = {}


def engine_stamp(engine: Engine, model: str) -> OutputStamp:
    """The model file and settings of a resident engine (fingerprint.py), computed once per model per process."""
    if model not in _stamps:
        _stamps[model] = fingerprint.engine_stamp(engine, model)
    return _stamps[model]


def prompt_text(engine: Engine, payload: JobPayload) -> str:
    """The prompt as the model sees it: chat messages rendered with the model's template."""
    if payload.messages is not None:  # a chat or a Responses request
        return engine.tokenizer.apply_chat_template(payload.messages, add_generation_prompt=True)
    return payload.prompt


def add_requests(engine: Engine, payload: JobPayload, job_id: str, priority: int) -> tuple[str | None, list[str]]:
    """Queue a request's engine requests: its prompt (request id `job_id`: the job's id, or `{job id}/{k}` for
    the k-th request of a group job), or each input of an embedding (request ids `{job_id}:{i}`). Returns the prompt text (None for an embedding) and the request ids; RequestError, in the
    engine's sentence, if the engine refuses one (those already queued are aborted)."""
    refusal = engine.refusal(payload.task)  # before a chat template is rendered (an embedder has none)
    if refusal:
        raise RequestError(refusal)
    if payload.kind != "embedding":
        prompt = prompt_text(engine, payload)
        engine.add_request(prompt, payload.sampling_params(), request_id=job_id, priority=priority)
        return prompt, [job_id]
    params, added = payload.pooling_params(), []
    for index, text in enumerate(payload.inputs):
        try:
            added.append(engine.add_request(text, params, request_id=f"{job_id}:{index}", priority=priority))
        except RequestError as err:
            for request_id in added:
                engine.abort(request_id)
            raise RequestError(_of_input(payload, index, str(err))) from None
    return None, added


def _of_input(payload: JobPayload, index: int, error: str) -> str:
    """An input's error as its request's: naming the input when the request has several."""
    return f"input {index}: {error}" if len(payload.inputs) > 1 else error


@dataclass(frozen=True)
class TokenCounts:
    """A finished request's tokens, read from the engine's outputs: what its batch's counters add."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens the prefix cache served
    completion_tokens: int

    @classmethod
    def of(cls, payload: JobPayload, outputs: list) -> TokenCounts:
        if payload.kind == "embedding":
            return cls(sum(out.num_tokens for out in outputs), 0, 0)
        [output] = outputs
        return cls(
            len(output.prompt_token_ids),
            output.num_cached_tokens,
            sum(len(choice.token_ids) for choice in output.outputs),
        )


def summary(payload: JobPayload, outputs: list) -> dict:
    """The small result a finished job keeps in RQ: custom id, finish reason, token counts."""
    counts = asdict(TokenCounts.of(payload, outputs))
    if payload.kind == "embedding":
        return {"custom_id": payload.custom_id, "finish_reason": None, "inputs": len(outputs), **counts}
    return {"custom_id": payload.custom_id, "finish_reason": outputs[0].finish_reason, **counts}


def count_finished(conn, payload: JobPayload, counts: TokenCounts) -> None:
    """Count a request whose rows are written (`conn` may be a pipeline: many requests, one round trip)."""
    from miro.worker.fleet.records import batches

    batches.queue_count_finished(
        conn,
        payload.batch_id,
        payload.custom_id,
        prompt_tokens=counts.prompt_tokens,
        cached_tokens=counts.cached_tokens,
        completion_tokens=counts.completion_tokens,
    )


def record_failure(
    conn,
    sink: ParquetSink,
    job_id: str,
    payload: JobPayload,
    error: str,
    *,
    worker: str,
    started: float,
    prompt: str | None = None,
    model: str | None = None,
) -> None:
    """A request that cannot be served: its error row is written and it is counted failed. Its job must not be
    retried (the retries are for dead workers; the request itself would fail again): the caller sees to that."""
    from miro.worker.fleet.records import batches

    sink.add(
        error_row(
            payload,
            error,
            job_id=job_id,
            worker=worker,
            prompt=prompt,
            started=started,
            finished=time.time(),
            model=model,
        )
    )
    sink.flush()
    batches.count_failed(conn, payload.batch_id, payload.custom_id)


def record_group_failure(
    conn,
    sink: ParquetSink,
    group_job_id: str,
    payload: JobPayload,
    error: str,
    *,
    worker: str,
    started: float,
    prompt: str | None = None,
    model: str | None = None,
) -> None:
    """A request of a group job that cannot be served: first a FAILED job of its own, as RQ leaves a failed
    one-request job, so that `miro retry` and `--resume` run it again on its own; then its error row and count
    (record_failure). The group goes on with its other requests."""
    from rq.job import Job

    from miro.worker.fleet.records import batches
    from miro.worker.fleet.intake.job_writer import JobWriter

    own = batches.job_id(payload.batch_id, payload.custom_id)
    if not conn.exists(Job.key_for(own)):  # one already there: this failure was recorded, or a resume queued it
        writer = JobWriter.for_batch(conn, batches.get_batch(conn, payload.batch_id))
        with conn.pipeline() as pipe:
            writer.record_failed(payload, error, pipe)
            pipe.execute()
    record_failure(conn, sink, group_job_id, payload, error, worker=worker, started=started, prompt=prompt, model=model)


GAVE_UP = (
    "quarantined: the worker running this request stopped (killed, out of memory, or its machine lost) each "
    "of the times it ran, so it is not run again (`miro retry` runs it once more)"
)


def is_suspect(job) -> bool:
    """A job RQ queued again after the worker running it died: one of its requests may be what killed it."""
    from miro.worker.fleet.intake.job_writer import ABANDONED_RETRIES

    return job.retries_left is not None and job.retries_left < ABANDONED_RETRIES


def split_suspect_group(conn, job, queue, payloads: list[JobPayload]) -> int:
    """A suspect group job's requests not yet counted, each queued as a one-request job of its own (with the group's
    retries left, a job that exists already left alone), so that a request that kills workers is quarantined alone
    and the rest of its group runs. Returns how many it queued; the caller finishes the group."""
    from rq.job import Job
    from rq.utils import now as rq_now

    from miro.worker.fleet.records import batches, rq_private
    from miro.worker.fleet.intake.job_writer import JobWriter

    writer = JobWriter.for_batch(conn, batches.get_batch(conn, payloads[0].batch_id))
    queued = 0
    with conn.pipeline() as pipe:
        for payload in payloads:
            own = writer.job(payload, rq_now())
            if conn.exists(Job.key_for(own.id)):  # a resume or an earlier split queued it
                continue
            own.retries_left = job.retries_left
            rq_private.enqueue_job(queue, own, pipe)
            queued += 1
        pipe.execute()
    return queued


def record_given_up(conn, sink: ParquetSink, job, queue, custom_ids: list[str], *, worker: str) -> None:
    """The requests `custom_ids` of a job RQ failed itself, after its workers died too often, that no batch counted:
    each gets its GAVE_UP error row and is counted failed. A group's each get a failed job of their own, and the
    group's job goes."""
    from rq.registry import FailedJobRegistry

    uncounted = [p for p in payloads_of(job.kwargs) if p.custom_id in custom_ids]
    if not is_group(job.meta):
        record_failure(conn, sink, job.id, uncounted[0], GAVE_UP, worker=worker, started=time.time())
        return
    for payload in uncounted:
        record_group_failure(conn, sink, job.id, payload, GAVE_UP, worker=worker, started=time.time())
    forget_expired_executions(conn, job.id)
    FailedJobRegistry(queue=queue).remove(job, delete_job=True)


def forget_expired_executions(conn, job_id: str) -> None:
    """Drop from a job's execution registry the executions whose hash has expired (its dead workers' runs: the
    registry keeps an entry 60 s past its hash), for RQ's Job.delete() reads every execution listed and raises
    "Execution ... not found" on one that is gone."""
    from rq.executions import Execution, ExecutionRegistry

    registry = ExecutionRegistry(job_id=job_id, connection=conn)
    for execution_id in registry.get_execution_ids():
        execution = Execution(id=execution_id, job_id=job_id, connection=conn)
        if not conn.exists(execution.key):
            with conn.pipeline() as pipe:
                registry.remove(execution, pipeline=pipe)
                pipe.execute()


def output_error(payload: JobPayload, outputs: list) -> str | None:
    """The error of a request the engine ended with one (its own fault in a step; an embedding's first failed
    input, named when it has several); None if none did."""
    for index, output in enumerate(outputs):
        if output.error:
            return _of_input(payload, index, output.error) if payload.kind == "embedding" else output.error
    return None


def not_counted(conn, payloads: list[JobPayload]) -> list[JobPayload]:
    """The requests of a group job its batch has not counted: run again after its worker died, a group skips the
    ones that worker finished (all of them once the batch has ended: counted.py)."""
    from miro.worker.fleet.lifecycle.counted import were_counted

    counted = were_counted(conn, payloads[0].batch_id, [p.custom_id for p in payloads])
    return [p for p, was_counted in zip(payloads, counted) if not was_counted]


def run_request(engine: Engine, payload: JobPayload) -> tuple[str | None, list[RequestOutput | EmbeddingRequestOutput]]:
    """Run one request to completion on an otherwise idle engine (RequestError if it is refused): its prompt
    (None for an embedding) and its outputs (one, or one per input of an embedding, in input order)."""
    job_id = "job"
    try:
        prompt, request_ids = add_requests(engine, payload, job_id, priority=0)
        done: dict[str, RequestOutput | EmbeddingRequestOutput] = {}
        while len(done) < len(request_ids):
            done.update(
                (out.request_id, out) for out in engine.step() if out.finished and out.request_id in request_ids
            )
    except BaseException:  # RQ's timeout, a stop, or an engine error: the next job must find the engine empty
        engine.reset()
        raise
    outputs = [done[request_id] for request_id in request_ids]
    failed = next(((index, out.error) for index, out in enumerate(outputs) if out.error), None)
    if failed is not None:
        raise RequestError(_of_input(payload, *failed) if payload.kind == "embedding" else failed[1])
    return prompt, outputs


def job_rows(
    payload: JobPayload,
    prompt: str | None,
    outputs: list,
    *,
    job_id: str,
    worker: str,
    model: str,
    started: float,
    finished: float,
    stamp: OutputStamp | None = None,
) -> list[dict]:
    """A finished job's rows: one per choice of a generation, one per input of an embedding; `stamp` the engine's
    (fingerprint.py), which gives each row its request_hash and model_sha256."""
    if payload.kind == "embedding":
        return embedding_rows(
            payload, outputs, job_id=job_id, worker=worker, model=model, started=started, finished=finished, stamp=stamp
        )
    [output] = outputs
    return result_rows(
        payload,
        output,
        job_id=job_id,
        worker=worker,
        model=model,
        prompt=prompt,
        started=started,
        finished=finished,
        stamp=stamp,
    )


def generate(**kwargs) -> dict:
    """The RQ job: run its request (each request of a group job not yet counted), write the rows to the batch's
    output, count them; returns a small summary."""
    from rq import get_current_job

    from miro.worker.fleet.records import batches

    job = get_current_job()
    conn = job.connection
    payloads = payloads_of(kwargs)
    batch = batches.get_batch(conn, payloads[0].batch_id)
    worker = job.worker_name or f"{os.uname().nodename}.{os.getpid()}"
    sink = ParquetSink(batch.output, worker)
    engine = engine_for(payloads[0].model)
    if not is_group(job.meta):
        return _generate_one(conn, sink, job, engine, payloads[0], worker)
    results = []
    for payload in not_counted(conn, payloads):
        started = time.time()
        try:
            prompt, outputs = run_request(engine, payload)
        except Exception as err:  # the request's own problem: its failed job, error row and count; the group goes on
            record_group_failure(conn, sink, job.id, payload, str(err), worker=worker, started=started)
            continue
        rows = job_rows(
            payload,
            prompt,
            outputs,
            job_id=job.id,
            worker=worker,
            model=model_name(payload.model),
            started=started,
            finished=time.time(),
            stamp=engine_stamp(engine, payload.model),
        )
        for row in rows:
            sink.add(row)
        results.append((payload, TokenCounts.of(payload, outputs)))
    sink.flush()  # durable before the requests are counted
    with conn.pipeline(transaction=False) as pipe:
        for payload, counts in results:
            count_finished(pipe, payload, counts)
        pipe.execute()
    return {"requests": len(payloads), "completed": len(results)}


def _generate_one(conn, sink: ParquetSink, job, engine: Engine, payload: JobPayload, worker: str) -> dict:
    started = time.time()
    try:
        prompt, outputs = run_request(engine, payload)
    except Exception as err:  # the request's own problem: record it as its failed row, then fail the job
        record_failure(conn, sink, job.id, payload, str(err), worker=worker, started=started)
        job.retries_left = 0
        raise
    rows = job_rows(
        payload,
        prompt,
        outputs,
        job_id=job.id,
        worker=worker,
        model=model_name(payload.model),
        started=started,
        finished=time.time(),
        stamp=engine_stamp(engine, payload.model),
    )
    for row in rows:
        sink.add(row)
    sink.flush()  # durable before RQ hears the job finished
    count_finished(conn, payload, TokenCounts.of(payload, outputs))
    return summary(payload, outputs)
