"""vLLM's offline API over miro's Engine: `from miro import LLM, SamplingParams`.

    llm = LLM("smollm2-135m")                      # a miro alias or a .gguf path; vLLM's option names
    outputs = llm.generate(prompts, SamplingParams(temperature=0.8, top_p=0.95))
    outputs[0].outputs[0].text                    # vLLM's RequestOutput / CompletionOutput shapes
    llm.chat(conversation) ; LLM("all-minilm-l6-v2").embed(texts)[0].outputs.embedding

The names, signatures and output shapes are vLLM's (vllm.LLM, vllm.SamplingParams, vllm.outputs), for what
miro does. An option or a field miro does not have, or a value it cannot honour (dtype="float16",
tensor_parallel_size=2, quantization="awq", logit_bias=...), is refused with a ValueError in one sentence,
never ignored. docs/vllm-api.md lists what maps to what.

This module is the LLM class and the prompt and chat helpers it uses. Its options are mapped to EngineConfig's
by llm_options.py; the request types are llm_params.py's, the result types llm_outputs.py's and get_tokenizer()'s
tokenizer llm_tokenizer.py's, each importable from here too (`from miro.core.llm import SamplingParams`).
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from typing import Any

from miro.core import EngineConfig
from miro.core import llm_options
from miro.core.errors import LLMError, MiroError
from miro.core.llm_outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingRequestOutput,
    RequestOutput,
)
from miro.core.llm_params import (
    GuidedDecodingParams,
    SamplingParams,
    StructuredOutputsParams,
    TextPrompt,
    TokensPrompt,
)
from miro.core.llm_tokenizer import LLMTokenizer
from miro.core.sampling.params import SamplingParams as _EngineSamplingParams


class LLM:
    """vLLM's offline LLM over one miro Engine (`self.engine`)."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: Any = "auto",
        quantization: str | None = None,
        seed: int | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        task: str = "auto",
        runner: str = "auto",
        **options,
    ):
        from miro.core import Engine

        config: dict[str, Any] = {}
        llm_options.check_loading(
            model, tokenizer, tokenizer_mode, skip_tokenizer_init, tensor_parallel_size, quantization
        )
        config["weights"] = llm_options.weights_for(dtype, options)
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise LLMError(f"seed must be a non-negative integer, got {seed!r}.")
        wanted_task = llm_options.task_asked(task, runner, options.pop("convert", "auto"))
        config.update(max_model_len=max_model_len, max_num_seqs=max_num_seqs)
        config.update(llm_options.engine_options(options))
        config = {name: value for name, value in config.items() if value is not None}
        try:
            self.engine = Engine.from_model(
                model, log=lambda message: print(message, file=sys.stderr), config=EngineConfig.of(config)
            )
        except MiroError as err:
            raise LLMError(str(err)) from None
        if wanted_task is not None:
            refusal = self.engine.refusal(wanted_task)
            if refusal:
                raise LLMError(refusal)
        self.model = str(model)
        self.seed = seed
        # LLM(seed=s): requests without a seed of their own get one from this stream, so a script's outputs are
        # the same from run to run (vLLM seeds its sampler once; miro seeds each request)
        self._seeds = random.Random(seed) if seed is not None else None

    # -- requests ---------------------------------------------------------------------------------------

    def get_tokenizer(self) -> LLMTokenizer:
        return LLMTokenizer(self.engine.tokenizer)

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    def generate(
        self,
        prompts,
        sampling_params=None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate a completion of each prompt: a str, a TextPrompt or TokensPrompt dict, a list of token ids,
        or a list of those; sampling_params one for all or one per prompt. Outputs in prompt order."""
        self._check_task("generate")
        if lora_request is not None:
            raise LLMError("lora_request is not supported: miro has no LoRA adapters.")
        if priority is not None and any(p != 0 for p in priority):
            raise LLMError("priority is not supported by LLM.generate (Engine.add_request takes one).")
        return self._generate(_parse_prompts(prompts), sampling_params, use_tqdm)

    def chat(
        self,
        messages,
        sampling_params=None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools=None,
        chat_template_kwargs: dict | None = None,
        mm_processor_kwargs=None,
    ) -> list[RequestOutput]:
        """Generate the next message of one conversation (a list of {"role", "content"} messages) or of each of a
        list of them, rendered with the model's chat template."""
        self._check_task("generate")
        for name, value, why in (
            ("lora_request", lora_request, "miro has no LoRA adapters"),
            ("chat_template", chat_template, llm_options.SPECIFIC["chat_template"]),
            ("mm_processor_kwargs", mm_processor_kwargs, "miro's models take text only"),
        ):
            if value is not None:
                raise LLMError(f"{name} is not supported: {why}.")
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise LLMError(
                f"chat_template_content_format must be 'auto', 'string' or 'openai', got "
                f"{chat_template_content_format!r}."
            )
        if continue_final_message and add_generation_prompt:
            raise LLMError("continue_final_message and add_generation_prompt cannot both be true.")
        extra = dict(chat_template_kwargs or {})
        reserved = sorted(set(extra) & {"messages", "add_generation_prompt", "bos_token", "eos_token"})
        if reserved:
            raise LLMError(f"chat_template_kwargs must not set {reserved[0]!r}: LLM.chat sets it.")
        if tools is not None:
            extra["tools"] = tools
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        for conversation in conversations:
            conversation = [_message(m, flatten=chat_template_content_format != "openai") for m in conversation]
            try:
                text = self.engine.tokenizer.apply_chat_template(
                    conversation, add_generation_prompt=add_generation_prompt, **extra
                )
            except MiroError as err:
                raise LLMError(str(err)) from None
            if continue_final_message:
                text = _cut_after_final(text, conversation)
            prompts.append((text, text))
        return self._generate(prompts, sampling_params, use_tqdm)

    def embed(
        self,
        prompts,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params=None,
        lora_request=None,
    ) -> list[EmbeddingRequestOutput]:
        """Embed each prompt with an embedding model: `.outputs.embedding` is its vector (L2-normalised, as
        vLLM's embed models give it), in prompt order."""
        self._check_task("embed")
        for name, value, why in (
            ("truncate_prompt_tokens", truncate_prompt_tokens, "a prompt longer than the context is refused, not cut"),
            ("pooling_params", pooling_params, "the model's own pooling is used"),
            ("lora_request", lora_request, "miro has no LoRA adapters"),
        ):
            if value is not None:
                raise LLMError(f"LLM.embed's {name} is not supported: {why}.")
        items = _parse_prompts(prompts)
        outputs = self.engine.encode([engine_prompt for engine_prompt, _ in items], use_tqdm=use_tqdm)
        _raise_refused(outputs)
        return [
            EmbeddingRequestOutput(
                out.request_id, EmbeddingOutput(out.embedding.tolist()), list(out.prompt_token_ids), 0, True
            )
            for out in outputs
        ]

    # -- the work -----------------------------------------------------------------------------------------

    def _check_task(self, task: str) -> None:
        refusal = self.engine.refusal(task)
        if refusal:
            raise LLMError(refusal)

    def _params_for(self, sampling_params, count: int) -> list:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != count:
                raise LLMError(
                    f"there are {count} prompts and {len(sampling_params)} sampling_params: give one for all "
                    f"or one per prompt."
                )
            params = list(sampling_params)
        else:
            params = [sampling_params] * count
        for p in params:
            if not isinstance(p, _EngineSamplingParams):
                raise LLMError(f"sampling_params must be SamplingParams, got {type(p).__name__}.")
        if self._seeds is not None:  # a seed each, drawn in prompt order
            params = [replace(p, seed=self._seeds.randrange(2**31)) if p.seed is None else p for p in params]
        return params

    def _generate(self, items: list[tuple], sampling_params, use_tqdm: bool) -> list[RequestOutput]:
        params = self._params_for(sampling_params, len(items))
        outputs = self.engine.generate([engine_prompt for engine_prompt, _ in items], params, use_tqdm=use_tqdm)
        _raise_refused(outputs)
        return [self._request_output(out, text, p) for out, (_, text), p in zip(outputs, items, params)]

    def _request_output(self, out, prompt: str | None, params) -> RequestOutput:
        choices = [self._completion(choice, params) for choice in out.outputs]
        return RequestOutput(
            out.request_id,
            prompt,
            list(out.prompt_token_ids),
            None,
            choices,
            out.finished,
            num_cached_tokens=out.num_cached_tokens,
        )

    def _completion(self, choice, params) -> CompletionOutput:
        text, stop_reason = choice.text, choice.stop_reason
        if isinstance(stop_reason, int) and stop_reason not in params.stop_token_ids:
            stop_reason = None  # the model's end-of-sequence token: vLLM says None
        if (
            getattr(params, "include_stop_str_in_output", False)
            and choice.finish_reason == "stop"
            and isinstance(stop_reason, str)
        ):
            text += stop_reason
        logprobs = cumulative = None
        if choice.logprobs is not None:
            logprobs = [self._position(entry) for entry in choice.logprobs]
            cumulative = float(sum(position[token].logprob for token, position in zip(choice.token_ids, logprobs)))
        return CompletionOutput(
            choice.index, text, list(choice.token_ids), cumulative, logprobs, choice.finish_reason, stop_reason
        )

    def _position(self, entry) -> dict[int, Logprob]:
        """One position's logprobs as vLLM gives them: {token id: Logprob}, the sampled token first, then the top
        `logprobs` tokens, ranked from 1."""
        chosen = (entry.token_id, entry.logprob, entry.token)
        top = [(lp.token_id, lp.logprob, lp.token) for lp in entry.top_logprobs]
        ranks = {token: rank for rank, (token, _, _) in enumerate(top, start=1)}
        position = {chosen[0]: Logprob(chosen[1], ranks.get(chosen[0]), chosen[2])}
        for token, logprob, text in top:
            position.setdefault(token, Logprob(logprob, ranks[token], text))
        return position


def _parse_prompts(prompts) -> list[tuple]:
    """(what the engine takes, the prompt text outputs show) for each prompt."""
    if isinstance(prompts, (str, dict)) or (
        isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
    ):
        prompts = [prompts]
    items = []
    for prompt in prompts:
        if isinstance(prompt, str):
            items.append((prompt, prompt))
        elif isinstance(prompt, dict):
            unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
            if unknown:
                raise LLMError(
                    f"a prompt dict's {unknown[0]!r} is not supported: miro takes 'prompt' (TextPrompt) or "
                    f"'prompt_token_ids' (TokensPrompt)."
                )
            if "prompt_token_ids" in prompt:
                items.append((list(prompt["prompt_token_ids"]), prompt.get("prompt")))
            elif "prompt" in prompt:
                items.append((prompt["prompt"], prompt["prompt"]))
            else:
                raise LLMError("a prompt dict needs 'prompt' or 'prompt_token_ids'.")
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            items.append((list(prompt), None))
        else:
            raise LLMError(
                f"a prompt must be a str, a TextPrompt or TokensPrompt dict or a list of token ids, got "
                f"{type(prompt).__name__}."
            )
    return items


def _raise_refused(outputs) -> None:
    """The engine refuses a prompt in its output (error); vLLM raises: so does LLM, naming the first."""
    for k, out in enumerate(outputs):
        if out.error:
            raise LLMError(f"prompt {k}: {out.error.rstrip('.')}.")


def _message(message: dict, flatten: bool) -> dict:
    """A chat message as the template takes it: content parts ([{"type": "text", "text": ...}]) joined into one
    string, as vLLM's "string" content format does (kept as parts with "openai")."""
    if not isinstance(message, dict) or "role" not in message:
        raise LLMError("a chat message must be a dict with a 'role' (and 'content').")
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kinds = sorted({part.get("type") for part in content if isinstance(part, dict)} - {"text"})
    if kinds or not all(isinstance(part, dict) for part in content):
        raise LLMError(
            f"a message's content part of type {kinds[0] if kinds else 'unknown'!r} is not supported: "
            f"miro's models take text only."
        )
    return {**message, "content": "\n".join(part.get("text", "") for part in content)} if flatten else message


def _cut_after_final(text: str, conversation: list[dict]) -> str:
    """continue_final_message: the rendered conversation up to the end of its last message's content, so that
    the model goes on with that message."""
    final = conversation[-1].get("content") if conversation else None
    at = text.rfind(final) if isinstance(final, str) and final else -1
    if at < 0:
        raise LLMError("continue_final_message needs a final message whose text the chat template renders as it is.")
    return text[: at + len(final)]


__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "EmbeddingRequestOutput",
    "EmbeddingOutput",
    "PoolingRequestOutput",
    "TextPrompt",
    "TokensPrompt",
    "LLMTokenizer",
    "LLMError",
]
