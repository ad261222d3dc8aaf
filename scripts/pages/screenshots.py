"""Screenshots of the results site for the README: the index and one run's page, as headless Chromium
renders them (``make install-chromium``), written to docs/images/.

    specbench site results -o site
    .venv/bin/python -m scripts.pages.screenshots site [--run RUN_PAGE_NAME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the DevTools-over-a-pipe driver the browser test uses

from headless_chromium import Browser, find  # noqa: E402

RUN = "cs_drafting__qwen_table3_offline__amd-epyc-family25-avx512-bf16"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("site", type=Path, help="the folder `specbench site` wrote")
    parser.add_argument("--run", default=RUN, help="the run page to capture (its name under runs/)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    binary = find()
    if binary is None:
        sys.exit("no chromium on PATH: make install-chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    with Browser(binary, width=1400, height=900) as browser:
        for page, name in (
            (args.site / "index.html", "site_index.png"),
            (args.site / "runs" / f"{args.run}.html", "run_page.png"),
        ):
            browser.open(page)
            if browser.errors():
                sys.exit(f"{page}: script errors {browser.errors()}")
            print(browser.screenshot(args.out / name, max_height=2400))


if __name__ == "__main__":
    main()
