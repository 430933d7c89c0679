"""vLLM's offline API (`from miro import LLM, SamplingParams`, miro/core/llm.py): vLLM's own offline examples run
with the import changed (examples/vllm/), the output shapes are vLLM's, what miro cannot honour is refused in one
sentence, and LLM gives the engine's own tokens."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

import miro
from miro import LLM, SamplingParams, StructuredOutputsParams
from miro.core import MiroError
from miro.core import SamplingParams as EngineSamplingParams
from miro.core.llm import (
    CompletionOutput,
    EmbeddingRequestOutput,
    GuidedDecodingParams,
    LLMError,
    Logprob,
    RequestOutput,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "vllm"


def one_sentence(message: str) -> bool:
    """A single sentence: one line, ending with a full stop, no full stop before a new capitalised sentence."""
    return "\n" not in message and message.endswith(".") and not re.search(r"\.\s+[A-Z]", message)


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as caught:
        call(*args, **kwargs)
    assert isinstance(caught.value, LLMError) and isinstance(caught.value, MiroError)
    message = str(caught.value)
    assert one_sentence(message), message
    return message


# -- the package -------------------------------------------------------------------------------------------


def test_the_miro_package_exports_vllms_names_lazily():
    probe = (
        "import sys; import miro; from miro import LLM, SamplingParams, StructuredOutputsParams; "
        "import miro.core; print(LLM.__module__, 'numba' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.stdout.split() == ["miro.core.llm", "False"], done.stderr
    assert miro.SamplingParams is SamplingParams and issubclass(SamplingParams, EngineSamplingParams)
    assert miro.EngineConfig is miro.core.EngineConfig and miro.MiroError is MiroError
    with pytest.raises(AttributeError):
        miro.NoSuchName  # noqa: B018


def test_miro_core_llm_exports_each_name_from_its_one_home():
    """llm.py re-exports the request types (llm_params.py), the result types (llm_outputs.py), the tokenizer
    (llm_tokenizer.py) and LLMError (errors.py): `from miro.core.llm import X` gives the one class there is."""
    from miro.core import errors, llm, llm_outputs, llm_params, llm_tokenizer

    homes = {
        llm_params: ["TextPrompt", "TokensPrompt", "StructuredOutputsParams", "GuidedDecodingParams", "SamplingParams"],
        llm_outputs: [
            "Logprob",
            "CompletionOutput",
            "RequestOutput",
            "EmbeddingOutput",
            "PoolingRequestOutput",
            "EmbeddingRequestOutput",
        ],
        llm_tokenizer: ["LLMTokenizer"],
        errors: ["LLMError"],
    }
    moved = [name for names in homes.values() for name in names]
    assert sorted(["LLM", *moved]) == sorted(llm.__all__) and set(miro._FROM_LLM) <= set(llm.__all__)
    for module, names in homes.items():
        for name in names:
            assert getattr(llm, name) is getattr(module, name) and getattr(module, name).__module__ == module.__name__
    assert llm.GuidedDecodingParams is llm.StructuredOutputsParams and llm.LLM.__module__ == "miro.core.llm"


# -- refusals, before any model is loaded ----------------------------------------------------------------


@pytest.mark.parametrize(
    "options, words",
    [
        ({"no_such_option": 1}, "has no option 'no_such_option'"),
        ({"dtype": "float16"}, "dtype 'float16' is not available"),
        ({"dtype": "half"}, "dtype 'half' is not available"),
        ({"tensor_parallel_size": 2}, "tensor_parallel_size must be 1"),
        ({"quantization": "awq"}, "quantization 'awq' is not available"),
        ({"gpu_memory_utilization": 0.9}, "gpu_memory_utilization is not an option"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype 'fp8' is not available"),
        ({"tokenizer": "other/tokenizer"}, "tokenizer must be left out"),
        ({"task": "classify"}, "is not available"),
        ({"revision": "main"}, "revision is not an option"),
        ({"dtype": "float32", "weights": "native"}, "ask for different weight formats"),
        ({"seed": -1}, "seed must be a non-negative integer"),
    ],
)
def test_llm_refuses_what_miro_cannot_honour(tmp_path, options, words):
    message = refused(LLM, str(tmp_path / "never-loaded.gguf"), **options)
    assert words in message


def test_llm_refuses_a_model_it_cannot_find_in_one_sentence(tmp_path):
    assert "neither a known alias" in refused(LLM, str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"logit_bias": {1: 2.0}}, "logit_bias is not supported"),
        ({"prompt_logprobs": 1}, "prompt_logprobs is not supported"),
        ({"best_of": 3}, "best_of is not supported"),
        ({"allowed_token_ids": [1, 2]}, "allowed_token_ids is not supported"),
        ({"bad_words": ["x"]}, "bad_words is not supported"),
        ({"truncate_prompt_tokens": 8}, "truncate_prompt_tokens is not supported"),
        ({"detokenize": False}, "detokenize is not supported"),
        ({"logits_processors": [print]}, "logits_processors is not supported"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        (
            {
                "structured_outputs": StructuredOutputsParams(regex="a"),
                "guided_decoding": StructuredOutputsParams(regex="b"),
            },
            "not both",
        ),
    ],
)
def test_sampling_params_refuse_what_miro_cannot_honour(fields, words):
    assert words in refused(SamplingParams, **fields)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({}, "exactly one of"),
        ({"json": {"type": "object"}, "regex": "a"}, "exactly one of"),
        ({"regex": "a", "backend": "xgrammar"}, "backend 'xgrammar' is not available"),
        ({"regex": "a", "whitespace_pattern": " "}, "whitespace_pattern is not supported"),
        ({"grammar": "root ::= (((("}, "could not be converted"),
    ],
)
def test_structured_outputs_params_refuse_what_miro_cannot_honour(fields, words):
    def make():
        params = StructuredOutputsParams(**fields)
        return SamplingParams(structured_outputs=params)

    assert words in refused(make)


def test_llm_options_map_vllms_names_to_engine_config():
    from miro.core import llm_options

    assert [llm_options.weights_for(d, {}) for d in ("auto", "float32", "torch.bfloat16")] == [None, "f32", "bf16"]
    assert llm_options.weights_for("float32", {"weights": "f32"}) == "f32"
    options = dict(kv_cache_memory_bytes=2**30, kv_cache_dtype="half", enforce_eager=True, swap_space=0, block_size=32)
    assert llm_options.engine_options(options) == {
        "kv_cache_memory": 2**30,
        "kv_cache_dtype": "float16",
        "block_size": 32,
    }
    assert [llm_options.task_asked(t, r, "auto") for t, r in [("auto", "auto"), ("embedding", "pooling")]] == [
        None,
        "embed",
    ]
    with pytest.raises(LLMError, match="ask for different weight formats"):
        llm_options.weights_for("bfloat16", {"weights": "native"})


def test_sampling_params_take_vllms_common_fields():
    params = SamplingParams(
        n=2,
        temperature=0.7,
        top_p=0.9,
        top_k=-1,
        min_p=0.05,
        max_tokens=20,
        min_tokens=1,
        stop="\n\n",
        stop_token_ids=[2],
        seed=3,
        logprobs=2,
        presence_penalty=0.5,
        frequency_penalty=0.1,
        repetition_penalty=1.1,
        ignore_eos=False,
        skip_special_tokens=True,
        include_stop_str_in_output=True,
        best_of=2,
        spaces_between_special_tokens=False,
    )
    assert params.stop == ["\n\n"] and params.n == 2 and params.top_k == -1
    assert SamplingParams(stop=None, stop_token_ids=None).stop == []
    # the older name, a GBNF grammar (as vLLM's examples write it) made Lark, and stop strings beside a constraint
    guided = SamplingParams(guided_decoding=GuidedDecodingParams(grammar='root ::= "a" | "b"'), stop=["x"])
    assert guided.structured_outputs.grammar.lstrip().startswith("%llguidance") and guided.guided_decoding is None
    assert SamplingParams(
        structured_outputs=StructuredOutputsParams(choice=["yes", "no"])
    ).structured_outputs.choice == ["yes", "no"]
    assert StructuredOutputsParams.from_optional() is None
    with pytest.raises(MiroError, match="cannot be combined"):  # miro's own SamplingParams keep their refusal
        EngineSamplingParams(structured_outputs={"regex": "a+"}, stop=["x"])


# -- vLLM's examples, with the import changed --------------------------------------------------------------


def run_example(name: str, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def quoted(line: str, label: str):
    assert line.startswith(label), line
    return ast.literal_eval(line[len(label) :].strip())


def test_vllm_basic_example(smollm2_path, tmp_path):
    lines = [
        line for line in run_example("basic.py", cwd=tmp_path).splitlines() if line.startswith(("Prompt", "Output"))
    ]
    prompts = [quoted(line, "Prompt:") for line in lines[0::2]]
    outputs = [quoted(line, "Output:") for line in lines[1::2]]
    assert prompts == [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    assert len(outputs) == 4 and all(isinstance(text, str) and text for text in outputs)


def test_vllm_chat_example(smollm2_path, tmp_path):
    out = run_example("chat.py", "--model", str(smollm2_path), "--max-tokens", "8", "--temperature", "0", cwd=tmp_path)
    prompts = [quoted(line, "Prompt:") for line in out.splitlines() if line.startswith("Prompt:")]
    texts = [quoted(line, "Generated text:") for line in out.splitlines() if line.startswith("Generated text:")]
    assert len(prompts) == len(texts) == 11  # one conversation, then a batch of ten
    assert all(p.endswith("<|im_start|>assistant\n") and "higher education" in p for p in prompts)
    assert len(set(texts)) == 1 and texts[0]  # greedy: the same answer every time


def as_python_word_characters(text: str) -> str:
    """text with every character llguidance's \\w takes but Python's does not made an "a": llguidance's \\w is
    Unicode's (UTS #18), which adds the marks, connector punctuation and the join controls U+200C/U+200D."""
    return "".join(
        "a" if unicodedata.category(c)[0] == "M" or unicodedata.category(c) == "Pc" or c in "\u200c\u200d" else c
        for c in text
    )


def test_vllm_structured_outputs_example(smollm2_path, tmp_path):
    out = run_example("structured_outputs.py", cwd=tmp_path)
    found = dict(re.findall(r"^Structured outputs by (\w+): (.*)$", out, re.MULTILINE))
    assert set(found) == {"Choice", "Regex", "JSON", "Grammar"}
    assert found["Choice"] in ("Positive", "Negative")
    # the regex, cut by its stop string "\n" (or, sampled at temperature 1, by max_tokens before it is complete,
    # perhaps inside a character, which then reads U+FFFD)
    regex_text = as_python_word_characters(found["Regex"])
    assert re.fullmatch(r"\w+@\w+\.com", regex_text) or re.fullmatch(r"\w*(@\w*(\.(c(o(m)?)?)?)?)?\ufffd?", regex_text)
    assert found["JSON"].startswith('{"brand":"')
    assert re.fullmatch(r"SELECT col_[12]  from table_[12]  where col_[12] = [12] ", found["Grammar"])


def test_vllm_embed_example(minilm_path, tmp_path):
    out = run_example("embed.py", "--model", str(minilm_path), cwd=tmp_path)
    sizes = re.findall(r"\(size=(\d+)\)", out)
    assert sizes == ["384"] * 4
    first = re.search(r"Embeddings: \[(.*), \.\.\.\]", out).group(1)
    assert len([float(x) for x in first.split(",")]) == 16


# -- the API against the default model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path), max_model_len=1024, enforce_eager=True, trust_remote_code=True)


GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def test_llm_generate_gives_the_engines_greedy_text(llm, smollm2_path):
    from miro.core import Engine

    engine = Engine.from_model(smollm2_path)
    prompt = "The capital of France is"
    theirs = engine.generate([prompt], EngineSamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0]
    ours = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert ours.outputs[0].text == theirs.text and ours.outputs[0].token_ids == theirs.token_ids
    assert ours.prompt_token_ids == theirs.prompt_token_ids


def test_generate_output_shapes(llm):
    outputs = llm.generate(
        ["Hello, my name is", "The sky is"], SamplingParams(max_tokens=5, logprobs=2, seed=1), use_tqdm=False
    )
    assert len(outputs) == 2
    for out, prompt in zip(outputs, ["Hello, my name is", "The sky is"]):
        assert isinstance(out, RequestOutput) and isinstance(out.request_id, str) and out.finished
        assert out.prompt == prompt and out.prompt_logprobs is None and out.prompt_token_ids
        [choice] = out.outputs
        assert isinstance(choice, CompletionOutput) and choice.index == 0 and choice.finished()
        assert choice.finish_reason in ("stop", "length") and len(choice.token_ids) <= 5
        assert len(choice.logprobs) == len(choice.token_ids)
        for token, position in zip(choice.token_ids, choice.logprobs):
            assert token in position and all(isinstance(lp, Logprob) for lp in position.values())
            assert {lp.rank for lp in position.values() if lp.rank is not None} <= {1, 2}
        assert choice.cumulative_logprob == pytest.approx(
            sum(position[token].logprob for token, position in zip(choice.token_ids, choice.logprobs))
        )
    assert outputs[0].request_id != outputs[1].request_id


def test_generate_takes_vllms_prompt_forms(llm):
    text = "The capital of France is"
    [by_text] = llm.generate(text, GREEDY, use_tqdm=False)
    ids = by_text.prompt_token_ids
    forms = [{"prompt": text}, {"prompt_token_ids": ids}, ids]
    outputs = llm.generate(forms, [GREEDY, GREEDY, GREEDY], use_tqdm=False)
    assert [o.outputs[0].text for o in outputs] == [by_text.outputs[0].text] * 3
    assert [o.prompt for o in outputs] == [text, None, None]
    assert "3 prompts and 2 sampling_params" in refused(llm.generate, forms, [GREEDY, GREEDY])
    assert "'multi_modal_data' is not supported" in refused(llm.generate, {"prompt": "x", "multi_modal_data": {}})
    assert refused(llm.generate, "x " * 2000, GREEDY, use_tqdm=False).startswith("prompt 0: ")


def test_generate_n_stop_strings_and_seeds(llm):
    [out] = llm.generate("Count: 1, 2, 3,", SamplingParams(n=3, max_tokens=6, seed=5), use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    [plain, kept] = llm.generate(
        ["Count: 1, 2, 3,"] * 2,
        [
            SamplingParams(temperature=0, max_tokens=20, stop=[","]),
            SamplingParams(temperature=0, max_tokens=20, stop=[","], include_stop_str_in_output=True),
        ],
        use_tqdm=False,
    )
    assert plain.outputs[0].stop_reason == "," and plain.outputs[0].finish_reason == "stop"
    assert kept.outputs[0].text == plain.outputs[0].text + ","


def test_llm_seed_makes_unseeded_requests_repeat(smollm2_path):
    params = SamplingParams(temperature=1.0, max_tokens=8)
    runs = [
        [
            o.outputs[0].text
            for o in LLM(str(smollm2_path), seed=11).generate(["Once upon a time"] * 3, params, use_tqdm=False)
        ]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_structured_outputs_with_a_stop_string(llm):
    # at most 8 letters a side: the constraint is complete, its "\n" the stop string, well within max_tokens
    params = SamplingParams(
        structured_outputs=StructuredOutputsParams(regex=r"[a-z]{1,8}@[a-z]{1,8}\.com\n"),
        stop=["\n"],
        temperature=0,
        max_tokens=40,
    )
    [out] = llm.generate("Alan Turing's email address is", params, use_tqdm=False)
    choice = out.outputs[0]
    assert re.fullmatch(r"[a-z]+@[a-z]+\.com", choice.text), choice.text
    assert (choice.finish_reason, choice.stop_reason) == ("stop", "\n")


def test_chat(llm):
    conversation = [{"role": "user", "content": "What is the capital of France?"}]
    [one] = llm.chat(conversation, GREEDY, use_tqdm=False)
    assert one.prompt == llm.get_tokenizer().apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    [direct] = llm.generate(one.prompt, GREEDY, use_tqdm=False)
    assert one.outputs[0].text == direct.outputs[0].text
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
    batch = llm.chat([conversation, parts], GREEDY, use_tqdm=False, chat_template_kwargs={"unused": 1})
    assert [o.outputs[0].text for o in batch] == [one.outputs[0].text] * 2
    going_on = conversation + [{"role": "assistant", "content": "The capital of France"}]
    [cont] = llm.chat(going_on, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    assert cont.prompt.endswith("<|im_start|>assistant\nThe capital of France")
    assert "chat_template is not supported" in refused(llm.chat, conversation, chat_template="{{ messages }}")
    assert "'image_url' is not supported" in refused(
        llm.chat, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    )


def test_tokenizer(llm):
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode("Hello world")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Hello world"
    assert tokenizer.eos_token_id is not None and len(tokenizer) == tokenizer.vocab_size > 40000


def test_tasks_are_the_models(llm, minilm_path):
    assert "cannot embed" in refused(llm.embed, ["a text"])
    assert "cannot embed" in refused(LLM, llm.engine.model_name, runner="pooling")  # the generative model
    embedder = LLM(str(minilm_path), runner="pooling")
    [out] = embedder.embed(["a text"], use_tqdm=False)
    assert isinstance(out, EmbeddingRequestOutput) and out.finished and out.prompt_token_ids
    assert len(out.outputs.embedding) == out.outputs.hidden_size == 384
    assert out.outputs.embedding == pytest.approx(embedder.engine.embed(["a text"])[0].tolist(), abs=1e-6)
    assert "is an embedding model" in refused(embedder.generate, "x")
    assert "truncate_prompt_tokens is not supported" in refused(embedder.embed, ["x"], truncate_prompt_tokens=4)
