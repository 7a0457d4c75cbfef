"""Heat maps of an :class:`~.attribute.Attribution` as images the size of the original image.

:func:`heat_image` is the map itself (grey levels: 255 at the best region, 0 where masking did not lower delta);
:func:`overlay` lays it over the image in red for a reader. :func:`write_heatmaps` writes both as PNGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .attribute import Attribution


def heat_image(att: Attribution, image_index: int = 0) -> Any:
    """A greyscale PIL image (mode ``L``) of image ``image_index``'s size: each region's box filled with its score
    scaled to 0..255 by the image's best score (negative scores, regions that held the token back, are 0)."""
    from PIL import Image, ImageDraw

    size = att.images[image_index].size
    regions = [r for r in att.regions if r.image_index == image_index]
    best = max((r.score for r in regions), default=0.0)
    heat = Image.new("L", size, 0)
    draw = ImageDraw.Draw(heat)
    for r in regions:
        level = round(255 * r.score / best) if best > 0 and r.score > 0 else 0
        x0, y0, x1, y1 = r.box
        if x1 > x0 and y1 > y0:
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=level)  # PIL's corners are inclusive; boxes exclude x1, y1
    return heat


def overlay(image: Any, heat: Any, strength: float = 0.6) -> Any:
    """``image`` (RGB) tinted red where ``heat`` is high: alpha = strength * heat / 255."""
    from PIL import Image

    red = Image.new("RGB", image.size, (230, 20, 20))
    alpha = heat.point(lambda v: round(v * strength))
    return Image.composite(red, image.convert("RGB"), alpha)


def write_heatmaps(att: Attribution, images: list, out_dir: Path, stem: str) -> list[Path]:
    """Write ``{stem}_image{i}_heat.png`` (the map) and ``{stem}_image{i}.png`` (over the image) for each image;
    returns the paths, the map first for each image."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for grid in att.images:
        i = grid.image_index
        heat = heat_image(att, i)
        heat_path, over_path = out_dir / f"{stem}_image{i}_heat.png", out_dir / f"{stem}_image{i}.png"
        heat.save(heat_path)
        overlay(images[i], heat).save(over_path)
        paths += [heat_path, over_path]
    return paths
