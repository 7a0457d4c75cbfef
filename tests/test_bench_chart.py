"""The bench chart draws a panel for each part of the run that has data, and no empty panel (real matplotlib
figures, read back through their axes, and a real PNG)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asymspec_mm.bench.chart import build_chart, chart_panels, render_chart
from asymspec_mm.bench.settings import SPLIT_KEYS

pytest.importorskip("matplotlib")

META = {"pair": "tiny", "device": "cpu", "dtype": "float32", "trained": True}
MAIN = {
    "variants": {
        name: {"method": method, "ratio_to_floor": ratio, "split_frac": dict.fromkeys(SPLIT_KEYS, 1 / len(SPLIT_KEYS))}
        for name, method, ratio in (("floor", "floor", 1.0), ("asymspec", "asymspec", 0.8))
    }
}
LENGTH = {"by_length": {str(n): {"floor": {"token_s": 0.01 * n}, "asymspec": {"token_s": 0.02 * n}} for n in (64, 128)}}
K = {"by_k": {"floor": {"ratio_to_floor": 1.0}, "K=2": {"ratio_to_floor": 0.9}, "K=4": {"ratio_to_floor": 0.8}}}
BATCH = {
    "mode": "real",
    "sizes": [1, 2],
    "by_variant": {"floor": {"1": {"ratio_to_seq": 1.0, "step_ratio": 1.0}, "2": {"ratio_to_seq": 1.7, "step_ratio": 1.2}}},
}
ALL = ["Throughput", "Per-step time split", "Per-token time vs prompt length", "Scaling with K"]
BATCH_TITLES = ["Batched decoding: throughput", "Batched decoding: time per step"]


def titles(res: dict) -> list[str]:
    """The titles of the axes of the chart of ``res``, and check none of them is blank or hidden."""
    import matplotlib.pyplot as plt

    fig = build_chart(res)
    try:
        assert all(ax.get_visible() and ax.axison and (ax.lines or ax.patches) for ax in fig.axes)
        return [ax.get_title() for ax in fig.axes]
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    "parts, expected",
    [
        ({"main": MAIN, "scaling_length": LENGTH, "scaling_k": K, "batching": BATCH}, ALL + BATCH_TITLES),
        ({"main": MAIN}, ALL[:2]),  # both sweeps skipped: two panels, not two more empty ones
        ({"main": MAIN, "scaling_k": K}, [ALL[0], ALL[1], ALL[3]]),
        ({"scaling_length": LENGTH, "batching": BATCH}, [ALL[2], *BATCH_TITLES]),
        ({"main": {"variants": {}}, "scaling_length": {}, "scaling_k": {"by_k": {"floor": {"ratio_to_floor": 1.0}}}}, []),
    ],
)
def test_only_the_panels_with_data_are_drawn(parts, expected):
    res = {"meta": META, **parts}
    assert [title for title, _ in chart_panels(res)] == expected
    assert titles(res) == expected


def test_an_odd_last_panel_spans_the_row_and_the_png_is_written(tmp_path: Path):
    import matplotlib.pyplot as plt

    fig = build_chart({"meta": META, "main": MAIN, "scaling_k": K})
    try:
        widths = [ax.get_position().width for ax in fig.axes]
        assert widths[2] > 1.8 * widths[0]  # "Scaling with K" alone on its row, full width
    finally:
        plt.close(fig)
    png = render_chart({"meta": META, "main": MAIN}, tmp_path / "b.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
