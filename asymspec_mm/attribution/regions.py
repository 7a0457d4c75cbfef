"""The grid of image regions attribution masks: groups of merged patches, and their boxes in the original image.

Pure functions of the shapes alone. An image of ``image_grid_thw = (t, h, w)`` patches has ``(h / merge) x
(w / merge)`` merged patches (the tokens that replace its pads, row-major); the processor resized the image to
``(w * patch) x (h * patch)`` pixels before cutting it, so merged column ``c`` starts at ``c * W / (w / merge)``
pixels of an original image ``W`` wide, whatever the resize was (each axis is scaled on its own).
"""

from __future__ import annotations

from dataclasses import dataclass

#: A box ``(x0, y0, x1, y1)`` in the original image's pixels (x1, y1 exclusive).
Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class RegionCell:
    """One region of an image: rows ``r0:r1`` and columns ``c0:c1`` of its merged-patch grid, its place ``(row,
    col)`` in the region grid, the indices of its merged tokens in the image's feature rows, and its ``box``."""

    row: int
    col: int
    r0: int
    r1: int
    c0: int
    c1: int
    tokens: tuple[int, ...]
    box: Box


def spans(n: int, groups: int) -> list[tuple[int, int]]:
    """``n`` cells cut into ``min(groups, n)`` runs as even as possible (the longer runs first): ``spans(5, 2)`` is
    ``[(0, 3), (3, 5)]``."""
    if n < 1 or groups < 1:
        raise ValueError(f"spans needs n >= 1 and groups >= 1 (got n={n}, groups={groups})")
    g = min(groups, n)
    base, extra = divmod(n, g)
    out, start = [], 0
    for i in range(g):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def merged_shape(image_grid_thw: tuple[int, int, int], merge: int) -> tuple[int, int]:
    """``(rows, cols)`` of merged patches of one image (``image_grid_thw`` as the processor gives it; t is 1 for an
    image)."""
    t, h, w = (int(x) for x in image_grid_thw)
    if t != 1 or h % merge or w % merge:
        raise ValueError(f"not an image's patch grid for merge {merge}: (t, h, w) = {(t, h, w)}")
    return h // merge, w // merge


def region_cells(rows: int, cols: int, grid: int, image_size: tuple[int, int]) -> list[RegionCell]:
    """The regions of an image of ``rows x cols`` merged patches and ``image_size = (W, H)`` original pixels, at
    most ``grid x grid`` of them (each a block of merged patches), row-major. A merged patch ``(r, c)`` is token
    ``r * cols + c`` of the image's features."""
    width, height = image_size
    out = []
    for i, (r0, r1) in enumerate(spans(rows, grid)):
        for j, (c0, c1) in enumerate(spans(cols, grid)):
            tokens = tuple(r * cols + c for r in range(r0, r1) for c in range(c0, c1))
            box = (round(c0 * width / cols), round(r0 * height / rows), round(c1 * width / cols), round(r1 * height / rows))
            out.append(RegionCell(i, j, r0, r1, c0, c1, tokens, box))
    return out


def box_overlap(a: Box, b: Box) -> float:
    """The area of the intersection of two boxes (0 when they do not meet)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return float(max(0, w) * max(0, h))
