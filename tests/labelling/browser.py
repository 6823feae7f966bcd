"""Headless Chromium for the labelling page tests, driven by Playwright at the system's browser binary.

The browser is the one installed on the machine (Debian's ``chromium``; ``.ci/run`` installs it), or the one
named by ``RLHF_CHROMIUM``: Playwright's own browser downloads are not used. Without one, the browser tests
are skipped with the reason — unless ``RLHF_REQUIRE_BROWSER=1`` (CI), where its absence fails them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ARTIFACTS = Path(os.environ.get("RLHF_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
"""Where the tests leave screenshots (gitignored)."""
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps",
]  # fmt: skip
"""No sandbox (CI runs as root); no background connections (a machine without internet refuses them)."""


def chromium_binary() -> str | None:
    named = os.environ.get("RLHF_CHROMIUM")
    if named:
        return named
    return next(
        (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
    )


def launch() -> Iterator[object]:
    """A launched browser (the fixture `browser` of conftest.py); skips or fails as the module docstring says."""
    binary = chromium_binary()
    playwright_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
    )
    if binary is None:
        if os.environ.get("RLHF_REQUIRE_BROWSER") == "1":
            pytest.fail(
                "RLHF_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium) and RLHF_CHROMIUM unset"
            )
        pytest.skip("no chromium on PATH (apt-get install chromium, or set RLHF_CHROMIUM to a Chromium binary)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=binary, args=FLAGS)
        yield launched
        launched.close()


def screenshot(page: object, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path
