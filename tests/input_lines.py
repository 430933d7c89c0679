"""Writing JSONL datasets for the tests of miro.worker.fleet.intake.inputs (test_inputs.py, test_input_errors.py)."""

import json
from pathlib import Path

from miro.worker.fleet.intake.dataset import ParseResult, parse_dataset
from miro.worker.fleet.intake.inputs import LineError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def write(path: Path, *lines) -> Path:
    """Write lines (dict -> JSON, str as is, bytes as is), one per line."""
    data = b"".join(
        (line if isinstance(line, bytes) else (json.dumps(line) if isinstance(line, dict) else line).encode()) + b"\n"
        for line in lines
    )
    path.write_bytes(data)
    return path


def parse(tmp_path, *lines, **kwargs) -> ParseResult:
    return parse_dataset(write(tmp_path / "data.jsonl", *lines), **kwargs)


def only_error(tmp_path, *lines, **kwargs) -> LineError:
    result = parse(tmp_path, *lines, **kwargs)
    assert len(result.errors) == 1, result.errors
    return result.errors[0]


def openai(custom_id="c1", url=CHAT, **body):
    if "messages" not in body and "prompt" not in body:
        body = {**({"messages": [{"role": "user", "content": "hi"}]} if url == CHAT else {"prompt": "hi"}), **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}
