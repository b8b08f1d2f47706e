"""`agentgym view` in headless Chromium (Debian's chromium, driven by Playwright; no browser download):
open the page, filter, click into a trajectory and step through it, compare two policies on one
task, read a training run's learning curves. Screenshots are kept in tests/artifacts/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveServer

from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.store import EvalStore
from agentgym.eval.viewer.server import create_viewer_app
from agentgym.rollout.episode_log import EpisodeLog
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    yield opened
    context.close()


def wait_for_rows(page: Any, count: int) -> None:
    """Wait until the episode list shows `count` rows; on a timeout, say what the list shows instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"document.querySelectorAll('.episode-row').length === {count}")
    except PlaywrightTimeout:
        shown = page.locator(".episode-row").count()
        raise AssertionError(f"expected {count} episode rows, the page shows {shown}; "
                             f"list status: {page.inner_text('#list-count')!r}") from None


def open_viewer(page: Any, folder: Path) -> LiveServer:
    server = LiveServer(create_viewer_app(folder))
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready=true]")
    return server


def test_replay_filter_and_compare_an_evaluation(tmp_path: Path, page: Any) -> None:
    plan = EvalPlan((parse_policy("random"), parse_policy("expert")), (EnvEntry("maze-v0", {"size": 2}),),
                    tuple(range(4)))
    Evaluation(plan, tmp_path).run()
    expert = EvalStore(tmp_path).records("maze-v0", "expert")
    server = open_viewer(page, tmp_path)
    try:
        assert page.locator(".episode-row").count() == 8
        page.select_option("#f-policy", "expert")
        wait_for_rows(page, 4)
        page.locator(".episode-row").first.click()
        page.wait_for_selector("#episode:not([hidden])")
        head = page.inner_text("#episode-head")
        assert "maze-v0 · expert" in head and "✓ success" in head and "seed 0" in head
        first = expert[0]["turns"]
        assert page.inner_text("#turn-pos") == f"turn 1 of {len(first)}"
        assert page.inner_text(".current .f-action span") == first[0]["action"]
        assert page.inner_text(".current .f-state-key span") == first[0]["state_key"]
        assert page.inner_text(".current .f-observation pre") == expert[0]["observation"]
        page.click("#turn-next")
        assert page.inner_text("#turn-pos") == f"turn 2 of {len(first)}"
        # What the agent saw next.
        assert page.inner_text(".current .f-observation pre") == first[0]["observation"]
        assert page.inner_text(".current .f-action span") == first[1]["action"]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "viewer_episode.png"), full_page=True)

        page.select_option("#f-policy", "")
        page.select_option("#f-success", "false")
        page.wait_for_function("[...document.querySelectorAll('.episode-row')]"
                               ".every(r => r.textContent.startsWith('✗'))")

        page.click("#tab-compare")
        page.select_option("#cmp-task", "0")
        page.wait_for_function("document.querySelector('#cmp-col-b .card') !== null")
        left, right = page.inner_text("#cmp-col-a"), page.inner_text("#cmp-col-b")
        assert "maze-v0 · random" in left and "maze-v0 · expert" in right
        assert page.locator("#cmp-col-b .turn-card").count() == len(first)
        page.screenshot(path=str(ARTIFACTS / "viewer_compare.png"), full_page=True)

        page.click("#tab-summary")
        assert page.locator("#results-table tbody tr").count() == 2
        assert ("expert is better than random" in page.inner_text("#results")
                or "not significant" in page.inner_text("#results"))
    finally:
        server.stop()


def test_overlapping_filter_changes_show_the_latest_and_a_failed_load_says_why(tmp_path: Path,
                                                                            page: Any) -> None:
    plan = EvalPlan((parse_policy("random"), parse_policy("expert")), (EnvEntry("maze-v0", {"size": 2}),),
                    tuple(range(3)))
    Evaluation(plan, tmp_path).run()
    server = open_viewer(page, tmp_path)
    held: list[Any] = []
    try:
        # The answer for "expert" is held back until the answer for "random" has filled the list.
        def hold(route: Any) -> None:
            held.append(route)

        page.route("**/api/episodes?policy=expert*", hold)
        page.select_option("#f-policy", "expert")
        for _ in range(100):
            if held:
                break
            page.wait_for_timeout(50)
        page.select_option("#f-policy", "random")
        wait_for_rows(page, 3)
        assert len(held) == 1
        held[0].continue_()
        page.wait_for_timeout(500)
        assert all("random" in text for text in page.locator(".episode-row").all_inner_texts())

        page.route("**/api/episodes?*success=*", lambda route: route.fulfill(
            status=500, content_type="application/json",
            body=json.dumps({"error": {"message": "the store is unreadable"}})))
        page.select_option("#f-success", "true")
        page.wait_for_function("document.querySelector('#list-count').textContent.includes('unreadable')")
        assert "could not load the episodes" in page.inner_text("#list-count")
    finally:
        server.stop()


def test_training_run_iterations_advantages_and_learning_curves(tmp_path: Path, page: Any) -> None:
    overrides = ["iterations=2", "checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=2",
                 "eval.num_episodes=2", "sft.num_episodes=2", "sft.num_epochs=1", "env.max_turns=3"]
    train(load_config(None, overrides), tmp_path)
    # A run that records per-turn advantages (in the turn's extras) shows them.
    first_file = tmp_path / "trajectories" / "iter_00001.jsonl"
    episodes = EpisodeLog(first_file, 1).read()
    episodes[0]["turns"][0]["extras"]["advantage"] = 0.625
    EpisodeLog(first_file, 1).write(episodes)
    server = open_viewer(page, tmp_path)
    try:
        assert "training run" in page.inner_text("#subtitle")
        assert page.locator(".episode-row").count() == 8  # 2 iterations × 2 tasks × 2 episodes
        page.select_option("#f-iteration", "2")
        wait_for_rows(page, 4)
        assert all("it 2" in t for t in page.locator(".episode-row").all_inner_texts())
        page.select_option("#f-iteration", "1")
        page.wait_for_function("document.querySelector('.episode-row').textContent.includes('it 1')")
        page.locator(".episode-row").first.click()
        page.wait_for_selector("#episode:not([hidden])")
        assert page.inner_text(".current .f-advantage span") == "0.6250"
        page.click(".current .f-prompt summary")
        prompt = page.locator(".current .f-prompt pre").inner_text()
        assert "<|im_start|>" in prompt  # decoded with the run's tokenizer
        first_action = episodes[0]["turns"][0]["action"]
        assert page.inner_text(".current .f-action span") == first_action
        page.click("#tab-summary")
        assert page.inner_text("#tab-summary") == "Learning curves"
        page.wait_for_selector("svg.curve path", state="attached")  # a flat curve has no height
        assert page.input_value("#curve-metric") == "rollout/success_rate"
        assert "rollout/success_rate: 2 points" in page.inner_text("#curves")
        page.screenshot(path=str(ARTIFACTS / "viewer_curves.png"), full_page=True)
    finally:
        server.stop()


def test_viewer_refuses_a_folder_that_is_neither(tmp_path: Path) -> None:
    from agentgym.errors import ConfigError

    with pytest.raises(ConfigError, match="holds neither an evaluation .* nor a training run"):
        create_viewer_app(tmp_path)


def test_long_lists_and_long_episodes_come_in_pages(tmp_path: Path, page: Any) -> None:
    plan = EvalPlan((parse_policy("random"), parse_policy("expert")), (EnvEntry("maze-v0", {"size": 2}),),
                    tuple(range(130)))
    Evaluation(plan, tmp_path).run()
    # The first random episode made 45 turns long (from its own turns), so it needs three pages.
    log = EvalStore(tmp_path).path("maze-v0", "random")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    own = records[0]["turns"]
    records[0]["turns"] = [{**own[k % len(own)], "action": f"move-{k}", "observation": f"after move {k}"}
                           for k in range(45)]
    records[0]["num_turns"] = 45
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    server = open_viewer(page, tmp_path)
    try:
        assert page.inner_text("#list-count") == "260 episodes (100 shown)"
        assert page.locator(".episode-row").count() == 100
        page.click("#list-more")
        wait_for_rows(page, 200)
        page.click("#list-more")
        wait_for_rows(page, 260)
        assert page.locator("#list-more").is_hidden() and page.inner_text("#list-count") == "260 episodes"
        assert len({row.get_attribute("data-id") for row in page.locator(".episode-row").all()}) == 260

        page.locator(".episode-row").first.click()
        page.wait_for_selector("#episode:not([hidden])")
        assert page.inner_text("#turn-pos") == "turn 1 of 45"
        assert "45 turns" in page.inner_text("#episode-head")
        assert not any("turn_offset=20" in url for url in requested)
        for _ in range(20):
            page.click("#turn-next")
        page.wait_for_function("document.querySelector('#turn-pos').textContent === 'turn 21 of 45'")
        assert any("turn_offset=20" in url for url in requested)  # the second page, fetched when reached
        assert page.inner_text(".current .f-action span") == "move-20"
        assert page.inner_text(".current .f-observation pre") == "after move 19"
        page.click("#turn-prev")
        assert page.inner_text(".current .f-action span") == "move-19"

        page.check("#show-all")
        assert page.locator("#turn-list .turn-card").count() == 40
        assert page.inner_text("#turns-more") == "more turns (40 of 45 shown)"
        page.click("#turns-more")
        page.wait_for_function("document.querySelectorAll('#turn-list .turn-card').length === 45")
        assert page.locator("#turns-more").is_hidden()

        page.click("#tab-compare")
        page.select_option("#cmp-task", "0")
        page.wait_for_function("document.querySelectorAll('#cmp-col-a .turn-card').length === 20")
        page.click("#cmp-col-a .cmp-more")
        page.wait_for_function("document.querySelectorAll('#cmp-col-a .turn-card').length === 40")
        assert page.inner_text("#cmp-col-a .cmp-more") == "more turns (40 of 45 shown)"
    finally:
        server.stop()


def test_a_token_is_asked_once_and_kept_in_an_httponly_cookie(tmp_path: Path, page: Any) -> None:
    plan = EvalPlan((parse_policy("expert"),), (EnvEntry("maze-v0", {"size": 2}),), tuple(range(2)))
    Evaluation(plan, tmp_path).run()
    server = LiveServer(create_viewer_app(tmp_path, token="open-sesame"))
    try:
        page.goto(server.url + "/")
        page.fill("#token", "wrong")
        page.click("button[type=submit]")
        page.wait_for_selector("#problem:has-text('That token is wrong.')")
        page.fill("#token", "open-sesame")
        page.click("button[type=submit]")
        page.wait_for_selector("body[data-ready=true]")
        assert page.url == server.url + "/" and page.locator(".episode-row").count() == 2
        cookies = page.context.cookies()
        assert len(cookies) == 1 and cookies[0]["httpOnly"] and "open-sesame" not in cookies[0]["value"]
        assert page.evaluate("document.cookie") == ""  # out of reach of any script on the page

        page.context.clear_cookies()
        page.goto(server.url + "/?token=open-sesame")
        page.wait_for_selector("body[data-ready=true]")
        assert page.url == server.url + "/"  # the token does not stay in the address bar
    finally:
        server.stop()
