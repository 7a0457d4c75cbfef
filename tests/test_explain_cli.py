"""``asymspec-mm explain --attribute``: the trace JSON and each attributed token's heat maps beside it."""

from __future__ import annotations

import json

from PIL import Image

from asymspec_mm.cli.main import main
from asymspec_mm.eval.minivista import HELDOUT_SEED, make_problem


def test_explain_writes_the_trace_and_heat_maps_the_size_of_the_image(tmp_path, capsys):
    p = make_problem(HELDOUT_SEED, 1, "figure")
    image = tmp_path / "chart.png"
    p["decoded_image"].resize((256, 192)).save(image)  # not the processor's size: boxes must be scaled back
    trace = tmp_path / "out" / "trace.json"
    argv = ["explain", "--preset", "tiny", "--no-ocr", "-q", "--image", str(image), "--question", p["query"]]
    rc = main([*argv, "--caption", p["caption"], "--trace-json", str(trace), "--attribute", "--positions", "1", "5"])
    assert rc == 0
    data = json.loads(trace.read_text())
    assert [a["position"] for a in data["attributions"]] == [1, 5]
    assert len(data["trace"]) == len(data["token_ids"])
    for att in data["attributions"]:
        names = att["files"]
        assert names == [f"trace_tok{att['position']}_image0_heat.png", f"trace_tok{att['position']}_image0.png"]
        heat, over = (Image.open(trace.parent / n) for n in names)
        assert heat.size == over.size == (256, 192) and heat.mode == "L" and over.mode == "RGB"
        top = att["regions"][0]
        x0, y0, x1, y1 = top["box"]
        rows, cols = att["images"][0]["merged"]
        assert (rows, cols) == (3, 4)  # the processor resized 256 x 192 to 128 x 96: 3 x 4 merged patches of 32 px
        assert (x1 - x0, y1 - y0) == (256 // cols, 192 // rows)  # each a region, scaled back to the original pixels
        if top["score"] > 0:
            # the brightest cell of the map is the top region, and it is the only one at full brightness
            assert heat.getextrema()[1] == 255
            assert heat.crop((x0, y0, x1, y1)).getextrema() == (255, 255)
            full = sum(1 for v in heat.getdata() if v == 255)
            assert full == (x1 - x0) * (y1 - y0) or sum(r["score"] == top["score"] for r in att["regions"]) > 1
    out = capsys.readouterr().out
    assert f"wrote {trace}" in out and "answer:" in out


def test_explain_refuses_a_position_outside_the_answer(tmp_path, capsys):
    p = make_problem(HELDOUT_SEED, 1, "figure")
    image = tmp_path / "chart.png"
    p["decoded_image"].save(image)
    argv = ["explain", "--preset", "tiny", "--no-ocr", "-q", "--image", str(image), "--question", p["query"], "--caption", p["caption"]]
    rc = main([*argv, "--trace-json", str(tmp_path / "t.json"), "--attribute", "--positions", "999", "--max-new-tokens", "4"])
    assert rc == 2
    assert "--positions 999 is outside the answer's 4 tokens" in capsys.readouterr().err


def test_explain_attributes_with_the_gradient_method(tmp_path):
    p = make_problem(HELDOUT_SEED, 1, "figure")
    image = tmp_path / "chart.png"
    p["decoded_image"].save(image)
    trace = tmp_path / "trace.json"
    argv = ["explain", "--preset", "tiny", "--no-ocr", "-q", "--image", str(image), "--question", p["query"], "--caption", p["caption"]]
    rc = main(
        [*argv, "--trace-json", str(trace), "--attribute", "--positions", "1", "--attribution-method", "gradient", "--max-new-tokens", "4"]
    )
    assert rc == 0
    (att,) = json.loads(trace.read_text())["attributions"]
    assert att["method"] == "gradient" and att["timings"]["masks"] == 0 and len(att["regions"]) == 16
    assert (trace.parent / "trace_tok1_image0_heat.png").is_file()
