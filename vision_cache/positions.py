"""3D M-RoPE positions of Qwen3-VL, computed by hand.

Text tokens advance all three axes (temporal, height, width) together; an image of merged grid
``(t, h, w)`` occupies ``t*h*w`` tokens whose axes run over the grid starting at the current
position, after which the position jumps by ``max(h, w)`` (Qwen3-VL: images use ``t=1`` per
temporal patch group). Every token after the prompt is text, so its position is its sequence
index plus one constant, the rope delta. The drafter stream therefore never needs the model's
stored ``rope_deltas``, which go stale when one model serves two contexts.
"""

from __future__ import annotations

import torch


def mrope_positions(
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    spatial_merge_size: int,
) -> tuple[torch.Tensor, int]:
    """Positions ``[3, L]`` (long) and the rope delta for one sequence.

    ``mm_token_type_ids``: ``[L]`` (0 text, 1 image pad); ``image_grid_thw``: ``[n_images, 3]`` patch
    grids before merging. The delta is ``max position + 1 - L``: add it to a token's index to get
    the position of any text token that follows the prompt.
    """
    types = mm_token_type_ids.tolist()
    grids = iter(image_grid_thw.tolist()) if image_grid_thw is not None else iter(())
    chunks: list[torch.Tensor] = []
    pos, i, n = 0, 0, len(types)
    while i < n:
        j = i
        while j < n and types[j] == types[i]:
            j += 1
        if types[i] == 0:
            chunks.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos += j - i
        else:
            # A run of image pads can hold several adjacent images; consume grids until it is covered.
            covered = 0
            while covered < j - i:
                gt, gh, gw = next(grids)
                gh, gw = gh // spatial_merge_size, gw // spatial_merge_size
                tt = torch.arange(gt).view(-1, 1, 1).expand(gt, gh, gw).reshape(-1)
                hh = torch.arange(gh).view(1, -1, 1).expand(gt, gh, gw).reshape(-1)
                ww = torch.arange(gw).view(1, 1, -1).expand(gt, gh, gw).reshape(-1)
                chunks.append(torch.stack([tt, hh, ww]) + pos)
                covered += gt * gh * gw
                pos += max(gh, gw)
        i = j
    positions = torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions.max().item()) + 1 - n if n else 0
    return positions.long(), delta


def extension_positions(start: int, n: int, rope_delta: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Positions ``[3, n]`` of ``n`` text tokens placed at sequence indices ``start .. start+n-1``."""
    return (torch.arange(start, start + n, device=device) + rope_delta).expand(3, -1)
