"""Region attribution of the drafter's steering: which parts of an image made the drafter push the verifier to a
token (:func:`attribute`, ``pipe.attribute``), the region grid (:mod:`.regions`), the occlusion forwards
(:mod:`.occlusion`) and heat-map images (:mod:`.heatmap`)."""

from .attribute import (
    METHODS,
    Attribution,
    ImageGrid,
    NothingToAttributeError,
    Region,
    attribute,
    default_positions,
    nothing_to_attribute,
    result_images,
)
from .heatmap import heat_image, overlay, write_heatmaps
from .occlusion import BASELINES
from .regions import Box, RegionCell, region_cells, spans

__all__ = [
    "BASELINES",
    "METHODS",
    "Attribution",
    "Box",
    "ImageGrid",
    "NothingToAttributeError",
    "Region",
    "RegionCell",
    "attribute",
    "default_positions",
    "heat_image",
    "nothing_to_attribute",
    "overlay",
    "write_heatmaps",
    "region_cells",
    "result_images",
    "spans",
]
