"""What submit's one pass over a dataset gathers beside the stored requests: the invalid lines, the models and
OpenAI endpoints the lines name, and the valid requests' custom ids (a dict for a small file, 12 bytes an id for a
big one: seen_ids.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from miro.worker.fleet.intake import tables
from miro.worker.fleet.intake.dataset import DatasetScan, FirstLines
from miro.worker.fleet.intake.inputs import LineError
from miro.worker.fleet.records.payload import Request

BIG_FILE_LINES = 200_000  # from about this many lines custom ids are remembered by hash (seen_ids.SeenIds)
NAMED_MODELS_KEPT = 5  # models the lines name that are remembered: a batch runs on one, so more is a refusal anyway


def seen_ids_for(path: str | Path, fmt: str = "jsonl"):
    """What remembers the file's custom ids: a dict for a small file, 12 bytes an id for a big one (pre-sized by
    the file's size, as growing its table costs twice the memory)."""
    from miro.worker.fleet.intake import seen_ids

    if fmt != "jsonl":
        expected = tables.estimated_rows(path, fmt)
    else:
        expected = seen_ids.estimated_lines(path) if os.path.isfile(path) else 0
    return seen_ids.SeenIds(int(expected * 1.1)) if expected >= BIG_FILE_LINES else FirstLines()


@dataclass
class Read:
    """What one pass over the file gathered beside the stored requests."""

    scan: DatasetScan
    seen: object  # the valid requests' custom ids (dataset.FirstLines or seen_ids.SeenIds)
    errors: list[LineError] = field(default_factory=list)
    # model a line names -> the first line naming it: the first NAMED_MODELS_KEPT (a line per model could name a
    # million), `more_models` when others were named too
    named: dict[str, int] = field(default_factory=dict)
    more_models: bool = False
    endpoints: dict[str, None] = field(default_factory=dict)  # in order of first use (a few known urls)
    validate_s: float = 0.0

    def taken_ids(self) -> set[str]:
        """The valid custom ids an invalid line's name could clash with (invalid_lines.invalid_ids): of the names it
        could take (its own custom id, line-N, line-N-invalid), those `seen` holds. Looked up there rather than
        gathered while reading, which cost a set entry per line of a file without ids (their ids are line-N)."""
        names = set()
        for error in self.errors:
            names.update(
                (error.custom_id, f"line-{error.line}", f"line-{error.line}-invalid")
                if error.custom_id
                else (f"line-{error.line}", f"line-{error.line}-invalid")
            )
        return {cid for cid in names if cid in self.seen}

    def take(self, items: Iterator[Request | LineError], on_line_error) -> Iterator[Request]:
        """The valid requests of `items`, noting the rest."""
        started = time.perf_counter()
        for item in items:
            if isinstance(item, LineError):
                self.errors.append(item)
                if on_line_error is not None:
                    on_line_error(item)
                continue
            if item.requested_model is not None and item.requested_model not in self.named:
                if len(self.named) < NAMED_MODELS_KEPT:
                    self.named[item.requested_model] = item.line
                else:
                    self.more_models = True
            self.endpoints.setdefault(endpoint_of(item))
            yield item
        self.validate_s = time.perf_counter() - started


KIND_ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embedding": "/v1/embeddings"}


def endpoint_of(request: Request) -> str:
    """The OpenAI endpoint a line is for (a simple line's by its kind)."""
    return request.url or KIND_ENDPOINTS.get(request.kind, "")
