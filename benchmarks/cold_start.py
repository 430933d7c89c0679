"""Cold start of `miro run`: wall time from the command to its first token and to its end, on a fresh clone.

    python benchmarks/cold_start.py [--before REV] [--after REV|worktree] [--rounds 2] [--dataset FILE]

Each tree (a git revision, or `worktree`: the files as they are now) is laid out as a fresh clone would be
installed (the package folders of pyproject.toml's package-dir, no __pycache__ anywhere) in a temporary folder
and put first on PYTHONPATH. Per round and tree, in turn:

- cold: `miro run DATASET -o results.parquet` with NUMBA_CACHE_DIR an empty folder (numba's own default, the
  __pycache__ folders next to the sources, is empty too: the copy has none);
- warm: the same command again on the cache the cold run left.

The command runs under a thin wrapper (this file with --child) that notes, from the interpreter's start: the
engine's module imported, the model loaded (Engine.from_model returned), the first token (the first Engine.step
that returned an output), and the number and time of numba's compilations (numba's "numba:compile" events, the
outermost ones; a kernel loaded from the cache is not one). The parent measures the wall to the process's end.
Medians over the rounds. The machine is shared: say so beside any figure quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the child: miro run, with its moments noted


def _cpu_seconds(children: bool = False) -> float:
    """This process's CPU time so far, all its threads, user and system (children: that of the child processes
    it has waited for, such as the ones compiling ahead): on a shared machine, what the wall would be without the
    neighbours' load and without overlap."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child(notes_path: str, argv: list[str]) -> None:
    started = float(os.environ["COLD_START_T0"])  # the parent's time.time() just before it started this process
    notes: dict = {"compiles": 0, "compile_s": 0.0}

    def note(name: str) -> None:
        if name not in notes:
            notes[name] = time.time() - started
            notes[name.replace("_s", "_cpu_s")] = _cpu_seconds()
            notes[name.replace("_s", "_children_cpu_s")] = _cpu_seconds(children=True)

    import atexit
    import threading

    from numba.core import event

    depth = threading.local()

    class Compiles(event.Listener):
        def on_start(self, ev):
            stack = getattr(depth, "stack", None)
            if stack is None:
                stack = depth.stack = []
            stack.append(time.perf_counter())

        def on_end(self, ev):
            t0 = depth.stack.pop()
            if not depth.stack:  # the outermost compilation of this thread: what the caller waited for
                notes["compiles"] += 1
                notes["compile_s"] += time.perf_counter() - t0

    event.register("numba:compile", Compiles())
    atexit.register(lambda: Path(notes_path).write_text(json.dumps({**notes, "end_cpu_s": _cpu_seconds()})))

    from miro.core.engine import engine as engine_module

    note("imported_s")
    from_model, step = engine_module.Engine.from_model.__func__, engine_module.Engine.step

    def noted_from_model(cls, *args, **kwargs):
        loaded = from_model(cls, *args, **kwargs)
        note("loaded_s")
        return loaded

    def noted_step(self):
        outputs = step(self)
        if outputs:
            note("first_token_s")
        return outputs

    engine_module.Engine.from_model = classmethod(noted_from_model)
    engine_module.Engine.step = noted_step

    from miro.cli.main import cli

    cli.main(argv, prog_name="miro")


# ---------------------------------------------------------------- the parent: trees, rounds, medians


def _package_dirs(tree: Path) -> dict[str, str]:
    setup = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {package: setup["package-dir"][package] for package in setup["packages"] if package in setup["package-dir"]}


def lay_out(rev: str, into: Path) -> Path:
    """The tree at `rev` (or the working tree's files) as an importable folder: into/site/miro/... ."""
    source = into / "source"
    if rev == "worktree":
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout.split("\n")
        for name in filter(None, listed):
            if (REPO / name).is_file():
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, source / name)
    else:
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    site = into / "site"
    for package, folder in sorted(_package_dirs(source).items()):  # parents first: "miro" before "miro.core"
        target = site / package.replace(".", "/")
        target.mkdir(parents=True, exist_ok=True)
        for item in (source / folder).iterdir():
            if item.is_file() and item.suffix == ".py":
                shutil.copy2(item, target / item.name)
    return site


def run_once(site: Path, cache: Path, dataset: str, work: Path) -> dict:
    notes_path = work / "notes.json"
    notes_path.unlink(missing_ok=True)
    output = work / "results.parquet"
    env = {**os.environ, "PYTHONPATH": str(site), "NUMBA_CACHE_DIR": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(notes_path),
        "--",
        "run",
        dataset,
        "-o",
        str(output),
    ]
    t0 = time.time()
    env["COLD_START_T0"] = repr(t0)
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
    wall = time.time() - t0
    if done.returncode != 0:
        raise SystemExit(f"miro run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    notes = json.loads(notes_path.read_text())
    shutil.rmtree(output, ignore_errors=True) if output.is_dir() else output.unlink(missing_ok=True)
    return {**notes, "end_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, help="git revision of the 'before' tree (omit: only --after)")
    parser.add_argument("--after", default="worktree", help="git revision, or worktree (default): the files now")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dataset", default=str(REPO / "examples" / "prompts.jsonl"))
    parser.add_argument("--json", default=None, help="also write every run's figures to this file")
    args = parser.parse_args()

    from miro.core.kernels import cpu

    trees = {name: rev for name, rev in (("before", args.before), ("after", args.after)) if rev}
    root = Path(tempfile.mkdtemp(prefix="miro-cold-"))
    runs: list[dict] = []
    try:
        sites = {name: lay_out(rev, root / name) for name, rev in trees.items()}
        print(
            f"{cpu.describe()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; "
            f"trees: {', '.join(f'{n}={r}' for n, r in trees.items())}; dataset {args.dataset}",
            flush=True,
        )
        for round_ in range(args.rounds):
            for name, site in sites.items():
                work = root / f"{name}-work"
                work.mkdir(exist_ok=True)
                cache = root / f"{name}-numba-{round_}"
                for state in ("cold", "warm"):
                    figures = {
                        "tree": name,
                        "state": state,
                        "round": round_,
                        **run_once(site, cache, args.dataset, work),
                    }
                    runs.append(figures)
                    print(
                        f"round {round_} {name:6} {state}: first token {figures.get('first_token_s', -1):6.1f} s, "
                        f"end {figures['end_s']:6.1f} s (imported {figures.get('imported_s', -1):.1f}, "
                        f"loaded {figures.get('loaded_s', -1):.1f}; {figures['compiles']} compilations, "
                        f"{figures['compile_s']:.1f} s; CPU {figures.get('first_token_cpu_s', -1):.1f} s to the "
                        f"first token (+{figures.get('first_token_children_cpu_s', -1):.1f} s in child processes), "
                        f"{figures['end_cpu_s']:.1f} s in all)",
                        flush=True,
                    )
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nmedians over", args.rounds, "rounds (wall seconds from the command):")
    print(
        f"{'tree':8} {'state':6} {'first token':>12} {'end':>8} {'compilations':>13} {'compiling':>10} "
        f"{'CPU to 1st':>11} {'CPU in all':>11}"
    )
    for name in trees:
        for state in ("cold", "warm"):
            these = [r for r in runs if r["tree"] == name and r["state"] == state]
            print(
                f"{name:8} {state:6} {statistics.median(r['first_token_s'] for r in these):12.1f} "
                f"{statistics.median(r['end_s'] for r in these):8.1f} "
                f"{statistics.median(r['compiles'] for r in these):13.0f} "
                f"{statistics.median(r['compile_s'] for r in these):10.1f} "
                f"{statistics.median(r['first_token_cpu_s'] for r in these):11.1f} "
                f"{statistics.median(r['end_cpu_s'] for r in these):11.1f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[4:])
    else:
        main()
