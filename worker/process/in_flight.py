"""InFlight: a job a BatchWorker has taken, and RequestRun: one of its requests in the engine.

A one-request job (what `--resume` and `miro retry` queue) holds one request; a group job (what the feeder writes)
up to REQUESTS_PER_JOB. A request runs as one engine request for a generation, one per input for an embedding.
A request is settled once it is counted (its rows written, or it failed or was cancelled); the job finishes in RQ
when all of its requests are settled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rq.job import Job
from rq.queue import Queue

from miro.core.engine.outputs import EmbeddingRequestOutput, RequestOutput
from miro.worker.fleet.records.payload import JobPayload


@dataclass(eq=False)  # one per job or request: compared by identity
class RequestRun:
    payload: JobPayload
    prompt: str | None  # the prompt as the model sees it (chat messages rendered); None for an embedding
    started: float
    request_ids: list[str]  # its engine requests: `{base}`, or `{base}:{i}` per input of an embedding
    outputs: dict[str, RequestOutput | EmbeddingRequestOutput] = field(default_factory=dict)  # the finished ones

    def take(self, output: RequestOutput | EmbeddingRequestOutput) -> bool:
        """Keep a finished engine request's output; True once every engine request of the request has finished."""
        self.outputs[output.request_id] = output
        return len(self.outputs) == len(self.request_ids)

    def finished_outputs(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        """The outputs in the order of its engine requests (an embedding's inputs in order)."""
        return [self.outputs[request_id] for request_id in self.request_ids]


@dataclass(eq=False)  # one per job or request: compared by identity
class InFlight:
    job: Job
    queue: Queue
    execution: object
    batch_id: str
    priority: str
    group: bool  # a group job: a request of it that fails gets a failed job of its own, and the group goes on
    running: dict[str, RequestRun] = field(default_factory=dict)  # custom id -> the request, while in the engine
    unsettled: set[str] = field(default_factory=set)  # custom ids not yet counted: running, or rows not yet written
    ended: bool = False  # failed, cancelled or put back on the queue: RQ hears no more of it from this worker

    @property
    def seats(self) -> int:
        """The engine requests it holds: what it counts against the engine's max_num_seqs."""
        return sum(len(run.request_ids) for run in self.running.values())

    @property
    def settled(self) -> bool:
        """Every request is counted: the job may finish in RQ."""
        return not self.running and not self.unsettled
