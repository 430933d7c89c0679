"""Engine: a resident model serving many requests at once by continuous batching.

    add_request() -> step() ... step() -> finished RequestOutputs

Each step the scheduler picks decode tokens and prefill chunks, the model runner
runs them as one packed batch over the paged KV cache, the sampler picks next
tokens, and finished sequences leave at once. The engine itself handles only
requests and sequences; what a request must pass to be queued is request_checks.py's.

An embedding model (a BERT encoder, or a decoder whose file names a pooling type)
takes embedding requests instead (add_request with PoolingParams): each step packs
waiting inputs into one pass and hands back EmbeddingRequestOutputs (embedder.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence as Seq

import numpy as np

from miro.core import defaults
from miro.core.sampling import sampler
from miro.core.engine.block_manager import BlockManager
from miro.core.engine import allocator, compile_ahead, request_checks
from miro.core.engine.embedder import Embedder, EmbeddingRequest
from miro.core.loading.model_config import ModelConfig
from miro.core.engine.engine_config import EngineConfig
from miro.core.errors import RequestError, request_fault
from miro.core.loading.gguf_file import GGUFFile
from miro.core.engine.kv_cache import check_kv_cache_dtype
from miro.core.kernels import cpu
from miro.core.engine.model_runner import ModelRunner
from miro.core.models import Model, load_model, read_config
from miro.core.engine.output_processor import append_token, request_output
from miro.core.engine.outputs import EmbeddingRequestOutput, RequestOutput
from miro.core.layers.pooling import PoolingParams
from miro.core.loading.registry import resolve_model
from miro.core.sampling.params import SamplingParams
from miro.core.engine.scheduler import ScheduledBatch, Scheduler, seats_for
from miro.core.engine.sequence import Request, Sequence
from miro.core.engine.progress_bar import ProgressBar
from miro.core.engine.stats import EngineStats, LoadTimes, TokenRates
from miro.core.sampling.structured_output import StructuredOutputs
from miro.core.tokenizers.tokenizer import IncrementalDetokenizer, Tokenizer
from miro.core.loading.weight_format import choose_for_file


class Engine:
    def __init__(self, model: Model, tokenizer: Tokenizer, config: EngineConfig | None = None, *, model_name: str = ""):
        """An engine over a loaded model; config: every option (EngineConfig's defaults when None). The weights'
        options (weights, max_weight_memory, batch_invariant) took effect when the model was loaded."""
        config = config or EngineConfig()
        allocator.keep_step_memory()  # a step's large temporaries reused, not faulted in again every step
        self.model = model
        self.config: ModelConfig = model.config
        self.weight_format: str = model.weight_format  # "f32", "native", "bf16" or "i16"
        self.weight_memory: int = model.weight_memory  # bytes the weights hold of their own
        self.mapped_bytes = 0  # size of the memory-mapped model file (from_model sets it)
        self.weight_choice = f"weights: {self.weight_format}"  # from_model: the format and why it was chosen
        self.cpu_tier: str = cpu.TIER.name  # the CPU tier the kernels run (layers/cpu.py): avx512-vnni ... portable
        self.cpu_description: str = cpu.describe()  # that tier as one line for logs: "cpu tier avx2", ...
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.engine_config = config
        self.block_size = block_size = config.block_size
        self.kv_cache_dtype = check_kv_cache_dtype(config.kv_cache_dtype)  # "float16" or "float32"
        # what the model does: "generate" (a decoder), or "embed" (an encoder, or a decoder with a pooling type)
        self.supported_tasks: tuple[str, ...] = ("embed",) if self.config.pooling_type else ("generate",)
        # an encoder has no KV cache: its runner and block manager hold nothing
        self.runner = (
            ModelRunner(model, block_size, config.num_kv_blocks, config.kv_cache_memory, self.kv_cache_dtype)
            if self.config.causal
            else None
        )
        self.max_model_len = min(config.max_model_len or self.config.context_length, self.config.context_length)
        self.block_manager = BlockManager(
            self.runner.num_kv_blocks if self.runner else 0, block_size, config.enable_prefix_caching
        )
        max_num_batched_tokens = config.max_num_batched_tokens
        if not config.enable_chunked_prefill:  # every prompt must fit in one step
            max_num_batched_tokens = max(max_num_batched_tokens, self.max_model_len)
        if "embed" in self.supported_tasks:
            max_num_seqs = config.max_num_seqs or defaults.EMBED_MAX_NUM_SEQS
            self.embedder = Embedder(
                model, tokenizer, self.max_model_len, config.embed_batch_tokens, self.runner, self.block_manager
            )
        else:
            max_num_seqs = config.max_num_seqs or seats_for(self.block_manager.num_blocks * block_size)
            self.embedder = None
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs,
            max_num_batched_tokens,
            config.enable_chunked_prefill,
            config.admission_order,
        )
        self.structured = StructuredOutputs(tokenizer, self.config.vocab_size)
        self.requests: dict[str, Request] = {}
        self._aborted: list[RequestOutput | EmbeddingRequestOutput] = []
        self.rates = TokenRates()  # tokens computed: totals and rates over the last seconds
        self._ids = itertools.count()
        self.load_times: LoadTimes | None = None

    @classmethod
    def from_model(
        cls,
        name_or_path: str | Path,
        log: Callable[[str], None] = lambda m: None,
        config: EngineConfig | None = None,
        **options,
    ) -> "Engine":
        """Load an alias (pulled on first use) or a .gguf path; config, or the options as EngineConfig's keywords.

        weights: "native" keeps every matrix as stored in the file (batch-invariant by construction), "f32"
        dequantizes each once (4-8x the file's size in memory; packed for the invariant GEMM when
        batch_invariant, else laid out for OpenBLAS), "bf16" rounds that copy to bfloat16 (AVX512_BF16 CPUs),
        "i16" to 13-bit integers per block of 128 (x86), "auto" takes bf16 for an encoder where the CPU has it
        and i16 where it has not, else native where its kernels are estimated
        faster for the file's types on this CPU tier (weight_format.NATIVE_SPEEDUP), else f32 when its copy fits
        max_weight_memory (bytes or "8GiB"; default: half the machine's RAM), else native. The choice and why is
        `engine.weight_choice`; it goes to `log` when native is asked for or taken for want of memory.
        """
        config = EngineConfig.of(options, base=config)
        path = resolve_model(name_or_path, log)
        t0 = time.perf_counter()
        gguf = GGUFFile(path)
        model_config = read_config(gguf)  # an architecture miro does not run stops here
        # the context it runs with, as __init__ computes max_model_len (Phi-3's longrope chooses its factors by it)
        model_config = replace(
            model_config, n_ctx=min(config.max_model_len or model_config.context_length, model_config.context_length)
        )
        choice = choose_for_file(gguf, config.weights, config.max_weight_memory, encoder=not model_config.causal)
        # the kernels numba's cache lacks, compiled by other processes while this one loads
        ahead = compile_ahead.start(
            compile_ahead.plan(gguf, model_config, choice.format, check_kv_cache_dtype(config.kv_cache_dtype)), log
        )
        t1 = time.perf_counter()
        tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata, source=str(path))
        t2 = time.perf_counter()
        try:
            model = load_model(gguf, model_config, choice.format, config.batch_invariant)
        except BaseException:
            ahead.stop()
            raise
        ahead.wait()
        t3 = time.perf_counter()
        if choice.announce:  # native asked for, or taken for want of memory
            log(choice.why)
        for fallback in model.weight_fallbacks:
            log(f"weights: {fallback}")
        engine = cls(model, tokenizer, config, model_name=str(name_or_path))
        engine.mapped_bytes = Path(path).stat().st_size
        engine.weight_choice = choice.why
        engine.compiled_ahead = ahead.units  # kernel families other processes compiled into the cache for this load
        engine.load_times = LoadTimes(parse_s=t1 - t0, tokenizer_s=t2 - t1, weights_s=t3 - t2)
        return engine

    # -- requests -------------------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | Seq[int],
        params: SamplingParams | PoolingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a request (text, or token ids); returns its id. A request that cannot be served raises RequestError.

        SamplingParams (the default) generate; PoolingParams embed, on a model whose supported_tasks has "embed".
        `priority`, as vLLM's: lower is more urgent. A request more urgent than running ones preempts them when
        there is no room for it (scheduler.py); their outputs are the same, only later.
        """
        refusal = self.refusal("embed" if isinstance(params, PoolingParams) else "generate")
        if refusal:
            raise RequestError(refusal)
        params = params or SamplingParams()
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests or request_id in self.embedding_requests:
            raise RequestError(f"request id '{request_id}' is already in use.")
        if isinstance(params, PoolingParams):
            request = self.embedder.make_request(request_id, prompt, params, priority)
            self.embedder.add(request)
            return request_id
        params.validate()
        ids = request_checks.prompt_ids(prompt, self.tokenizer, self.config.vocab_size)
        if params.max_tokens is None:
            room = request_checks.room_for(len(ids), params.n, self.block_manager, self.max_model_len)
            params = replace(params, max_tokens=room)
        request_checks.check_fits(len(ids), params.max_tokens, params.n, self.block_manager, self.max_model_len)
        request_checks.check_token_ids(params, self.config.vocab_size)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.tokenizer.eog_ids)
        matcher = self.structured.new_matcher(params.structured_outputs) if params.structured_outputs else None
        seq = self._new_sequence(request_id, 0, ids, params, matcher, priority)
        self.requests[request_id] = Request(
            request_id, prompt if isinstance(prompt, str) else None, ids, params, [seq], stop_ids
        )
        self.scheduler.add(seq)
        return request_id

    def refusal(self, task: str) -> str | None:
        """Why the model cannot do `task` ("generate" or "embed"), in one sentence naming it; None if it can."""
        return request_checks.task_refusal(task, self.supported_tasks, self.config, self.model_name)

    def _new_sequence(
        self, request_id: str, index: int, ids: list[int], params: SamplingParams, matcher=None, priority: int = 0
    ) -> Sequence:
        # choice i of a seeded request has its own fixed stream, independent of the batch
        rng = np.random.default_rng(None if params.seed is None else [params.seed, index])
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=params.skip_special_tokens)
        return Sequence(request_id, index, list(ids), params, rng, detok, matcher=matcher, priority=priority)

    def abort(self, request_id: str) -> bool:
        """Stop a request; its output (finish_reason "abort") comes with the next step(). False if unknown."""
        embedding = self.embedder.abort(str(request_id)) if self.embedder is not None else None
        if embedding is not None:
            self._aborted.append(
                EmbeddingRequestOutput(embedding.request_id, embedding.prompt, embedding.token_ids, error="aborted")
            )
            return True
        request = self.requests.pop(str(request_id), None)
        if request is None:
            return False
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                seq.finish_reason = "abort"
        self._aborted.append(request_output(request, self.tokenizer))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.embedding_requests) or bool(self._aborted)

    # -- the step -------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        """Run one batch; return a snapshot of every request that got new tokens or finished."""
        step_started = time.monotonic()
        outputs, self._aborted = self._aborted, []
        if self.embedder is not None:
            return outputs + self._embed_step(step_started)
        batch = self.scheduler.schedule()
        if not batch:
            return outputs
        # structured output: the masks of the constrained rows are computed while the forward pass runs
        pending_masks = self.structured.start_masks([s.seq for s in batch.seqs if s.wants_logits])
        out = self.runner.execute(batch)
        faults: dict[int, Exception] = {}  # logits row -> what went wrong in its request's own processing
        masks = self.structured.step_masks(pending_masks, out.seqs, faults)

        prompt_tokens = 0
        for scheduled in batch.seqs:
            n = scheduled.num_new_tokens
            if n > 1 or not scheduled.seq.output_token_ids:
                prompt_tokens += n  # prefill (or recomputation after preemption), not a decode token
            scheduled.seq.num_computed_tokens += n
        stop_ids = [self.requests[s.request_id].stop_ids for s in out.seqs]
        tokens = sampler.sample(out.logits, out.seqs, stop_ids, masks, faults)

        # each request's own part of the step, on its own: a fault there ends that request with an error
        # (request_fault), and the others go on with the tokens they would have had without it
        touched: dict[str, Request] = {}
        failed: dict[str, str] = {}  # request id -> its error
        for i, (seq, token, row) in enumerate(zip(out.seqs, tokens, out.logits)):
            request = self.requests[seq.request_id]
            if seq.request_id in failed:
                continue
            touched[seq.request_id] = request
            if i in faults:
                failed[seq.request_id] = request_fault("masking and sampling its next token", faults[i])
                continue
            stage = "forking its n choices"
            try:
                if seq.index == 0 and not seq.output_token_ids and request.params.n > 1:
                    self._fork(request, seq, row)
                stage = "taking its token (grammar, stop ids and strings, detokenisation)"
                self._append_token(seq, token, request)
            except Exception as exc:  # noqa: BLE001 - this request's fault, said in its output
                failed[seq.request_id] = request_fault(stage, exc)
        self.rates.record(prompt_tokens, len(out.seqs), step_started)

        for request in touched.values():
            if request.request_id in failed:
                outputs.append(self._fail(request, failed[request.request_id]))
                continue
            outputs.append(request_output(request, self.tokenizer))
            if all(s.is_finished for s in request.seqs):
                del self.requests[request.request_id]
        return outputs

    def _fail(self, request: Request, error: str) -> RequestOutput:
        """End a request whose own processing failed: every choice finished ("error"), its blocks freed, and its
        output finished with `error` (the choices so far kept)."""
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                seq.finish_reason = "error"
        self.requests.pop(request.request_id, None)
        output = request_output(request, self.tokenizer)
        output.error, output.finished = error, True
        return output

    def reset(self) -> list[str]:
        """Drop every request, queued or running, and start the scheduler, the block tables and the prefix
        cache afresh (the weights and the KV cache's memory stay): for a caller whose step() raised an error no
        request accounts for. Returns the ids of the requests dropped; their outputs never come."""
        dropped = [*self.requests, *self.embedding_requests]
        self.requests.clear()
        self._aborted = []
        self.block_manager = BlockManager(
            self.block_manager.num_blocks, self.block_size, self.engine_config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            self.scheduler.max_num_seqs,
            self.scheduler.max_num_batched_tokens,
            self.engine_config.enable_chunked_prefill,
            self.engine_config.admission_order,
        )
        if self.embedder is not None:
            self.embedder = Embedder(
                self.model,
                self.tokenizer,
                self.max_model_len,
                self.engine_config.embed_batch_tokens,
                self.runner,
                self.block_manager,
            )
        return dropped

    def _embed_step(self, step_started: float) -> list[EmbeddingRequestOutput]:
        """One embedding pass over the waiting inputs (embedder.py); every output is finished."""
        done = self.embedder.run_pass()
        if done:
            self.rates.record(sum(out.num_tokens for out in done), 0, step_started)
        return done

    @property
    def embedding_requests(self) -> dict[str, EmbeddingRequest]:
        """The embedding requests waiting for their pass (every other one has finished), by id."""
        return self.embedder.waiting if self.embedder is not None else {}

    def _fork(self, request: Request, parent: Sequence, logits_row: np.ndarray) -> None:
        """n > 1: the other choices share the parent's prompt blocks (copy-on-write) and sample from its logits."""
        for index in range(1, request.params.n):
            matcher = parent.matcher.deep_copy() if parent.matcher is not None else None  # before the parent moves
            child = self._new_sequence(
                request.request_id, index, parent.prompt_token_ids, request.params, matcher, parent.priority
            )
            self.block_manager.fork(parent, child)
            request.seqs.append(child)  # the request's from here: a fault below frees its blocks with the rest
            self.scheduler.add_running(child)
            masks = self.structured.masks([matcher], [0]) if matcher is not None else None
            token = sampler.sample(logits_row[None], [child], [request.stop_ids], masks)[0]
            self._append_token(child, token, request)

    def _append_token(self, seq: Sequence, token: int, request: Request) -> None:
        if append_token(seq, token, request.stop_ids, self.max_model_len):
            self.scheduler.finish(seq)

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the KV cache holds (0 for an encoder, which has none)."""
        return self.block_manager.num_blocks * self.block_size

    # -- stats ----------------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """KV cache and token figures; throughputs are over the last 10 s (or since the first step, if sooner),
        so they fall to 0 when the engine is idle."""
        bm = self.block_manager
        prompt_per_s, generated_per_s = self.rates.per_second()
        return EngineStats(
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            kv_usage=bm.num_used_blocks / bm.num_blocks if bm.num_blocks else 0.0,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting) + len(self.embedding_requests),
            preemptions=self.scheduler.num_preemptions,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            prompt_tokens_total=self.rates.prompt_tokens_total,
            generation_tokens_total=self.rates.generation_tokens_total,
            prompt_tokens_per_s=prompt_per_s,
            generation_tokens_per_s=generated_per_s,
        )

    # -- convenience ----------------------------------------------------------------------------------

    def logits(self, prompt: str | Seq[int]) -> np.ndarray:
        """float32 next-token logits after the last position of the prompt (no request is created)."""
        ids = request_checks.prompt_ids(prompt, self.tokenizer, self.config.vocab_size)
        request_checks.check_fits(len(ids), 0, 1, self.block_manager, self.max_model_len)
        seq = self._new_sequence("logits", 0, ids, SamplingParams(max_tokens=1))
        bm = self.block_manager
        if bm.blocks_needed(len(ids)) > bm.num_free_blocks:
            raise RequestError("the KV cache has no room for this prompt while other requests run.")
        bm.admit(seq)
        try:
            while True:
                n = min(seq.num_uncomputed, self.scheduler.max_num_batched_tokens)
                batch = ScheduledBatch()
                batch.add(seq, n, bm.grow(seq, n))
                bm.register_full_blocks(seq, seq.num_computed_tokens + n)
                out = self.runner.execute(batch)
                seq.num_computed_tokens += n
                if out.seqs:  # the chunk reached the prompt's last token
                    return out.logits[0].copy()
        finally:
            bm.release(seq)

    def stream(self, prompt: str | Seq[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Generate one completion, yielding new text as it is produced."""
        request_id = self.add_request(prompt, params)
        sent = 0
        while True:
            for out in self.step():
                if out.request_id == request_id:
                    yield out.text[sent:]
                    sent = len(out.text)
                    if out.finished:
                        return

    def generate(
        self,
        prompts: str | Seq[str | Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched; outputs in prompt order. A refused prompt gets `error` set.

        A progress bar (done / total, tokens/s, time left) goes to stderr unless use_tqdm=False.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        return self._run_all(prompts, params_list, "generate", use_tqdm)

    def _run_all(self, prompts: list, params_list: list, label: str, use_tqdm: bool) -> list:
        """Add every prompt, step until each has finished; outputs in prompt order, a refused one's with
        `error` set."""
        results = {}
        order = []
        for prompt, p in zip(prompts, params_list):
            request_id = f"{label}-{next(self._ids)}"
            order.append(request_id)
            try:
                self.add_request(prompt, p, request_id)
            except RequestError as err:
                text = prompt if isinstance(prompt, str) else None
                results[request_id] = (
                    RequestOutput(request_id, text, [], error=str(err), finished=True)
                    if label == "generate"
                    else EmbeddingRequestOutput(request_id, text, [], error=str(err))
                )
        progress = ProgressBar(len(prompts), enabled=use_tqdm, label=label)
        progress.advance(len(results))
        pending = set(order) - results.keys()  # a set: with 200,000 prompts a list's `in` took minutes
        while pending:
            for out in self.step():
                if out.finished and out.request_id in pending:
                    pending.discard(out.request_id)
                    results[out.request_id] = out
                    progress.advance(1)
            progress.show(self.stats())
        progress.close()
        return [results[r] for r in order]

    def embed(
        self, inputs: str | Seq[str | Seq[int]], params: PoolingParams | None = None, use_tqdm: bool = False
    ) -> np.ndarray:
        """Embed every input (texts, or lists of token ids), batched: an (n, dimensions) float32 array in input
        order, L2-normalised unless params say not. An input the model cannot embed raises RequestError
        naming it."""
        outputs = self.encode(inputs, params, use_tqdm)
        for k, out in enumerate(outputs):
            if out.error:
                raise RequestError(f"input {k}: {out.error}")
        return np.stack([out.embedding for out in outputs]) if outputs else np.zeros((0, self.config.dim), np.float32)

    def encode(
        self, inputs: str | Seq[str | Seq[int]], params: PoolingParams | None = None, use_tqdm: bool = False
    ) -> list[EmbeddingRequestOutput]:
        """Embed every input, batched; outputs in input order, a refused input's with `error` set."""
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        return self._run_all(inputs, [params or PoolingParams()] * len(inputs), "embed", use_tqdm)
