"""Take docs/label-page.png, the labelling page's screenshot in the README: `python tools/label_screenshot.py`.

Serves one example pair with `rlhf label`'s own server and photographs it in headless Chromium (the system's
`chromium`, or $RLHF_CHROMIUM), as the browser tests do.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "labelling"))

from browser import FLAGS, chromium_binary  # noqa: E402
from label_servers import server_thread  # noqa: E402

PAIR = {
    "prompt": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "How do I reverse a list in Python without changing the original?"},
    ],
    "a": "Use slicing, which returns a new list:\n\n```python\nitems = [1, 2, 3]\nbackwards = items[::-1]\n```\n\n"
    "`items` is unchanged. `reversed(items)` also works if you only need to iterate.",
    "b": "Call `items.reverse()`. It reverses the list.",
}


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        pairs = Path(tmp) / "pairs.jsonl"
        pairs.write_text(json.dumps(PAIR) + "\n" + json.dumps(PAIR | {"prompt": "Say hi."}) + "\n")
        with server_thread(pairs, Path(tmp) / "prefs.jsonl") as base, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_binary(), args=FLAGS)
            page = browser.new_page(viewport={"width": 1100, "height": 620}, device_scale_factor=1)
            page.goto(base + "/?labeller=ana")
            page.wait_for_selector("#left .text pre")
            page.locator('#left .rating button[data-rating="good"]').click()
            out = ROOT / "docs" / "label-page.png"
            page.screenshot(path=str(out))
            browser.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
