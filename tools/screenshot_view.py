"""Make docs/view.png, the README's picture: the first screen of `eu-audit view` on a committed stack report,
in Debian's headless Chromium at the viewport tests/test_view.py checks it against.

    .venv/bin/python tools/screenshot_view.py            # writes docs/view.png
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_view import CHROMIUM, CHROMIUM_ARGS, FORENSICS, VIEWPORT  # noqa: E402


def main() -> None:
    from playwright.sync_api import sync_playwright

    from eu_audit.view import build_site

    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        build_site([FORENSICS], site)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.goto((site / "index.html").as_uri())
            page.screenshot(path=str(ROOT / "docs" / "view.png"))
            browser.close()
    print(f"wrote {ROOT / 'docs' / 'view.png'}")


if __name__ == "__main__":
    main()
