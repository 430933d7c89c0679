"""A batch's own page (/batches/{id}) and the fleet's charts on the live page, in a real headless Chromium (as
test_api_page.py drives it) against `miro serve` and a `miro worker` on the default model: the batch's chart
moves while it runs (a screenshot of it is kept under tests/artifacts/), its counts, timeline, first errors and
outputs show, and the data behind them (/v1/fleet/batches/{id}, /v1/fleet/series) reads as the workers wrote it."""

from __future__ import annotations

import json
import time

import pytest
from polling import wait_for
from serve_process import jsonl
from test_api_page import ARTIFACTS, browser  # noqa: F401  (the fixture)


def completion(custom_id: str, max_tokens: int, prompt: str = "Count:") -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens},
    }


def polyline(browser, svg_id: str) -> str | None:  # noqa: F811  (a driver, not the fixture)
    return browser.execute_script(
        "const line = document.querySelector(arguments[0]); return line ? line.getAttribute('points') : null;",
        f"#{svg_id} polyline",
    )


@pytest.mark.slow
def test_a_batch_page_charts_its_run_and_shows_its_errors_and_outputs(fleet, browser):  # noqa: F811
    client = fleet.server.client()
    # one line asks for more tokens than the model's context holds: the worker refuses it, its error shows; the
    # others run long enough for the chart to gain two series points (5 s each) on a fast machine (CI's finished
    # 400 x 16 tokens after one)
    lines = [completion("too-long", 9000), *(completion(f"n{i}", 40, f"The number {i} is") for i in range(400))]
    uploaded = client.files.create(file=("charted.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    browser.get(f"{fleet.server.url}/batches/{batch.id}")
    assert wait_for(
        lambda: browser.execute_script("return document.getElementById('batch-id').textContent") == batch.id,
        timeout_s=10,
    )

    # the tokens/s chart gains points while the batch runs (a worker appends one every 5 s): it moved, no reload
    seen: list[str] = []
    screenshot = ARTIFACTS / "batch-page.png"
    screenshot.unlink(missing_ok=True)
    deadline = time.monotonic() + 240
    while not seen or len(seen[-1].split()) < max(4, len(seen[0].split()) + 2):
        assert time.monotonic() < deadline, f"the batch's chart never moved: {seen}"
        status = browser.execute_script("return document.getElementById('status').textContent")
        points = polyline(browser, "batch-tokens")
        if points and (not seen or points != seen[-1]):
            seen.append(points)
        assert status != "completed", f"the batch completed before its chart moved: {seen}"
        time.sleep(0.5)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(screenshot))
    print(f"screenshot of a batch's page mid-batch: {screenshot}")

    assert wait_for(
        lambda: browser.execute_script("return document.getElementById('status').textContent") == "completed",
        timeout_s=240,
    )
    text = lambda element_id: browser.execute_script(  # noqa: E731
        "return document.getElementById(arguments[0]).textContent", element_id
    )
    assert wait_for(lambda: "401 / 401 ran: 400 completed, 1 failed" in text("counts"), timeout_s=10), text("counts")
    error_row = browser.execute_script(
        "return document.querySelector('#errors tr[data-custom-id=\"too-long\"]')?.textContent"
    )
    assert error_row and "context length" in error_row
    assert browser.execute_script("return document.querySelectorAll('#outputs tr[data-custom-id]').length") == 5
    timeline = [
        row.split("+")[0]
        for row in browser.execute_script(
            "return [...document.querySelectorAll('#timeline tr')].map(tr => tr.cells[0].textContent + '+')"
        )
    ]
    assert timeline[0] == "created" and "in_progress" in timeline and "completed" in timeline

    # the output file is written just after the batch completes (miro serve's background loop)
    detail = wait_for(
        lambda: (d := json.loads(fleet.server.get(f"/v1/fleet/batches/{batch.id}")[1]))["output_file_id"] and d,
        timeout_s=30,
    )
    assert detail, "the batch's output file was never written"
    assert [(e["line"], e["custom_id"]) for e in detail["errors"]] == [(1, "too-long")]
    assert len(detail["series"]) >= 3 and max(p["tokens_per_s"] for p in detail["series"]) > 0
    assert detail["elapsed_s"] > 0 and detail["eta_s"] is None
    assert fleet.server.get("/v1/fleet/batches/batch_0123")[0] == 404

    # the live page's fleet charts: tokens/s of all workers and the KV use of each
    browser.get(fleet.server.url + "/")
    assert wait_for(lambda: polyline(browser, "fleet-tokens"), timeout_s=15)
    assert browser.execute_script("return document.querySelector('#fleet-kv polyline').dataset.label") == "api-worker"
    series = json.loads(fleet.server.get("/v1/fleet/series")[1])
    assert series["step_s"] == 5 and max(p["tokens_per_s"] for p in series["fleet"]) > 0
    assert [w["name"] for w in series["workers"]] == ["api-worker"]
    assert max(p["kv_usage"] for p in series["workers"][0]["points"]) > 0
