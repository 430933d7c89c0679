"""The `miro` command on the default model: generate, models, and errors as one sentence."""

import re

from click.testing import CliRunner

from miro.cli.main import cli


def test_generate_chat_greedy(smollm2_path):
    # f32 pinned: its float32 numerics are HF's, whose greedy answer this is (native's 8-bit activations, auto's
    # choice on tiers where they are faster, answer "L'Étoile, la Marseillaise," here)
    result = CliRunner().invoke(
        cli,
        [
            "generate",
            "--model",
            str(smollm2_path),
            "--chat",
            "--max-tokens",
            "12",
            "--num-kv-blocks",
            "64",
            "--weights",
            "f32",
            "What is the capital of France?",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output


def test_generate_verbose_names_the_weights_and_the_cpu_tier(tiny_model):
    """-v says on stderr what was loaded, the CPU tier the kernels run among it; stdout is the completion alone."""
    from miro.core.kernels import cpu

    args = ["generate", "--model", tiny_model, "--max-tokens", "3", "--num-kv-blocks", "8", "--weights", "native", "hi"]
    result = CliRunner().invoke(cli, [*args[:-1], "-v", "hi"])
    assert result.exit_code == 0, result.output
    assert re.search(
        r"^Loaded .*tiny\.gguf \(llama\), weights: native \(asked for\); cpu tier (\S+).*; "
        r"KV cache 128 tokens \(float16\)$",
        result.stderr,
        re.M,
    )
    assert f"cpu tier {cpu.TIER.name}" in result.stderr and cpu.TIER.name in cpu.TIERS
    assert "cpu tier" not in result.stdout
    quiet = CliRunner().invoke(cli, args)
    assert quiet.exit_code == 0 and "cpu tier" not in quiet.output and quiet.stdout == result.stdout


def test_generate_bad_sampling_option_is_one_sentence(smollm2_path):
    result = CliRunner().invoke(cli, ["generate", "--model", str(smollm2_path), "--top-p", "0", "hi"])
    assert result.exit_code == 1
    assert result.output == "Error: top_p must be in (0, 1], got 0.0.\n"


def test_generate_prompt_too_long_is_one_sentence(smollm2_path):
    result = CliRunner().invoke(
        cli,
        [
            "generate",
            "--model",
            str(smollm2_path),
            "--max-model-len",
            "16",
            "--num-kv-blocks",
            "8",
            "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
        ],
    )
    # a cold numba cache adds a line before it ("compiling N kernel families ahead"): the error is the last line
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 1 and len(errors) == 1 and errors[0].startswith("Error: the prompt has ")
    assert result.output.splitlines()[-1] == errors[0] and "Traceback" not in result.output


def test_kv_cache_options(smollm2_path):
    """--kv-cache-dtype float32 answers as the float16 default does here; a block size that is not a multiple
    of 16 is one sentence."""
    answers = {}
    for dtype in ("float16", "float32"):
        result = CliRunner().invoke(
            cli,
            [
                "generate",
                "--model",
                str(smollm2_path),
                "--chat",
                "--max-tokens",
                "12",
                "--kv-cache-dtype",
                dtype,
                "--num-kv-blocks",
                "64",
                "--weights",
                "f32",
                "What is the capital of France?",
            ],
        )  # HF's float32 numerics: Paris
        assert result.exit_code == 0, result.output
        answers[dtype] = result.output
    assert "Paris" in answers["float32"] and answers["float16"] == answers["float32"]
    odd = CliRunner().invoke(cli, ["generate", "--model", str(smollm2_path), "--block-size", "24", "hi"])
    assert odd.exit_code == 1
    assert odd.output == "Error: the KV cache's block size must be a multiple of 16 tokens, not 24.\n"


def test_models_list_and_pull(monkeypatch, tmp_path, smollm2_path):
    monkeypatch.setenv("MIRO_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / smollm2_path.name).symlink_to(smollm2_path)
    listed = CliRunner().invoke(cli, ["models", "list"])
    assert listed.exit_code == 0 and "smollm2-135m" in listed.output and "pulled" in listed.output
    pulled = CliRunner().invoke(cli, ["models", "pull"])  # already in the cache: no download
    assert pulled.exit_code == 0 and pulled.output.strip().endswith(smollm2_path.name)
    unknown = CliRunner().invoke(cli, ["models", "pull", "gpt-17"])
    assert unknown.exit_code == 1 and "unknown model alias 'gpt-17'" in unknown.output


def test_threads_option_caps_blas_and_numba_pools(smollm2_path):
    """--threads in a process of its own (it changes the process's thread pools)."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, numba\n"
        "from threadpoolctl import threadpool_info\n"
        "from click.testing import CliRunner\n"
        "from miro.cli.main import cli\n"
        f"r = CliRunner().invoke(cli, ['generate', '--model', {str(smollm2_path)!r}, '--max-tokens', '2', "
        "'--num-kv-blocks', '16', '--threads', '1', 'hi'])\n"
        "assert r.exit_code == 0, r.output\n"
        "blas = [p['num_threads'] for p in threadpool_info() if p['internal_api'] == 'openblas']\n"
        "print(json.dumps({'blas': blas, 'numba': numba.get_num_threads()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    threads = json.loads(out.stdout.strip().splitlines()[-1])
    assert threads["blas"] and set(threads["blas"]) == {1} and threads["numba"] == 1


def test_options_and_keyword_arguments_take_their_defaults_from_one_module():
    """core/defaults.py is the one home of a default: the commands' options and the classes' keyword
    arguments show the same values."""

    from miro.core import EngineConfig, defaults
    from miro.worker.fleet.intake.submit import SubmitOptions
    from miro.worker.process.worker_config import WorkerConfig

    def option(command: str, name: str):
        return next(p.default for p in cli.commands[command].params if p.name == name)

    engine = EngineConfig()
    for command in ("worker", "run", "generate"):
        assert option(command, "kv_cache_memory") == engine.kv_cache_memory == defaults.KV_CACHE_MEMORY
        assert option(command, "max_num_seqs") == engine.max_num_seqs == defaults.MAX_NUM_SEQS
        assert option(command, "weights") == engine.weights == defaults.WEIGHTS
        assert option(command, "kv_cache_dtype") == engine.kv_cache_dtype == defaults.KV_CACHE_DTYPE
        assert option(command, "block_size") == engine.block_size == defaults.BLOCK_SIZE
    assert option("worker", "flush_rows") == WorkerConfig().flush_rows == defaults.FLUSH_ROWS
    assert option("worker", "flush_seconds") == WorkerConfig().flush_seconds == option("run", "flush_seconds")
    assert option("worker", "heartbeat_slack_s") == WorkerConfig().heartbeat_slack_s == defaults.HEARTBEAT_SLACK_S
    assert option("submit", "output") == SubmitOptions().output == defaults.OUTPUT
    assert int(option("submit", "job_timeout")) == SubmitOptions().job_timeout == defaults.JOB_TIMEOUT_S
    assert option("submit", "completion_window") == SubmitOptions().completion_window == defaults.COMPLETION_WINDOW


def test_every_engine_option_is_a_flag_and_an_environment_variable_of_every_command_that_loads_a_model():
    """The options come from EngineConfig's fields (cli/common.engine_options): none can be missing anywhere."""
    from dataclasses import fields

    from miro.core import EngineConfig

    for command in ("worker", "run", "generate", "embed"):
        params = {p.name: p for p in cli.commands[command].params}
        for f in fields(EngineConfig):
            assert f.name in params, (command, f.name)
            assert params[f.name].envvar == f"MIRO_{f.name.upper()}"
            assert params[f.name].default == f.default, (command, f.name)


def test_engine_options_from_the_environment_are_parsed_and_a_bad_value_is_one_sentence():
    import pytest

    from miro.core import EngineConfig, MiroError

    env = {
        "MIRO_KV_CACHE_MEMORY": "2GiB",
        "MIRO_MAX_NUM_SEQS": "8",
        "MIRO_BATCH_INVARIANT": "off",
        "MIRO_ENABLE_CHUNKED_PREFILL": "false",
        "MIRO_EMBED_BATCH_TOKENS": "512",
        "MIRO_UNRELATED": "x",
    }
    assert EngineConfig.from_env(env) == {
        "kv_cache_memory": "2GiB",
        "max_num_seqs": 8,
        "batch_invariant": False,
        "enable_chunked_prefill": False,
        "embed_batch_tokens": 512,
    }
    EngineConfig.of(EngineConfig.from_env(env))  # every name is an option
    for bad, says in [
        ({"MIRO_MAX_NUM_SEQS": "many"}, "MIRO_MAX_NUM_SEQS='many': give a whole number."),
        ({"MIRO_BLOCK_SIZE": "8"}, "MIRO_BLOCK_SIZE='8': give a number of at least 16."),
        ({"MIRO_WEIGHTS": "int3"}, "MIRO_WEIGHTS='int3': give one of auto, f32, native, bf16, i16."),
        ({"MIRO_BATCH_INVARIANT": "maybe"}, "MIRO_BATCH_INVARIANT='maybe': give one of"),
    ]:
        with pytest.raises(MiroError) as err:
            EngineConfig.from_env(bad)
        assert str(err.value).startswith(says)


def test_worker_options_come_from_worker_config_and_its_environment():
    """`miro worker`'s own options are WorkerConfig's fields; a worker started by `rq worker -w` reads the same
    names from the environment, and a keyword given to BatchWorker wins over both."""
    from dataclasses import fields

    import pytest

    from miro.core import MiroError
    from miro.worker.process.worker_config import WorkerConfig

    params = {p.name: p for p in cli.commands["worker"].params}
    for f in fields(WorkerConfig):
        assert params[f.name].envvar == f"MIRO_{f.name.upper()}"
    env = {
        "MIRO_MODEL": "tiny",
        "MIRO_SERVED_MODEL_NAMES": "gpt-4o-mini, other",
        "MIRO_FLUSH_ROWS": "8",
        "MIRO_SHUTDOWN_GRACE_S": "2.5",
    }
    config = WorkerConfig.of({"flush_rows": 3, "metrics_port": None}, env)
    assert (config.model, config.served_model_names, config.flush_rows, config.shutdown_grace_s) == (
        "tiny",
        ("gpt-4o-mini", "other"),
        3,
        2.5,
    )
    with pytest.raises(MiroError, match="the worker has no option 'flush_every'"):
        WorkerConfig.of({"flush_every": 3}, {})
    with pytest.raises(MiroError, match=r"MIRO_METRICS_PORT='70000': give a number of at most 65535\."):
        WorkerConfig.of({}, {"MIRO_METRICS_PORT": "70000"})


def test_submit_options_are_one_record_and_an_unknown_one_is_refused():
    import pytest

    from miro.core import MiroError
    from miro.worker.fleet.intake.submit import SubmitOptions, submit

    assert SubmitOptions.of({"model": "m", "skip_invalid": True}) == SubmitOptions(model="m", skip_invalid=True)
    with pytest.raises(MiroError, match="submit has no option 'skip_invalids'"):
        submit(None, "unused.jsonl", dry_run=True, skip_invalids=True)
