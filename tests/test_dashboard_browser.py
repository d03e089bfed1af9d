"""The dashboard in a real browser: headless Chromium (Debian's package, `make browser`) driven by Playwright,
against a real `agl serve --run-dir` holding a run made by a short real training run (the tiny Llama, two steps).
Pages load without console errors, filters change the rows shown, a rollout page shows its calls and rewards,
and the curve has as many points as metrics.jsonl has rows. A screenshot of each page goes to
test-artifacts/screenshots/, where CI keeps it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl.common.processes import ServerProcess, start_server
from agl_trainer.models import build_tiny_llama
from agl_trainer.run.loop import TrainingRun
from tests.test_train_e2e import config

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "screenshots"
TOKEN = "browser-s3cret"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    if os.environ.get("AGL_SKIP_BROWSER_TESTS") == "1":
        pytest.skip("AGL_SKIP_BROWSER_TESTS=1: the browser tests were skipped on request")
    if not CHROMIUM.exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make browser` (Debian's chromium package)")
    root = tmp_path_factory.mktemp("browser")
    run_dir = root / "run"
    TrainingRun(config(run_dir, build_tiny_llama(root / "tiny"), steps=2)).run()
    server = start_server(run_dir, token=TOKEN)  # served after the run, as `agl serve --run-dir` on an old run
    yield server, run_dir
    server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


def test_the_dashboard_shows_a_trained_run(trained: tuple[ServerProcess, Path], browser: Any) -> None:
    server, run_dir = trained
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))

    # the token once in the address: a cookie from then on, and the token leaves the address bar
    page.goto(f"{server.url}/ui?token={TOKEN}")
    assert page.url == f"{server.url}/ui"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    page.wait_for_selector("#curve circle.point")
    assert page.locator("#curve g[data-series=train_reward] circle").count() == len(train) == 2
    assert page.locator("#curve g[data-series=eval_accuracy] circle").count() == len(evals) == 2
    # the curve's lines are lines: a filled polyline shades a polygon under the points
    fills = page.eval_on_selector_all("#curve polyline", "lines => lines.map((l) => getComputedStyle(l).fill)")
    assert len(fills) == 3 and set(fills) == {"none"}
    succeeded = int(page.locator('[data-count="succeeded"]').inner_text())
    assert succeeded == sum(r["succeeded"] for r in train) + len(evals) * 3  # 3 held-out tasks per evaluation
    page.screenshot(path=str(SHOTS / "overview.png"), full_page=True)

    page.click("text=Rollouts")
    every = page.locator("#rollouts tbody tr").count()
    assert every == int(page.locator("#total").inner_text()) == 16 + 6  # 2 steps × 2 tasks × 4, 2 evals × 3
    page.select_option("select[name=mode]", "eval")
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/rollouts?*mode=eval*")
    modes = page.locator("#rollouts tbody tr td:nth-child(3)").all_inner_texts()
    assert modes == ["eval"] * 6
    page.screenshot(path=str(SHOTS / "rollouts.png"), full_page=True)

    page.select_option("select[name=mode]", "train")
    page.fill("input[name=step]", "1")
    page.click("button[type=submit]")
    page.wait_for_url("**step=1*")
    assert page.locator("#rollouts tbody tr").count() == 8
    page.locator("#rollouts tbody tr a").first.click()
    page.wait_for_selector("details.llm")
    text = page.inner_text("main")
    assert "LLM #0" in text and "agent speaker" in text and "answered = 0.1" in text
    assert page.locator("#transitions tbody tr").count() == 1  # the call this rollout trained on, at step 1
    page.locator("details.llm summary").first.click()
    assert page.locator("details.llm .msg.answer").first.is_visible()
    page.screenshot(path=str(SHOTS / "rollout.png"), full_page=True)

    assert problems == []
    page.close()


def test_without_the_token_the_browser_gets_401(trained: tuple[ServerProcess, Path], browser: Any) -> None:
    server, _ = trained
    context = browser.new_context()  # no cookie
    page = context.new_page()
    response = page.goto(f"{server.url}/ui")
    assert response is not None and response.status == 401
    assert page.request.get(f"{server.url}/ui/api/overview").status == 401
    context.close()
