"""The live page at / in a real headless Chromium (Debian's chromium and chromedriver, driven by selenium): a
batch's progress moves on the page without a reload, the worker's KV cache shows, and the finished batch offers
its downloads and a link to its own page (test_api_batch_page.py). A screenshot taken mid-batch is kept under tests/artifacts/. With API keys the page asks for one
and sends it."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from cancelled_batch import cancelled_after_three
from serve_process import jsonl
from polling import wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture
def browser(tmp_path):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,800",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.mark.slow
def test_the_live_page_follows_a_batch(fleet, browser):
    client = fleet.server.client()
    lines = [
        {
            "custom_id": f"p{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "smollm2-135m", "prompt": f"The number {i} is", "max_tokens": 8},
        }
        for i in range(300)
    ]
    uploaded = client.files.create(file=("page.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    browser.get(fleet.server.url + "/")
    # the shared style sheet (/page/page.css) applies: 2em of the body's 14px
    assert browser.execute_script("return getComputedStyle(document.body).marginTop") == "28px"
    row = f'tr[data-batch="{batch.id}"]'

    def shown() -> tuple[str, str, str] | None:
        """(status, done, progress bar width) of the batch's row, as the page shows it now (read in one script:
        the page replaces its rows every second)."""
        read = browser.execute_script(
            "const row = document.querySelector(arguments[0]); if (!row) return null;"
            "const cells = row.querySelectorAll('td');"
            "return [cells[2].textContent, cells[4].textContent, row.querySelector('.fill').style.width];",
            row,
        )
        return tuple(read) if read else None

    def links() -> list[tuple[str, str]]:
        return [
            tuple(pair)
            for pair in browser.execute_script(
                "return [...document.querySelectorAll(arguments[0] + ' td:last-child a')].map(a => [a.textContent, a.href]);",
                row,
            )
        ]

    seen = []
    screenshot = ARTIFACTS / "live-page.png"
    screenshot.unlink(missing_ok=True)
    deadline = time.monotonic() + 180
    while (now := wait_for(shown, timeout_s=30)) and now[0] != "completed":
        assert time.monotonic() < deadline, f"the page never showed the batch completed: {seen[-3:]}"
        if not seen or now != seen[-1]:
            seen.append(now)
        if now[1] not in ("0 / 300", "300 / 300") and not screenshot.exists():
            ARTIFACTS.mkdir(exist_ok=True)
            browser.save_screenshot(str(screenshot))
            print(f"screenshot of the live page mid-batch: {screenshot}")
        time.sleep(0.2)
    assert shown()[1] == "300 / 300"
    progress = [done for status, done, width in seen if status == "in_progress"]
    assert len(set(progress)) >= 3, f"the page showed progress {progress}"  # it moved, with no reload
    assert len({width for _, _, width in seen}) >= 3
    assert screenshot.exists()

    worker = browser.execute_script("return document.querySelector('tr[data-worker=\"api-worker\"]').textContent")
    assert "smollm2-135m" in worker and "blocks" in worker
    output_file_id = client.batches.retrieve(batch.id).output_file_id
    assert wait_for(lambda: [text for text, _ in links()] == ["parquet", "output"], timeout_s=10), links()
    assert links()[1][1] == f"{fleet.server.url}/v1/files/{output_file_id}/content"
    batch_link = browser.execute_script("return document.querySelector(arguments[0] + ' td a').href", row)
    assert batch_link == f"{fleet.server.url}/batches/{batch.id}"  # the batch's own page


def test_with_api_keys_the_page_asks_for_one_and_uses_it(serve, redis_url, browser):
    server = serve(redis_url, "--api-key", "page-key")
    client = server.client("page-key")
    uploaded = client.files.create(
        file=(
            "keyed.jsonl",
            jsonl(
                [
                    {
                        "custom_id": "k0",
                        "method": "POST",
                        "url": "/v1/completions",
                        "body": {"prompt": "hi", "max_tokens": 2},
                    }
                ]
            ),
        ),
        purpose="batch",
    )
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    browser.get(server.url + "/")
    visible = "return getComputedStyle(document.getElementById('key-form')).display !== 'none'"
    assert wait_for(lambda: browser.execute_script(visible), timeout_s=10), "the page never asked for a key"
    browser.execute_script(
        "document.getElementById('key').value = 'page-key';document.getElementById('key-save').click();"
    )
    row = f"return document.querySelector('tr[data-batch=\"{batch.id}\"]')?.textContent"
    shown = wait_for(lambda: browser.execute_script(row), timeout_s=10)
    assert shown and "keyed.jsonl" in shown and "0 / 1" in shown
    assert not browser.execute_script(visible)


def test_a_cancelled_batch_shows_what_ran_not_all_done(serve, redis_url, browser):
    batch_id = cancelled_after_three(redis_url)
    server = serve(redis_url)
    status, body = server.get("/v1/fleet")
    assert status == 200
    [shown] = [b for b in json.loads(body)["batches"] if b["id"] == batch_id]
    assert (shown["done"], shown["finished"], shown["cancelled"], shown["total"]) == (10, 3, 7, 10)

    browser.get(server.url + "/")
    read = (
        "const row = document.querySelector(arguments[0]); if (!row) return null;"
        "return [row.querySelectorAll('td')[4].textContent, row.querySelector('.fill').style.width];"
    )
    cells = wait_for(lambda: browser.execute_script(read, f'tr[data-batch="{batch_id}"]'), timeout_s=10)
    assert cells == ["3 / 10, 7 cancelled", "30%"], cells
