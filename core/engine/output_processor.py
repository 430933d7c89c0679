"""What a new token does to its sequence, and a request's output: detokenisation, stops and lengths, kept apart
from the engine's scheduling as vLLM keeps its output processor apart.

`append_token` records a sampled token (the grammar takes it, the text grows, a stop id, stop string, complete
constraint or length ends the sequence) and says whether the sequence finished; the engine then releases it.
"""

from __future__ import annotations

from miro.core.sampling.constraint import first_line, parsed_json
from miro.core.errors import MiroError
from miro.core.engine.outputs import CompletionOutput, Logprob, RequestOutput, TokenLogprobs
from miro.core.sampling.params import find_stop
from miro.core.engine.sequence import Request, Sequence


def append_token(seq: Sequence, token: int, stop_ids: set[int], max_model_len: int) -> bool:
    """Add `token` to `seq`; True when it ends the sequence (finish_reason and stop_reason set, text flushed).
    A grammar refusing a token its own mask allowed raises MiroError: the request's fault, not the step's."""
    params = seq.params
    seq.output_token_ids.append(token)
    if seq.matcher is not None and not seq.matcher.consume_token(token):
        raise MiroError(
            f"structured output: the grammar refused a token its own mask allowed "
            f"({first_line(seq.matcher.get_error())})."
        )
    if token in stop_ids:
        return _finish(seq, "stop", stop_reason=token)
    before = len(seq.text)
    seq.text += seq.detokenizer.add(token)
    if params.stop and len(seq.text) > before:
        at = find_stop(seq.text, params.stop, before)
        if at is not None:
            seq.stop_reason = next(s for s in params.stop if seq.text.startswith(s, at))
            seq.text = seq.text[:at]
            return _finish(seq, "stop", flush=False)
    if seq.matcher is not None and seq.matcher.is_stopped():  # the constraint is complete: nothing may follow
        return _finish(seq, "stop")
    if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= max_model_len:
        return _finish(seq, "length")
    return False


def _finish(seq: Sequence, reason: str, stop_reason=None, flush: bool = True) -> bool:
    if flush:
        seq.text += seq.detokenizer.flush()
    seq.finish_reason = reason
    if stop_reason is not None:
        seq.stop_reason = stop_reason
    return True


def request_output(request: Request, tokenizer) -> RequestOutput:
    """The request's snapshot: each choice's text, tokens, finish and logprobs so far (spelled with `tokenizer`), and
    a finished JSON-constrained choice's parsed output."""
    choices = [
        CompletionOutput(
            s.index,
            s.text,
            list(s.output_token_ids),
            s.finish_reason,
            s.stop_reason,
            _spelled_logprobs(s, tokenizer) if s.params.logprobs is not None else None,
            parsed_json(s.params.structured_outputs, s.text, s.finish_reason),
        )
        for s in request.seqs
    ]
    return RequestOutput(
        request.request_id,
        request.prompt,
        request.prompt_token_ids,
        choices,
        finished=all(s.finish_reason is not None for s in request.seqs),
        num_cached_tokens=request.seqs[0].num_cached_tokens,
    )


def _spelled_logprobs(seq: Sequence, tokenizer) -> list[TokenLogprobs]:
    """The sequence's logprobs as TokenLogprobs, each token spelled once (a snapshot per step reads them all)."""
    spelled = seq.spelled_logprobs
    for entry in seq.logprobs[len(spelled) :]:
        spelled.append(
            TokenLogprobs(
                **_spell(tokenizer, entry["token_id"], entry["logprob"]),
                top_logprobs=[Logprob(**_spell(tokenizer, t, lp)) for t, lp in entry["top"]],
            )
        )
    return list(spelled)


def _spell(tokenizer, token_id: int, logprob: float) -> dict:
    raw = tokenizer.token_bytes(token_id)
    return {"token_id": token_id, "token": raw.decode("utf-8", errors="replace"), "bytes": raw, "logprob": logprob}
