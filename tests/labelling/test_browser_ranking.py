"""Ranking k answers on the page in a real browser: keys and clicks, ties, take-out, clear, undo, a reload, a phone
by tapping, and the actions a person needs (the page's own count, <body data-actions>) against labelling pairs."""

from __future__ import annotations

import json

import pytest
from browser import screenshot
from label_servers import HOSTILE, grade, read_lines, server_thread, write_candidates

from rlhf.data import read_preferences


def wait_saved(page, count: int) -> None:
    """Until the page says this labeller has ``count`` labels saved and shows the next item (or the end)."""
    page.wait_for_function("n => document.getElementById('progress').textContent.includes(`you: ${n}`)", arg=count)
    page.wait_for_function("() => /^(saved|undone)/.test(document.getElementById('status').textContent)")


def shown_grades(page) -> list[int]:
    """The grade of each answer on the page, in the order shown."""
    return [grade(text) for text in page.locator("#candidates .candidate .text").all_inner_texts()]


def best_first(page) -> list[int]:
    """The shown positions of the answers, best first."""
    grades = shown_grades(page)
    return sorted(range(len(grades)), key=lambda pos: -grades[pos])


def actions(page) -> int:
    return int(page.evaluate("() => Number(document.body.dataset.actions || 0)"))


def test_rank_with_keys_and_clicks_ties_take_out_undo_and_reload(browser, tmp_path):
    path, out = write_candidates(tmp_path / "candidates.jsonl", 3, 4), tmp_path / "prefs.jsonl"
    rows = read_lines(path)
    rows[0]["completions"][0] = HOSTILE + " grade 9."  # model output that looks like HTML: shown as text
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with server_thread(path, out) as base:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(base + "/?labeller=ana")
        page.wait_for_selector("#candidates .candidate .text .para")
        assert page.locator("#choose-left").is_hidden() and page.locator("#submit-ranking").is_visible()
        assert HOSTILE in page.inner_text("#candidates") and page.title() == "rlhf label"
        assert page.locator("#work img, #work script").count() == 0
        # item 1 by keys: the best three by number, Enter places the fourth last
        order = best_first(page)
        assert page.locator("#submit-ranking").is_disabled()
        for pos in order[:3]:
            page.keyboard.press(str(pos + 1))
        assert "answer" in page.inner_text("#submit-ranking") and page.locator("#submit-ranking").is_enabled()
        page.keyboard.press("Enter")
        wait_saved(page, 1)
        # item 2 by clicks: a wrong pick taken out again, Back one, Clear, then the best two tied
        cards = page.locator("#candidates .candidate .pick")
        order = best_first(page)
        cards.nth(order[3]).click()
        cards.nth(order[3]).click()  # taken out
        cards.nth(order[1]).click()
        page.click("#rank-back")
        cards.nth(order[2]).click()
        page.click("#rank-clear")
        assert "nothing ranked yet" in page.inner_text("#rank-order")
        for pos in order[:3]:
            cards.nth(pos).click()
        page.locator("#candidates .candidate").nth(order[1]).locator(".tie-toggle").click()
        assert page.inner_text(f"#candidates .candidate:nth-child({order[1] + 1}) .place") == "=1st"
        screenshot(page, "label-ranking")
        page.click("#submit-ranking")
        wait_saved(page, 2)
        # item 3: rank it, undo, the same item comes back the same way round after a reload; rank it with t for a tie
        shown = page.locator("#candidates .candidate .text").all_inner_texts()
        order = best_first(page)
        for pos in order[:3]:
            page.keyboard.press(str(pos + 1))
        page.keyboard.press("Enter")
        wait_saved(page, 3)
        page.keyboard.press("u")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('undone')")
        page.reload()
        page.wait_for_selector("#candidates .candidate .text .para")
        assert page.locator("#candidates .candidate .text").all_inner_texts() == shown
        for pos in order:
            page.keyboard.press(str(pos + 1))
        page.keyboard.press("t")  # the worst tied with the one above it
        page.keyboard.press("Enter")
        wait_saved(page, 3)
        page.wait_for_selector("#done:not([hidden])")
        assert "You labelled 3 items" in page.inner_text("#done-summary") and not errors
    rows = [row for row in read_lines(out) if row["kind"] != "session"]
    assert [row["kind"] for row in rows] == ["ranking", "ranking", "ranking", "retraction", "ranking"]
    grades = [[sorted((grade(row["completions"][i]) for i in (e if isinstance(e, list) else [e])), reverse=True)
               for e in row["ranking"]] for row in rows if row["kind"] == "ranking"]  # fmt: skip
    assert grades[0] == [[9], [3], [2], [1]]  # gold order (the hostile answer is grade 9); the last placed by Enter
    assert grades[1] == [[3, 2], [1], [0]]  # the best two tied
    assert grades[2] == [[3], [2], [1], [0]] and grades[3] == [[3], [2], [1, 0]]  # undone; again, the last two tied
    assert all(row["shown"] and sorted(row["shown"]) == [0, 1, 2, 3] for row in rows if row["kind"] == "ranking")


def test_a_phone_ranks_by_tapping(browser, tmp_path):
    path, out = write_candidates(tmp_path / "candidates.jsonl", 1, 5), tmp_path / "prefs.jsonl"
    with server_thread(path, out) as base:
        context = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
        page = context.new_page()
        page.goto(base + "/?labeller=bo")
        page.wait_for_selector("#candidates .candidate .text .para")
        boxes = [page.locator("#candidates .candidate").nth(i).bounding_box() for i in range(5)]
        assert all(box["width"] <= 390 for box in boxes)
        assert all(b["y"] >= a["y"] + a["height"] - 1 for a, b in zip(boxes, boxes[1:], strict=False))  # stacked
        order = best_first(page)
        for pos in order[:4]:
            page.locator("#candidates .candidate .pick").nth(pos).tap()
        submit = page.locator("#submit-ranking").bounding_box()
        assert submit["y"] >= 0 and submit["y"] + submit["height"] <= 844  # in view without scrolling back
        screenshot(page, "label-ranking-phone")
        page.locator("#submit-ranking").tap()
        page.wait_for_selector("#done:not([hidden])")
        assert actions(page) == 5  # four taps and Submit
        context.close()
    (row,) = [row for row in read_lines(out) if row["kind"] == "ranking"]
    assert [grade(row["completions"][i]) for i in row["ranking"]] == [4, 3, 2, 1, 0]


def label_all(page, mode: str) -> int:
    """Label every item of the page by keys, from the answers' grades; returns the page's action count."""
    for count in range(1, 100):
        page.wait_for_function(
            "() => !document.getElementById('done').hidden || document.body.classList.contains('mode-rank') || "
            "document.body.classList.contains('mode-pair')"
        )
        if page.locator("#done").is_visible():
            return actions(page)
        if mode == "ranking":
            for pos in best_first(page)[:-1]:
                page.keyboard.press(str(pos + 1))
            page.keyboard.press("Enter")
        else:
            left, right = grade(page.inner_text("#left .text")), grade(page.inner_text("#right .text"))
            page.keyboard.press("1" if left > right else "2")
        wait_saved(page, count)
    raise AssertionError("the page never said done")


@pytest.mark.parametrize("k", [4, 8])
def test_the_actions_to_label_k_answers_ranking_against_pairs(browser, tmp_path, k):
    items = 2
    path = write_candidates(tmp_path / "candidates.jsonl", items, k)
    counts, preferences = {}, {}
    for mode in ("ranking", "pairs"):
        out = tmp_path / f"{mode}.jsonl"
        with server_thread(path, out, mode=mode) as base:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(base + "/?labeller=ana")
            counts[mode] = label_all(page, mode) / items
            page.close()
        preferences[mode] = {(p.prompt, p.chosen, p.rejected) for p in read_preferences(out)}
    assert preferences["ranking"] == preferences["pairs"]  # the same k(k−1)/2 preferences either way
    assert len(preferences["pairs"]) == items * k * (k - 1) // 2
    assert counts == {"ranking": k, "pairs": k * (k - 1) // 2}
    print(f"\nk = {k}: ranking {counts['ranking']:g} actions per item, pairs {counts['pairs']:g}")
