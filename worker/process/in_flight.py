"""InFlight: a job a BatchWorker has taken and whose engine requests are running, one request for a generation,
one per input for an embedding. The job finishes when the last of them has."""

from __future__ import annotations

from dataclasses import dataclass, field

from rq.job import Job
from rq.queue import Queue

from miro.core.outputs import EmbeddingRequestOutput, RequestOutput
from miro.worker.fleet.payload import JobPayload


@dataclass
class InFlight:
    job: Job
    queue: Queue
    execution: object
    payload: JobPayload
    prompt: str | None  # the prompt as the model sees it (chat messages rendered); None for an embedding
    started: float
    request_ids: list[str]  # its engine requests: the job id, or `{job id}:{i}` per input of an embedding
    outputs: dict[str, RequestOutput | EmbeddingRequestOutput] = field(default_factory=dict)  # the finished ones

    @property
    def seats(self) -> int:
        """The engine requests it holds: what it counts against the engine's max_num_seqs."""
        return len(self.request_ids)

    def take(self, output: RequestOutput | EmbeddingRequestOutput) -> bool:
        """Keep a finished engine request's output; True once every request of the job has finished."""
        self.outputs[output.request_id] = output
        return len(self.outputs) == len(self.request_ids)

    def finished_outputs(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        """The outputs in the order of the job's requests (an embedding's inputs in order)."""
        return [self.outputs[request_id] for request_id in self.request_ids]
