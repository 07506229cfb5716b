"""The built site in a real browser, offline: math typeset, figures, explorers, a clean console.

Playwright drives Debian's Chromium (``apt-get install chromium``; never ``playwright install``).
Every request that is not a local file is aborted and counts as a failure: the site must work
without a network. Screenshots go to ``_build/screenshots/``.

Without Chromium the test is skipped with the reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from attnlib.book import build as book

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / book.BUILD_DIR / "screenshots"
CHROMIUM = os.environ.get("ATTNLIB_CHROMIUM", "/usr/bin/chromium")
PAGES = ["book/intro", "book/notation", "book/reproduce", "book/references"] + [
    path.with_suffix("").as_posix() for path in book.toc_notebooks(ROOT)
]
CHAPTERS = [page for page in PAGES if page.startswith("notebooks/")]
PAGES_WITH_MATH = ["book/intro", "book/notation", *CHAPTERS]

pytestmark = pytest.mark.browser


def _need_chromium() -> None:
    if Path(CHROMIUM).exists() or shutil.which(CHROMIUM):
        return
    reason = f"Chromium not found at {CHROMIUM}: install it with `apt-get install chromium` (make test does, as root)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; under CI the browser test is required")
    pytest.skip(reason)


class Browser:
    """One Chromium for the module; each page opened records console errors and blocked requests."""

    def __init__(self, playwright):
        self.browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )

    def open(self, site: Path, page_name: str):
        context = self.browser.new_context(viewport={"width": 1280, "height": 900})
        problems: list[str] = []

        def offline(route):
            url = route.request.url
            if url.startswith(("file://", "data:", "blob:")) or url.split("/")[2].split(":")[0] in (
                "localhost",
                "127.0.0.1",
            ):
                route.continue_()
            else:
                problems.append(f"network request (blocked): {url}")
                route.abort()

        context.route("**/*", offline)
        page = context.new_page()
        page.on("console", lambda message: message.type == "error" and problems.append(f"console: {message.text}"))
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.goto((site / f"{page_name}.html").as_uri(), wait_until="load")
        # MathJax 3 typesets asynchronously; its startup promise settles after the first pass.
        page.wait_for_function("() => window.MathJax === undefined || (MathJax.startup && MathJax.startup.promise)")
        page.evaluate("() => window.MathJax && MathJax.startup.promise")
        return page, problems

    def close(self):
        self.browser.close()


@pytest.fixture(scope="module")
def browser():
    _need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        session = Browser(playwright)
        yield session
        session.close()


def _screenshot(page_or_element, name: str) -> None:
    """A full page, or one element (an explorer before and after it moved)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = str(SCREENSHOTS / f"{name.replace('/', '__')}.png")
    if hasattr(page_or_element, "goto"):
        page_or_element.screenshot(path=path, full_page=True)
    else:
        page_or_element.scroll_into_view_if_needed()
        page_or_element.screenshot(path=path)


@pytest.mark.parametrize("page_name", PAGES)
def test_page_renders_offline_with_math_and_a_clean_console(browser, built_site, page_name):
    page, problems = browser.open(built_site, page_name)
    text = page.inner_text("main")
    assert "\\(" not in text and "\\[" not in text, "raw TeX left on the page: MathJax did not typeset"
    if page_name in PAGES_WITH_MATH and page.locator("main .math").count():  # the page has math markup
        assert page.locator("mjx-container").count() > 0, "no typeset math on the page"
        assert page.locator("mjx-merror").count() == 0, "MathJax reported a TeX error (an undefined macro?)"
    if page_name in CHAPTERS:
        images = page.locator("main img")
        assert images.count() > 0, "no figure on a chapter page"
        broken = page.evaluate("() => [...document.querySelectorAll('main img')].filter(i => !i.naturalWidth).length")
        assert broken == 0, f"{broken} images did not load"
    page.wait_for_timeout(500)  # late console errors (widget rendering)
    _screenshot(page, page_name)
    assert not problems, "\n".join(problems)


def _visible_stack_image(slider_box):
    """The src of the picture the slider's Stack currently shows (blob: URLs differ per picture)."""
    return slider_box.locator(".widget-image").evaluate_all(
        "images => images.filter(i => i.offsetParent !== null).map(i => i.src).join(' ')"
    )


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_explorers_work_without_a_kernel(browser, built_site, page_name):
    page, problems = browser.open(built_site, page_name)
    sliders = page.locator(".widget-slider")
    animations = page.locator("img[id^='_anim_img']")
    if sliders.count() == 0 and animations.count() == 0:
        pytest.skip(f"{page_name} has no explorer")

    if sliders.count():
        # The explorer box: the nearest widget box holding both the slider and the pictures.
        box = sliders.first.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
        page.wait_for_function(
            "box => [...box.querySelectorAll('.widget-image')].some(i => i.offsetParent && i.naturalWidth)",
            arg=box.element_handle(),
        )
        before = _visible_stack_image(box)
        _screenshot(box, f"{page_name}__slider_before")
        handle = sliders.first.locator(".noUi-handle")
        handle.focus()
        handle.press("ArrowRight")
        page.wait_for_function(
            "([box, before]) => [...box.querySelectorAll('.widget-image')]"
            ".filter(i => i.offsetParent !== null).map(i => i.src).join(' ') !== before",
            arg=[box.element_handle(), before],
            timeout=5000,
        )
        assert _visible_stack_image(box) != before
        page.wait_for_timeout(200)  # let the new picture paint before the screenshot
        _screenshot(box, f"{page_name}__slider_after")

    if animations.count():
        image = animations.first
        anim_id = image.get_attribute("id").removeprefix("_anim_img")
        controls = page.locator(f"#_anim_slider{anim_id}").locator("xpath=..")
        controls.locator("button[title='First frame']").click()
        first = image.get_attribute("src")
        _screenshot(image, f"{page_name}__animation_first_frame")
        controls.locator("button[title='Play']").click()
        page.wait_for_function(
            "id => Number(document.getElementById('_anim_slider' + id).value) >= 2", arg=anim_id, timeout=10000
        )
        controls.locator("button[title='Pause']").click()
        assert image.get_attribute("src") != first, "Play did not change the frame"
        _screenshot(image, f"{page_name}__animation_played")

    assert not problems, "\n".join(problems)


def test_the_book_has_both_kinds_of_explorer(browser, built_site):
    """At least one slider over precomputed pictures and one animation across the chapters."""
    counts = {"slider": 0, "animation": 0}
    for page_name in CHAPTERS:
        page, _ = browser.open(built_site, page_name)
        page.wait_for_timeout(300)
        counts["slider"] += page.locator(".widget-slider").count()
        counts["animation"] += page.locator("img[id^='_anim_img']").count()
    assert counts["slider"] >= 1 and counts["animation"] >= 1, counts
