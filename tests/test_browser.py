"""The site in a real browser, offline: math typeset, figures, explorers, a clean console; and the
live explorer in JupyterLab.

Playwright drives Debian's Chromium (``apt-get install chromium``; never ``playwright install``).
Every request that is not a local file (or the test's own Jupyter server on 127.0.0.1) is aborted
and counts as a failure: the site must work without a network. Screenshots go to
``_build/screenshots/``.

- The built site (``make book``): every page, every explorer, and every slider moved several steps
  quickly, back and forth, on repeated page loads (``ATTNLIB_SLIDER_TRIALS``, default 10), with no
  console error.
- A standalone page (no book build): the explorer fixture executed as the book executes it and
  rendered with the book's widget assets, 30 page loads of rapid slider moves.
- JupyterLab: a server started by the test, the explorer fixture run in it, a start typed, the
  trajectory recomputed by the kernel.

Without Chromium the tests are skipped with the reason, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
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
EXPLORER_FIXTURE = ROOT / "tests" / "fixtures" / "explorer.ipynb"
# Page loads per chapter in the rapid-slider test (the lead's acceptance run uses 30).
SLIDER_TRIALS = int(os.environ.get("ATTNLIB_SLIDER_TRIALS", "10"))
# Several steps quickly, back and forth, then both ends: what a reader dragging or tapping does.
RAPID_KEYS = ["ArrowRight"] * 3 + ["ArrowLeft"] * 2 + ["ArrowRight"] * 3 + ["End", "Home", "ArrowRight"]
# Every kind of slider a page may hold: attnlib's static slider, and an ipywidgets slider.
SLIDER_HANDLES = ".attnlib-slider input[type=range], .widget-slider .noUi-handle"

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
        return self.open_url((site / f"{page_name}.html").as_uri())

    def open_url(self, url: str, typeset: bool = True):
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
        page.goto(url, wait_until="load")
        if typeset:
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


def _shown_picture(slider_box) -> str:
    """The src of the picture a static slider currently shows (the one ``<img>`` not hidden)."""
    return slider_box.evaluate(
        "box => [...box.querySelectorAll('img')].filter(i => !i.hidden).map(i => i.src).join(' ')"
    )


def _move_every_slider_rapidly(page) -> int:
    """Focus each slider on the page and press :data:`RAPID_KEYS` without pause; return how many."""
    handles = page.locator(SLIDER_HANDLES)
    for k in range(handles.count()):
        handle = handles.nth(k)
        handle.scroll_into_view_if_needed()
        handle.focus()
        for key in RAPID_KEYS:
            handle.press(key, delay=0)
    return handles.count()


def _rapid_slider_trials(browser, url: str, trials: int, typeset: bool = True) -> list[str]:
    """Load the page ``trials`` times, move every slider rapidly each time; the problems seen."""
    seen = []
    for trial in range(trials):
        page, problems = browser.open_url(url, typeset=typeset)
        page.wait_for_selector(SLIDER_HANDLES, state="attached", timeout=15000)
        _move_every_slider_rapidly(page)
        page.wait_for_timeout(300)  # late errors: a message delivered on the next animation frame
        seen += [f"load {trial + 1}: {problem}" for problem in problems]
        page.context.close()
    return seen


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_explorers_work_without_a_kernel(browser, built_site, page_name):
    page, problems = browser.open(built_site, page_name)
    sliders = page.locator(".attnlib-slider")
    animations = page.locator("img[id^='_anim_img']")
    if sliders.count() == 0 and animations.count() == 0:
        pytest.skip(f"{page_name} has no explorer")

    for k in range(sliders.count()):
        box = sliders.nth(k)
        box.locator("img").first.evaluate("i => i.decode()")  # the pictures are loaded
        before = _shown_picture(box)
        _screenshot(box, f"{page_name}__slider{k}_before")
        slider = box.locator("input[type=range]")
        slider.focus()
        at_end = slider.evaluate("s => s.value === s.max")
        slider.press("ArrowLeft" if at_end else "ArrowRight")
        after = _shown_picture(box)
        assert after != before and after.count("data:image/png") == 1, "the slider did not change the picture"
        label = box.locator("output").inner_text()
        assert label and slider.get_attribute("aria-valuetext") == label
        _screenshot(box, f"{page_name}__slider{k}_after")

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


@pytest.mark.parametrize("page_name", CHAPTERS)
def test_sliders_moved_rapidly_leave_a_clean_console(browser, built_site, page_name):
    """Every slider, several steps quickly back and forth, on SLIDER_TRIALS page loads: no console error.

    The ipywidgets slider linked to a Stack threw "Cannot read properties of null (reading
    'processLuminoMessage')" on about 1 load in 5 of this (see attnlib.book.widgets).
    """
    page, _ = browser.open(built_site, page_name)
    count = page.locator(SLIDER_HANDLES).count()
    page.context.close()
    if count == 0:
        pytest.skip(f"{page_name} has no slider")
    problems = _rapid_slider_trials(browser, (built_site / f"{page_name}.html").as_uri(), SLIDER_TRIALS)
    assert not problems, "\n".join(problems)


def _standalone_page(executed: dict, folder: Path) -> Path:
    """An executed notebook's outputs as one HTML page with the book's widget assets (no book build).

    The same scripts in the same order as the book's pages (``nb_ipywidgets_js`` in _config.yml):
    require.js, book/assets/widgets-offline.js, the HTML manager, then the widget state; widget
    views, HTML and PNG outputs in cell order.
    """
    vendor = folder / "ipywidgets"
    vendor.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "node_modules/requirejs/require.js", vendor / "require.js")
    for asset in (ROOT / "node_modules/@jupyter-widgets/html-manager/dist").iterdir():
        if asset.name == "embed-amd.js" or asset.suffix in (".woff", ".woff2", ".ttf", ".eot", ".svg"):
            shutil.copy(asset, vendor / asset.name)
    shutil.copy(ROOT / "book/assets/widgets-offline.js", folder / "widgets-offline.js")
    body = []
    for cell in executed["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            view = data.get("application/vnd.jupyter.widget-view+json")
            if view:
                body.append(f'<script type="application/vnd.jupyter.widget-view+json">{json.dumps(view)}</script>')
            elif "text/html" in data:
                body.append("<div>" + "".join(data["text/html"]) + "</div>")
            elif "image/png" in data:
                body.append(f'<img src="data:image/png;base64,{data["image/png"]}">')
    state = executed.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json")
    head = ['<meta charset="utf-8">']
    if state:
        head += [
            '<script src="ipywidgets/require.js"></script>',
            '<script src="widgets-offline.js"></script>',
            '<script src="ipywidgets/embed-amd.js"></script>',
            f'<script type="application/vnd.jupyter.widget-state+json">{json.dumps(state)}</script>',
        ]
    page = folder / "page.html"
    page.write_text(f"<!DOCTYPE html><html><head>{''.join(head)}</head><body>{''.join(body)}</body></html>")
    return page


@pytest.fixture(scope="module")
def static_explorer_page(tmp_path_factory):
    """The explorer fixture executed the way the book executes chapters, as a standalone page."""
    from attnlib.book.run import execute_notebook

    if not (ROOT / "node_modules" / "@jupyter-widgets" / "html-manager").is_dir():
        pytest.fail("node_modules is missing: run `make assets` (npm ci)")
    folder = tmp_path_factory.mktemp("static_explorer")
    summary = execute_notebook(EXPLORER_FIXTURE, folder / "explorer.ipynb", {"steps": 60})
    assert summary["status"] == "ok", summary["error"]
    return _standalone_page(json.loads((folder / "explorer.ipynb").read_text()), folder)


def test_static_explorer_survives_rapid_use(browser, static_explorer_page):
    """30 loads of the explorer fixture's static page, its slider moved rapidly each time: no console error."""
    page, problems = browser.open_url(static_explorer_page.as_uri(), typeset=False)
    box = page.locator(".attnlib-slider")
    assert box.count() == 1, "the book's run did not produce the static slider"
    before = _shown_picture(box)
    slider = box.locator("input[type=range]")
    slider.focus()
    slider.press("ArrowRight")
    assert _shown_picture(box) != before and box.locator("output").inner_text() == "0.1"
    page.context.close()
    assert not problems, "\n".join(problems)
    problems = _rapid_slider_trials(browser, static_explorer_page.as_uri(), 30, typeset=False)
    assert not problems, "\n".join(problems)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 (a free port, a random token) serving a copy of the fixture.

    Yields ``(base_url, token, log_path)``; the server and its kernels are stopped at the end.
    """
    pytest.importorskip("jupyterlab")
    root = tmp_path_factory.mktemp("lab")
    work, home = root / "notebooks", root / "home"
    work.mkdir()
    home.mkdir()
    notebook = json.loads(EXPLORER_FIXTURE.read_text())
    # A chapter not yet on explorer(): its precomputed slider must move in JupyterLab too.
    notebook["cells"].append(
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "precomputed-slider",
            "metadata": {},
            "outputs": [],
            "source": 'al.book.widgets.image_slider([0.02, 0.5], lambda lr: draw(lr, (1.0, -0.5), 0), "precomputed")',
        }
    )
    (work / "explorer.ipynb").write_text(json.dumps(notebook))
    # Settings of a quiet, fully rendered session: every cell in the DOM (no windowing, which hides
    # cells out of view), and no "Would you like to get notified about news?" toast over the outputs.
    settings = home / "settings" / "@jupyterlab"
    for plugin, values in {
        "notebook-extension/tracker": {"windowingMode": "none"},
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ATTNLIB_EXPLORERS", None)  # a reader's kernel: live explorers
    env.pop("MPLBACKEND", None)  # the kernel's inline backend draws the figures
    # The user's Jupyter settings, workspaces and runtime files stay out of it.
    env.update(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    log = root / "lab.log"
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
        "--KernelManager.transport_encryption=auto",  # as `make lab`
    ]
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token, log
    finally:
        server.terminate()  # SIGTERM: the server shuts its kernels down
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_live_explorer_in_jupyterlab(browser, jupyter_lab):
    """A reader's session: open the fixture in JupyterLab, run all cells, type a start, see it computed."""
    base, token, log = jupyter_lab
    page, problems = browser.open_url(f"{base}/lab/tree/explorer.ipynb?token={token}", typeset=False)
    page.set_default_timeout(120_000)  # JupyterLab's first load and the kernel's start are slow on 2 cores
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    # The kernel is connected and idle: the status bar says so (the indicator is idle before that).
    page.wait_for_function("() => /\\|\\s*Idle/.test(document.querySelector('#jp-main-statusbar')?.innerText || '')")
    try:
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        explorer = page.locator(".jp-OutputArea-output .widget-vbox").first
        explorer.wait_for(state="attached")
    except Exception:
        _screenshot(page, "jupyterlab__failed")
        raise
    explorer.scroll_into_view_if_needed()
    picture = explorer.locator(".widget-image").first
    page.wait_for_function("img => img.naturalWidth > 0", arg=picture.element_handle())
    status = explorer.locator(".widget-html").first
    assert "computed live" in status.inner_text()
    before = picture.get_attribute("src")
    _screenshot(explorer, "jupyterlab__live_explorer_before")

    # The start's first coordinate, typed: the "start" label's box holds the two number boxes.
    start_x = explorer.locator(".widget-hbox", has=page.locator(".widget-label", has_text="start")).locator("input")
    start_x.first.fill("-2")
    start_x.first.press("Enter")
    page.wait_for_function(
        "([img, before]) => img.src !== before && img.naturalWidth > 0",
        arg=[picture.element_handle(), before],
    )
    page.wait_for_function(
        "el => el.innerText.includes('start = (-2.0, -0.5)')", arg=status.element_handle(), timeout=60_000
    )
    _screenshot(explorer, "jupyterlab__live_explorer_after")

    # The slider's parameter, typed: a step size between the slider's positions.
    typed = explorer.locator(".widget-text", has=page.locator("label", has_text="or type")).locator("input")
    typed.fill("0.3")
    typed.press("Enter")
    page.wait_for_function("el => el.innerText.includes('lr = 0.3')", arg=status.element_handle(), timeout=60_000)

    precomputed = page.locator(".jp-OutputArea-output .widget-vbox").nth(1)
    precomputed.wait_for(state="attached")
    precomputed.scroll_into_view_if_needed()
    image = precomputed.locator(".widget-image").first
    before = image.get_attribute("src")
    handle = precomputed.locator(".noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")
    page.wait_for_function("([img, before]) => img.src !== before", arg=[image.element_handle(), before])
    page.context.close()
    server_log = log.read_text()
    assert "without encryption" not in server_log, "the kernel warned about its transport"
    assert not problems, "\n".join(problems)


def test_every_theorem_chapter_has_its_explorer(browser, built_site):
    """Chapters 01-06 each render their explorer as attnlib's static slider over precomputed pictures."""
    missing = []
    for page_name in CHAPTERS:
        if page_name.split("/")[-1][:2] not in {"01", "02", "03", "04", "05", "06"}:
            continue
        page, _ = browser.open(built_site, page_name)
        page.wait_for_timeout(300)
        if page.locator(".attnlib-slider input[type=range]").count() < 1:
            missing.append(page_name)
    assert not missing, f"no explorer on {missing}"
