"""The folder that lets an interrupted `miro run` be resumed.

A run keeps its state in a folder, OUTPUT.miro-run/ next to the output unless --state-dir says otherwise:

    run.json   what is being run: the dataset (path and sha256), the batch id, the options that shape the results
    redis/     the embedded Redis's data (appendonly.aof), pid file and log (not used with --redis-url)
    parts/     the Parquet part files the worker writes: parts/{batch_id}/part-*.parquet
    lock       locked while a run uses the folder
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from miro.core.errors import MiroError

from miro.cli.common import log_to_stderr


class RunState:
    """The folder that lets an interrupted run be resumed (its layout is in the module docstring)."""

    def __init__(self, folder: str):
        self.shown = folder  # as the user gave it (or OUTPUT.miro-run), for messages
        self.folder = Path(folder).absolute()
        self.record_path = self.folder / "run.json"
        self.redis_dir = self.folder / "redis"
        self.parts_dir = self.folder / "parts"
        self._lock_path = self.folder / "lock"
        self._lock_file = None

    def claim(self, resume: bool, dataset: str, options: dict, which_redis: str, out_path: str) -> dict:
        """Lock the folder and return the run's record: a new one, or (resume) the interrupted run's.

        Raises MiroError when there is nothing to resume, or an interrupted run is there and resume is not asked
        for, or the run asked for is not the one the folder holds.
        """
        if resume and not self.record_path.exists():
            raise MiroError(f"There is no interrupted run in {self.shown} to resume; leave --resume out to start one.")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MiroError(f"Cannot create the run's state folder {self.shown} ({err.strerror or err}).") from None
        self._lock()
        try:
            record = self.load()
            if record is not None and record.get("batch_id") is None:  # it stopped before enqueuing anything
                self.remove(keep_lock=True)
                record = None
            if record is None and resume:
                raise MiroError(
                    f"There is no interrupted run in {self.shown} to resume; leave --resume out to start one."
                )
            if record is None:
                from miro.worker.fleet.intake.submit import output_uri  # a local path made absolute, a URI as given

                record = {
                    "dataset": os.path.abspath(dataset),
                    "dataset_sha256": _sha256(dataset),
                    "output": output_uri(out_path),
                    "redis": which_redis,
                    "options": options,
                    "batch_id": None,
                }
                self.save(record)
                return record
            if not resume:
                done = f" ({record['done']:,} of {record['total']:,} done)" if "done" in record else ""
                raise MiroError(
                    f"{self.shown} holds an interrupted run of {os.path.basename(record['dataset'])}"
                    f"{done}; add --resume to finish it, or delete that folder to start over."
                )
            return self._resumed(record, dataset, options, which_redis)
        except BaseException:
            self.release()
            raise

    def _resumed(self, record: dict, dataset: str, options: dict, which_redis: str) -> dict:
        """The interrupted run's record, once the resumed run is checked to be the same run."""
        start_over = f"or delete {self.shown} to start over"
        if os.path.abspath(dataset) != record["dataset"]:
            raise MiroError(
                f"The interrupted run in {self.shown} is of {record['dataset']}, not {dataset}; resume "
                f"it with that file, {start_over}."
            )
        if which_redis != record["redis"]:
            used = (
                "an embedded Redis; resume it without --redis-url (or MIRO_REDIS_URL)"
                if record["redis"] == "embedded"
                else f"the Redis at {record['redis']}; resume it with that --redis-url"
            )
            raise MiroError(f"The interrupted run in {self.shown} used {used}, {start_over}.")
        changed = [name for name in record["options"] if record["options"][name] != options.get(name)]
        if changed:
            flags = ", ".join(_as_flag(name, record["options"][name]) for name in changed)
            raise MiroError(
                f"The interrupted run in {self.shown} was started with {flags}; resume it with the same "
                f"options, {start_over}."
            )
        sha256 = _sha256(dataset)
        if sha256 != record["dataset_sha256"]:
            log_to_stderr(
                f"Note: {dataset} changed since the interrupted run; requests that finished keep their "
                "results, and only those with none (new custom ids included) run now."
            )
            record = {**record, "dataset_sha256": sha256}
            self.save(record)
        return record

    def has_batch(self) -> bool:
        record = self.load() if self.record_path.exists() else None
        return bool(record and record.get("batch_id"))

    def load(self) -> dict | None:
        try:
            return json.loads(self.record_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise MiroError(f"Cannot read {self.record_path} ({err}); delete {self.shown} to start over.") from None

    def save(self, record: dict) -> None:
        temporary = self.record_path.with_name(f".run.json.tmp-{os.getpid()}")
        try:
            temporary.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(temporary, self.record_path)
        except OSError as err:
            raise MiroError(f"Cannot write {self.record_path} ({err.strerror or err}).") from None

    def _lock(self) -> None:
        self._lock_file = open(self._lock_path, "a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise MiroError(f"Another miro run is using {self.shown} right now.") from None

    def release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def remove(self, keep_lock: bool = False) -> None:
        """Delete what runs put in the folder, then the folder itself if nothing else is in it."""
        shutil.rmtree(self.redis_dir, ignore_errors=True)
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        self.record_path.unlink(missing_ok=True)
        if keep_lock:
            return
        self._lock_path.unlink(missing_ok=True)
        self.release()
        try:
            self.folder.rmdir()
        except OSError:
            pass  # something of the user's is in it


def _as_flag(name: str, value) -> str:
    if name == "structured_outputs":  # {"choice": [...]} was given as --choice, {"json": ...} as --json-schema
        if value is None:
            return "no --json-schema, --regex, --choice or --grammar"
        ((kind, given),) = value.items()
        return f"--{'json-schema' if kind == 'json' else kind} {json.dumps(given)}"
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"no {flag}" if value is None else f"{flag} {value}"


def _sha256(path: str) -> str:
    """The dataset's sha256; a folder's (a saved Hugging Face dataset) over its files' names and bytes, in name
    order."""
    digest = hashlib.sha256()
    files = [Path(path)] if not os.path.isdir(path) else sorted(p for p in Path(path).rglob("*") if p.is_file())
    for file in files:
        if os.path.isdir(path):
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
