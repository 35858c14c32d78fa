"""/docs and /redoc render in headless Chromium with no network at all: server and browser run
inside a network namespace that has only loopback, so a script or style from a CDN cannot load.
Screenshots go to tests/_artifacts/ for a person to look at."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.browser.test_ui_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
from tests.test_app_support import ROOT

OFFLINE_DOCS = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    from playwright.sync_api import sync_playwright
    from tests.test_app_support import DemoServer

    chromium, args, artifacts = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    artifacts.mkdir(parents=True, exist_ok=True)
    # Redoc's "API docs by Redocly" footer links a logo on redoc.ly; it fails offline, and the page
    # does not need it. Everything else must come from the server (blob: URLs are made in the page).
    cosmetic = ("https://cdn.redoc.ly/redoc/logo-mini.svg",)
    failed, outside = [], []
    with DemoServer(Path(tempfile.mkdtemp()), "--no-ui") as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("requestfailed", lambda r: None if r.url in cosmetic else failed.append(r.url))
        page.on("request", lambda r: None if r.url.startswith((server.url, "blob:" + server.url)) or r.url in cosmetic
                else outside.append(r.url))
        page.goto(server.url + "/docs")
        # Swagger UI drew the spec: the title and the TTS operation are on the page.
        page.locator(".swagger-ui .info .title").wait_for(timeout=30_000)
        page.locator(".opblock-summary-path", has_text="/v1/tts").first.wait_for(timeout=30_000)
        page.screenshot(path=str(artifacts / "docs-offline.png"))
        page.goto(server.url + "/redoc")
        page.locator("h1", has_text="S1-mini Studio").first.wait_for(timeout=30_000)
        page.locator("h2", has_text="Text to speech (fish-speech").first.wait_for(timeout=30_000)  # /v1/tts
        page.screenshot(path=str(artifacts / "redoc-offline.png"))
        browser.close()
    assert not failed and not outside, (failed, outside)
    print("DOCS-OFFLINE-OK")
    """
)


@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None, reason="needs unshare and ip (util-linux, iproute2)"
)
def test_docs_and_redoc_render_with_no_network():
    import json
    import shlex

    script = shlex.join([sys.executable, "-c", OFFLINE_DOCS, CHROMIUM, json.dumps(CHROMIUM_ARGS), str(ARTIFACTS)])
    try:
        result = subprocess.run(
            ["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {script}"],
            cwd=ROOT, capture_output=True, text=True, timeout=240,
        )
    except PermissionError:
        pytest.skip("not allowed to create a network namespace here")
    if "Operation not permitted" in result.stderr and "DOCS-OFFLINE-OK" not in result.stdout:
        pytest.skip("not allowed to create a network namespace here")
    assert "DOCS-OFFLINE-OK" in result.stdout, result.stderr[-3000:]
    assert (Path(ARTIFACTS) / "docs-offline.png").is_file()
