"""A headless Chromium for tests that check a page as a person's browser shows it (``opguard
serve``, reports): the system's chromium (Debian's ``chromium`` package) driven by Playwright for
Python, never a browser Playwright downloads itself.

A test takes the ``browser_page`` fixture (conftest.py makes it every module's): a fresh page in
a fresh context that collects the console's errors and the page's uncaught exceptions, and
answers every request that would leave this machine with an empty response, listing it, so a
page is tested as it works offline. Without Playwright or a chromium executable the test is
skipped, saying which is missing and how to install it. Playwright's synchronous API keeps an
event loop running in the test process while the module's browser lives: code under test that
runs its own (``asyncio.run``) runs in a child process there.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page, Route

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
VIEWPORT = {"width": 1280, "height": 760}  # CSS pixels: about 150 x 40 cells of 16px text
# Any http(s) URL whose host is not this machine's loopback.
OFFSITE = re.compile(r"^https?://(?!(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?/)")


def chromium_executable() -> str | None:
    """The system's Chromium, or None."""
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


@dataclass
class BrowserPage:
    """A page and what it said: console errors and uncaught exceptions (``errors``), and the
    URLs it asked of other machines (``offsite``, answered empty)."""

    page: Page
    errors: list[str] = field(default_factory=list)
    offsite: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for a test module (starting one takes about a second)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; no browser download)")
    executable = chromium_executable()
    if executable is None:
        pytest.skip(f"no Chromium on PATH ({', '.join(CHROMIUM_NAMES)}): apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium: Browser) -> Iterator[BrowserPage]:
    context = chromium.new_context(viewport=VIEWPORT)
    seen = BrowserPage(context.new_page())

    def offsite(route: Route) -> None:
        seen.offsite.append(route.request.url)
        route.fulfill(status=204)

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            seen.errors.append(message.text)

    context.route(OFFSITE, offsite)
    seen.page.on("console", console)
    seen.page.on("pageerror", lambda error: seen.errors.append(str(error)))
    yield seen
    context.close()
