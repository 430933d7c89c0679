"""The result rows, in one place: the Parquet schema, the rows a request becomes (one per choice of a
generation, one per input of an embedding, or one error row; an invalid line's row), and their OpenAI Batch
output shape.

Part files hold every column; the merged results of a batch keep those of its task (TASK_COLUMNS): an
embedding batch has no choices, outputs or finish reasons, a generation batch no vectors.

Workers build rows with result_rows / error_row, the sink writes them (refusing a key the schema lacks),
`miro results` and `miro run` merge them and shape them as OpenAI's output lines with openai_line.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from miro.worker.fleet.records.payload import ResponseEcho
from miro.worker.fleet.output.response_object import RESPONSE_ECHO, response_object

if TYPE_CHECKING:
    from miro.core.engine.outputs import EmbeddingRequestOutput, RequestOutput
    from miro.worker.fleet.output.fingerprint import OutputStamp

    from miro.worker.fleet.records.payload import JobPayload

_TOP_LOGPROB = pa.struct(
    [("token_id", pa.int32()), ("token", pa.string()), ("bytes", pa.binary()), ("logprob", pa.float64())]
)
# one entry per generated token, when the request asked for logprobs: the chosen token and its top alternatives
LOGPROBS = pa.list_(
    pa.struct(
        [
            ("token_id", pa.int32()),
            ("token", pa.string()),
            ("bytes", pa.binary()),
            ("logprob", pa.float64()),
            ("top_logprobs", pa.list_(_TOP_LOGPROB)),
        ]
    )
)

SCHEMA = pa.schema(
    [
        ("batch_id", pa.string()),
        ("custom_id", pa.string()),
        ("line", pa.int32()),  # the request's line in the input file: results come back in this order
        ("choice_index", pa.int32()),  # which of the request's n choices
        (
            "input_index",
            pa.int32(),
        ),  # an embedding request's input (the index of OpenAI's data[]); null: the whole line
        ("kind", pa.string()),  # "chat", "completion", "response" or "embedding": the shape of the OpenAI output line
        ("job_id", pa.string()),
        ("model", pa.string()),  # the model that ran the request
        ("requested_model", pa.string()),  # the model the request asked for (an OpenAI body's `model`, or --model)
        ("prompt", pa.string()),  # an embedding's input text (null for token ids)
        ("output", pa.string()),
        # the merged results of a batch whose vectors have one size make this fixed_size_list<float32>[size]
        ("embedding", pa.list_(pa.float32())),
        ("encoding_format", pa.string()),  # "float" or "base64": how the OpenAI output line gives the embedding
        # a JSON-constrained output that stopped, parsed, as compact JSON text; null for anything else, and for one
        # cut short by max_tokens (finish_reason "length"), which may not parse
        ("parsed", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("cached_tokens", pa.int32()),  # prompt tokens served from the prefix cache
        ("completion_tokens", pa.int32()),
        ("output_token_ids", pa.list_(pa.int32())),
        ("logprobs", LOGPROBS),  # null unless the request asked for logprobs
        ("error", pa.string()),
        # OpenAI's error code of a failed request: request_failed, or batch_expired for one its batch's window cut off
        ("error_code", pa.string()),
        ("worker", pa.string()),
        ("started_at", pa.timestamp("ms", tz="UTC")),
        ("finished_at", pa.timestamp("ms", tz="UTC")),
        ("latency_s", pa.float64()),
        # the request's options, JSON: SamplingParams' (PoolingParams' for an embedding; a Responses request's also its
        # instructions, metadata and text format under "response")
        ("sampling", pa.string()),
        # what decides a successful row's output (fingerprint.py): the hash of its request, model file and engine
        # settings, and the model file's sha256; `--reuse` takes an earlier row of the same hash instead of running it
        ("request_hash", pa.string()),
        ("model_sha256", pa.string()),
        ("reused_from", pa.string()),  # a reused row: the batch that ran it (null: this batch ran it)
        ("extra", pa.string()),  # a simple line's own fields, JSON; the merged results spread them into columns
    ]
)

# the columns that mean something for one task only: the merged results of a batch drop the other task's
TASK_COLUMNS = {
    "generate": (
        "choice_index",
        "output",
        "parsed",
        "finish_reason",
        "cached_tokens",
        "completion_tokens",
        "output_token_ids",
        "logprobs",
    ),
    "embed": ("input_index", "embedding", "encoding_format"),
}


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)


def _base_row(
    payload: JobPayload,
    job_id: str,
    worker: str,
    model: str | None,
    prompt: str | None,
    started: float,
    finished: float,
    stamp: OutputStamp | None = None,
) -> dict:
    """`model` is the model that ran the request (None if none did); `requested_model` what the line asked for;
    `stamp` the model file and engine settings that made a successful row (its request_hash, model_sha256)."""
    return dict(
        request_hash=stamp.request_hash(payload) if stamp is not None else None,
        model_sha256=stamp.model_sha256 if stamp is not None else None,
        batch_id=payload.batch_id,
        custom_id=payload.custom_id,
        line=payload.line,
        kind=payload.kind,
        job_id=job_id,
        model=model,
        requested_model=payload.requested_model or payload.model,
        prompt=prompt,
        worker=worker,
        started_at=_utc(started),
        finished_at=_utc(finished),
        latency_s=finished - started,
        sampling=json.dumps(_options(payload), sort_keys=True),
        extra=json.dumps(payload.extra, ensure_ascii=False) if payload.extra else None,
    )


def _options(payload: JobPayload) -> dict:
    """The `sampling` column: SamplingParams' keyword arguments (PoolingParams' for an embedding); a Responses
    request's also hold, under "response", what its Response object gives back (instructions, metadata, text
    format), so its output line can be written from its row alone."""
    if payload.kind == "embedding":
        return payload.pooling
    if payload.kind == "response":
        return {**payload.sampling, RESPONSE_ECHO: asdict(payload.response or ResponseEcho())}
    return payload.sampling


def result_rows(
    payload: JobPayload,
    output: RequestOutput,
    *,
    job_id: str,
    worker: str,
    model: str,
    prompt: str,
    started: float,
    finished: float,
    stamp: OutputStamp | None = None,
) -> list[dict]:
    """One row per choice of a finished request, every field read from the engine's typed output."""
    return [
        {
            **_base_row(payload, job_id, worker, model, prompt, started, finished, stamp),
            "choice_index": choice.index,
            "output": choice.text,
            "parsed": choice.parsed,
            "finish_reason": choice.finish_reason,
            "prompt_tokens": len(output.prompt_token_ids),
            "cached_tokens": output.num_cached_tokens,
            "completion_tokens": len(choice.token_ids),
            "output_token_ids": choice.token_ids,
            "error": None,
            "logprobs": None if choice.logprobs is None else [asdict(entry) for entry in choice.logprobs],
        }
        for choice in output.outputs
    ]


def embedding_rows(
    payload: JobPayload,
    outputs: list[EmbeddingRequestOutput],
    *,
    job_id: str,
    worker: str,
    model: str,
    started: float,
    finished: float,
    stamp: OutputStamp | None = None,
) -> list[dict]:
    """One row per input of a finished embedding request (outputs in input order)."""
    return [
        {
            **_base_row(
                payload, job_id, worker, model, text if isinstance(text, str) else None, started, finished, stamp
            ),
            "choice_index": 0,
            "input_index": index,
            "embedding": output.embedding.tolist(),
            "encoding_format": payload.encoding_format or "float",
            "prompt_tokens": output.num_tokens,
            "error": None,
        }
        for index, (text, output) in enumerate(zip(payload.inputs, outputs))
    ]


def error_row(
    payload: JobPayload,
    error: str,
    *,
    job_id: str,
    worker: str,
    prompt: str | None,
    started: float,
    finished: float,
    model: str | None = None,
) -> dict:
    """A request that failed as a whole: one row (an embedding's with no input index: it is the line's)."""
    return {
        **_base_row(payload, job_id, worker, model, prompt, started, finished),
        "choice_index": 0,
        "error": error,
        "encoding_format": payload.encoding_format,
    }


EXPIRED_ERROR = "This request could not be executed before the completion window expired."
CANCELLED_ERROR = "This request was cancelled before it ran."
NEVER_RAN_ERRORS = {"batch_expired": EXPIRED_ERROR, "batch_cancelled": CANCELLED_ERROR}


def expired_rows(
    batch_id: str, job_ids: dict[str, str], lines: dict[str, int] | None = None, code: str = "batch_expired"
) -> pa.Table:
    """Requests an expired batch never ran (custom id -> job id), as failed rows with OpenAI's batch_expired code
    (or `code` batch_cancelled: a cancelled batch's, for Anthropic's results), at their line if `lines` has it (a
    batch from before its requests were stored has none: the results list those after the others)."""
    lines = lines or {}
    error = NEVER_RAN_ERRORS[code]
    rows = [
        {
            "batch_id": batch_id,
            "custom_id": cid,
            "job_id": jid,
            "line": lines.get(cid),
            "choice_index": 0,
            "error": error,
            "error_code": code,
        }
        for cid, jid in job_ids.items()
    ]
    return pa.Table.from_pylist(rows, SCHEMA) if rows else SCHEMA.empty_table()


def invalid_line_rows(batch_id: str, records: dict[str, dict]) -> pa.Table:
    """Lines that failed validation (`--skip-invalid`), as failed rows of the batch."""
    rows = [
        {"batch_id": batch_id, "custom_id": cid, "line": rec.get("line"), "choice_index": 0, "error": rec["error"]}
        for cid, rec in records.items()
    ]
    return pa.Table.from_pylist(rows, SCHEMA) if rows else SCHEMA.empty_table()


def _chat_logprobs(entries: list[dict] | None) -> dict | None:
    """OpenAI's chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    if entries is None:
        return None

    def token(e: dict) -> dict:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["bytes"])}

    return {"content": [{**token(e), "top_logprobs": [token(t) for t in e["top_logprobs"]]} for e in entries]}


def _completion_logprobs(entries: list[dict] | None) -> dict | None:
    """OpenAI's legacy completions `logprobs`: parallel lists, top alternatives as {token: logprob}, and each
    token's character offset in the completion text."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def _embedding_body(rows: list[dict]) -> dict:
    """OpenAI's CreateEmbeddingResponse: a vector per input, as floats or (base64) its little-endian float32
    bytes in base64, as OpenAI encodes them."""
    rows = sorted(rows, key=lambda r: r["input_index"])
    tokens = sum(r["prompt_tokens"] or 0 for r in rows)

    def encoded(vector: list[float]):
        if rows[0]["encoding_format"] == "base64":
            return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        return vector

    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": r["input_index"], "embedding": encoded(r["embedding"])} for r in rows
        ],
        "model": rows[0]["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _response_body(rows: list[dict]) -> dict:
    first = rows[0]
    created = int(first["finished_at"].timestamp()) if first["finished_at"] else 0
    if first["kind"] == "chat":
        choices = [
            {
                "index": r["choice_index"],
                "message": {"role": "assistant", "content": r["output"]},
                "logprobs": _chat_logprobs(r["logprobs"]),
                "finish_reason": r["finish_reason"],
            }
            for r in rows
        ]
        obj = "chat.completion"
    else:
        choices = [
            {
                "index": r["choice_index"],
                "text": r["output"],
                "logprobs": _completion_logprobs(r["logprobs"]),
                "finish_reason": r["finish_reason"],
            }
            for r in rows
        ]
        obj = "text_completion"
    completion_tokens = sum(r["completion_tokens"] or 0 for r in rows)
    return {
        "id": f"{'chatcmpl' if first['kind'] == 'chat' else 'cmpl'}-{first['job_id']}",
        "object": obj,
        "created": created,
        "model": first["model"],
        "choices": choices,
        "usage": {
            "prompt_tokens": first["prompt_tokens"] or 0,
            "completion_tokens": completion_tokens,
            "total_tokens": (first["prompt_tokens"] or 0) + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": first["cached_tokens"] or 0},
        },
    }


def openai_line(rows: list[dict]) -> dict:
    """One request's merged rows (its choices, or its inputs) as an OpenAI Batch output line: a response, or an
    error."""
    # an invalid line never became a job: its id names its line instead
    request_id = rows[0]["job_id"] or f"line-{rows[0]['line']}-invalid"
    line = {"id": f"batch_req_{request_id}", "custom_id": rows[0]["custom_id"]}
    error = next((r["error"] for r in rows if r["error"]), None)
    if error:
        code = next((r.get("error_code") for r in rows if r.get("error_code")), None) or "request_failed"
        return line | {"response": None, "error": {"code": code, "message": error}}
    if rows[0]["kind"] == "embedding":
        body = _embedding_body(rows)
    elif rows[0]["kind"] == "response":
        logprobs = _chat_logprobs(rows[0]["logprobs"])
        body = response_object(rows[0], logprobs["content"] if logprobs else None)
    else:
        body = _response_body(sorted(rows, key=lambda r: r["choice_index"]))
    return line | {"response": {"status_code": 200, "request_id": rows[0]["job_id"], "body": body}, "error": None}
