"""The documentation site in a real browser: headless Chromium opens the built site's home
page, a how-to and a reference page, finds their navigation, searches for
`find_learning_rate`, and leaves screenshots in `site/screenshots/`.

Needs Debian's `chromium` (`.ci/run` installs it); without it the test skips and says so.
"""

import functools
import http.server
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
SHOTS = SITE / "screenshots"
PAGES = {
    "home": "",
    "how-to": "how-to/learning-rate/",
    "reference": "reference/tuning/",
}


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def site_url():
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(SITE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    SHOTS.mkdir(exist_ok=True)
    handler = functools.partial(QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test's output stays the test's
        pass


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    if executable is None:
        pytest.skip(
            "Debian's chromium is not installed here (`apt-get install chromium`; .ci/run "
            "installs it), so the site is not opened in a browser"
        )
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        yield chromium
        chromium.close()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_renders_with_its_navigation(browser, site_url, name):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(90_000)  # a loaded machine is slow, not wrong
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    response = page.goto(site_url + PAGES[name], wait_until="load")
    assert response is not None and response.status == 200
    page.wait_for_selector("nav.md-nav--primary", state="attached", timeout=90_000)
    links = page.locator("nav.md-nav--primary a.md-nav__link")
    titles = {text.strip() for text in links.all_inner_texts()}
    assert {"Tutorials", "How-to guides", "Reference"} <= titles, titles
    assert page.locator("article.md-content__inner h1").count() == 1
    assert page.locator("article.md-content__inner").inner_text().strip()
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)
    assert (SHOTS / f"{name}.png").stat().st_size > 10_000  # a drawn page, not a blank one
    assert not errors, errors
    page.close()


def test_search_finds_find_learning_rate(browser, site_url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(90_000)  # a loaded machine is slow, not wrong
    page.goto(site_url, wait_until="networkidle")  # the search index fetched
    page.locator("label.md-search__icon, .md-search__input").first.click()
    box, items = page.locator("input.md-search__input"), page.locator(".md-search-result__item")
    for _ in range(6):  # a query typed before the search worker is ready is typed again
        box.fill("")
        box.type("find_learning_rate", delay=20)
        try:
            items.first.wait_for(timeout=20_000)
            break
        except Exception:  # playwright's TimeoutError: try the query once more
            continue
    assert items.count(), "the site's search found nothing for find_learning_rate"
    links = [items.nth(i).locator("a").first.get_attribute("href") for i in range(items.count())]
    text = page.locator(".md-search-result").inner_text()
    assert "find_learning_rate" in text
    assert any("reference/tuning" in (href or "") for href in links), links
    page.screenshot(path=str(SHOTS / "search.png"))
    page.close()
