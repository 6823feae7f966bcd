"""The labelling page in a real browser: keys and clicks, undo, a reload, hostile answers, the name form."""

from __future__ import annotations

from browser import screenshot
from label_servers import HOSTILE, read_lines, server_thread, write_pairs


def wait_saved(page, count: int) -> None:
    """Until the page says ``count`` labels of this labeller are saved and shows the next pair (or the end)."""
    page.wait_for_function(
        "n => document.getElementById('progress').textContent.includes(`you: ${n}`) || (n === 0)", arg=count
    )
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('saved') || "
                           "document.getElementById('status').textContent.startsWith('undone')")  # fmt: skip


def shown(page) -> tuple[str, str]:
    return page.inner_text("#left .text"), page.inner_text("#right .text")


def test_label_ten_pairs_with_keys_and_clicks_undo_reload_and_check_the_file(browser, tmp_path):
    pairs, out = write_pairs(tmp_path / "pairs.jsonl", 12, hostile=True), tmp_path / "prefs.jsonl"
    by_prompt = {line["prompt"]: line for line in read_lines(pairs)}
    with server_thread(pairs, out) as base:
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(base + "/")
        page.fill("#labeller", "ana")
        page.click("button[type=submit]")
        page.wait_for_selector("#left .text .para")
        # the hostile answer is text on the page: no script ran, no element was made from it
        assert HOSTILE in (page.inner_text("#left .text") + page.inner_text("#right .text"))
        assert page.title() == "rlhf label" and page.locator("#work img, #work script").count() == 0
        expected = []  # (prompt, chosen text, rejected text, kind) per label, in order
        actions = ["1", "2", "click-left", "t", "click-right", "s", "1", "click-tie", "2", "1"]
        for i, action in enumerate(actions):
            prompt = page.inner_text("#prompt .message div:last-child")
            left, right = shown(page)
            if action == "click-left":
                page.click("#choose-left")
            elif action == "click-right":
                page.get_by_role("button", name="👎bad").first.click()  # a rating of answer 1 first
                page.click("#choose-right")
            elif action == "click-tie":
                page.click("#tie")
            else:
                page.keyboard.press(action)
            kind = {"t": "tie", "click-tie": "tie", "s": "skip"}.get(action, "preference")
            first_wins = action in ("1", "click-left")
            expected.append((prompt, left if first_wins else right, right if first_wins else left, kind))
            wait_saved(page, i + 1)
        screenshot(page, "label-page")
        # undo the last label ("1"): the same pair comes back, then label it the other way with a click
        page.keyboard.press("u")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('undone')")
        prompt = page.inner_text("#prompt .message div:last-child")
        assert prompt == expected[-1][0]
        left, right = shown(page)
        page.reload()  # a reload shows the same pair, the same way round
        page.wait_for_selector("#left .text .para")
        assert shown(page) == (left, right) and page.inner_text("#prompt .message div:last-child") == prompt
        page.click("#choose-right")
        wait_saved(page, 10)
        expected[-1] = (prompt, right, left, "preference")
        assert page.inner_text("#progress").startswith("9 / 12 · you: 10")  # a skip decides nothing
        assert not errors
    rows = read_lines(out)
    labels = rows[1:]
    assert [row["kind"] for row in labels] == [kind for *_, kind in expected[:9]] + [
        "preference",
        "retraction",
        "preference",
    ]
    live = labels[:9] + labels[11:]
    assert labels[10]["retracts"] == labels[9]["id"]
    for row, (prompt, chosen, rejected, kind) in zip(live, expected, strict=True):
        source = by_prompt[prompt]
        assert row["prompt"] == prompt and row["labeller"] == "ana" and row["source"] == "human"
        assert row["seconds"] is not None and row["seconds"] >= 0
        if kind == "preference":
            assert (row["chosen"], row["rejected"]) == (chosen, rejected)
            assert {row["chosen"], row["rejected"]} == {source["a"], source["b"]}
        else:
            assert (row["a"], row["b"]) == (source["a"], source["b"])
    rated = live[4]
    assert rated["ratings"] == {"rejected": "bad"}  # 👎 under answer 1, then answer 2 chosen


def test_the_done_screen_and_a_narrow_phone_screen(browser, tmp_path):
    pairs, out = write_pairs(tmp_path / "pairs.jsonl", 2), tmp_path / "prefs.jsonl"
    with server_thread(pairs, out) as base:
        page = browser.new_page(viewport={"width": 390, "height": 844})  # a phone
        page.goto(base + "/?labeller=bo")
        page.wait_for_selector("#left .text .para")
        left_box, right_box = page.locator("#left").bounding_box(), page.locator("#right").bounding_box()
        assert right_box["y"] > left_box["y"] + left_box["height"] - 1  # stacked, not side by side
        assert left_box["width"] <= 390
        screenshot(page, "label-page-phone")
        for i in range(2):
            page.keyboard.press("1")
            wait_saved(page, i + 1)
        page.wait_for_selector("#done:not([hidden])")
        assert "You labelled 2 pairs" in page.inner_text("#done-summary")
        screenshot(page, "label-done")
