"""``asymspec-mm explain``: the trace as JSON and, with ``--attribute``, each chosen token's heat maps beside it.

Files: ``trace.json`` (the result with token texts, as ``generate --json`` prints it, plus ``attributions``: per
attributed token its regions and the PNGs written) and, next to it, ``trace_tok{position}_image{i}_heat.png`` (the
map: grey levels, the best region brightest) and ``trace_tok{position}_image{i}.png`` (the map over the image).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError
from .trace_json import jsonable, result_json


def write_explanation(
    pipe: Any,
    res: Any,
    trace_path: Path,
    *,
    attribute: bool,
    positions: list[int] | None,
    grid: int,
    baseline: str,
    method: str = "occlusion",
) -> list[Path]:
    """Write the trace JSON at ``trace_path`` and, with ``attribute``, the heat maps of ``positions`` (default:
    :func:`default_positions`) next to it; returns every file written, the JSON first."""
    from ..attribution import default_positions, result_images, write_heatmaps

    data = result_json(res, pipe.tokenizer)
    written: list[Path] = []
    if attribute:
        chosen = default_positions(res) if positions is None else positions
        for p in chosen:
            if not 0 <= p < len(res.trace):
                raise AsymSpecError(f"--positions {p} is outside the answer's {len(res.trace)} tokens (0..{len(res.trace) - 1})")
        images = result_images(res)
        data["attributions"] = []
        for p in chosen:
            att = pipe.attribute(res, p, method=method, grid=grid, baseline=baseline)
            files = write_heatmaps(att, images, trace_path.parent, f"{trace_path.stem}_tok{p}")
            written += files
            data["attributions"].append({**jsonable(att.as_dict()), "files": [f.name for f in files]})
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path.write_text(json.dumps(data, indent=1) + "\n")
    return [trace_path, *written]
