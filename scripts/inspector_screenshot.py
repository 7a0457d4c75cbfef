"""Regenerate docs/inspector.png: the steering inspector on a bundled `mixed` example, with the shipped tiny
pair, after the run: its first fused token clicked, so that the page shows that token's heat map ("Where in the
image") and its tooltip (the verifier's arithmetic). With ``--heatmap``, docs/inspector_heatmap.png instead: the
answer and, under it, the heat map of its first steered token (clicked), cropped to those two. Both are saved with
a palette of 128 colours (the page has few), which keeps the docs' copies small.

    python scripts/inspector_screenshot.py [--out docs/inspector.png] [--family mixed]
    python scripts/inspector_screenshot.py --heatmap --family figure --out docs/inspector_heatmap.png

Needs the `ui` extra, playwright (without `playwright install`) and Debian's chromium at /usr/bin/chromium.
The server binds 127.0.0.1 on a free port and is closed at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/inspector.png")
    ap.add_argument("--family", default="mixed", help="which bundled example to show (its MiniVista family)")
    ap.add_argument("--heatmap", action="store_true", help="click the first steered token; keep the answer and its heat map")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from asymspec_mm import AsymSpecPipeline
    from ui.app import build_app, load_examples, serve

    examples = load_examples()
    pick = next((e for e in examples if e["label"].startswith(args.family + ":")), None)
    if pick is None:
        print(f"no bundled example of family {args.family!r}; examples: {[e['label'] for e in examples]}", file=sys.stderr)
        return 2
    pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
    demo = build_app(pipe, examples=examples, default_max_new_tokens=40, stream_interval=0.0)
    serve(demo, port=_free_port(), prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(120_000)
            page.goto(demo.local_url, wait_until="domcontentloaded")
            page.wait_for_selector("#asym-image input[type=file]", state="attached")
            page.locator("#asym-image input[type=file]").set_input_files(pick["image"])
            page.wait_for_selector("#asym-image img", state="attached")
            page.locator("#asym-question textarea").fill(pick["question"])
            page.locator("#asym-caption textarea").fill(pick["caption"])
            page.locator("#asym-ocr textarea").fill(pick["ocr"])
            page.locator("#asym-run").click()
            page.wait_for_selector('#asym-status [data-status="ok"]', timeout=300_000)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            if args.heatmap:
                _heatmap_shot(page, args.out)
            else:
                fused = page.locator("#asym-answer .asym-trace .tok.tok-fused")
                token = fused.first if fused.count() else page.locator("#asym-answer .asym-trace .tok").first
                _open_heatmap(page, token)
                token.hover()  # its tooltip, over the answer
                page.wait_for_timeout(500)
                page.screenshot(path=args.out, full_page=True)
                _shrink(args.out)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {args.out} ({pick['label']})")
    return 0


def _heatmap_shot(page, out: str) -> None:
    """Click the answer's first steered token (else its first token), wait for its heat map, and keep the answer
    and the map's panel, without the token's hover box."""
    steered = page.locator('#asym-answer .asym-trace .tok[data-steered="1"]')
    token = steered.first if steered.count() else page.locator("#asym-answer .asym-trace .tok").first
    _open_heatmap(page, token)
    page.keyboard.press("Escape")  # close the token's hover box
    page.mouse.move(0, 0)
    page.wait_for_timeout(300)
    top = page.locator("#asym-answer .asym-trace").bounding_box()
    bottom = page.locator("#asym-heat-box").bounding_box()
    x0, y0 = min(top["x"], bottom["x"]), top["y"]
    x1, y1 = max(top["x"] + top["width"], bottom["x"] + bottom["width"]), bottom["y"] + bottom["height"]
    page.screenshot(path=out, clip={"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0}, full_page=True)
    _shrink(out)


def _open_heatmap(page, token) -> None:
    """Click ``token`` of the answer and wait until its heat map is drawn under the answer."""
    token.click()
    page.wait_for_selector('#asym-heatmap .asym-heatmap[data-state="done"]', timeout=120_000)


def _shrink(out: str) -> None:
    """Save the screenshot at ``out`` again with a palette of 128 colours (the page has few), for a small file."""
    from PIL import Image

    with Image.open(out) as shot:
        shot.convert("RGB").quantize(colors=128).save(out, optimize=True)


if __name__ == "__main__":
    raise SystemExit(main())
