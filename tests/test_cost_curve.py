"""The cost-emulating verifier twin and ``bench --cost-ratio``: the twin's logits equal the verifier's bit for bit and
its tokens equal on MiniVista problems; the curve's formulas; a short run writes its report, chart and JSON, every
one of them naming the emulator."""

from __future__ import annotations

import json

import pytest
import torch

from asymspec_mm.bench.cost_curve import break_even, per_call_bound
from asymspec_mm.bench.twin import build_twin, is_twin, layers_for_ratio
from asymspec_mm.pipeline.presets import TINY_DIR, TINY_OCR_LAYOUT

LOAD = dict(ocr="none", device="cpu", dtype="fp32", ocr_layout=TINY_OCR_LAYOUT, local_files_only=True)


@pytest.fixture(scope="module")
def twin_dir(tmp_path_factory):
    return build_twin(TINY_DIR / "verifier", tmp_path_factory.mktemp("twin"), 5)


def test_the_twin_is_the_verifier_bit_for_bit(twin_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(TINY_DIR / "verifier", local_files_only=True).eval()
    twin = AutoModelForCausalLM.from_pretrained(twin_dir, local_files_only=True).eval()
    assert twin.config.num_hidden_layers == base.config.num_hidden_layers + 5
    assert is_twin(twin_dir) and not is_twin(TINY_DIR / "verifier")
    assert "COST EMULATOR, NOT A BIGGER MODEL" in (twin_dir / "COST_EMULATOR.txt").read_text()
    extra = twin.model.layers[base.config.num_hidden_layers]
    assert not extra.self_attn.o_proj.weight.any() and not extra.mlp.down_proj.weight.any() and extra.mlp.up_proj.weight.any()
    ids = torch.randint(3, base.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(base(input_ids=ids).logits, twin(input_ids=ids).logits)


def test_the_twins_tokens_equal_the_verifiers(twin_dir):
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.eval.minivista import make_problem

    base = AsymSpecPipeline.from_pretrained(TINY_DIR / "drafter", TINY_DIR / "verifier", **LOAD)
    twin = AsymSpecPipeline.from_pretrained(TINY_DIR / "drafter", twin_dir, **LOAD)
    for i, family in enumerate(("figure", "visual", "mixed")):
        p = make_problem(23, i, family)
        for method in ("floor", "asymspec"):
            kw = dict(caption=p["caption"], ocr=p["ocr"], method=method, max_new_tokens=40)
            a, b = base.generate(p["decoded_image"], p["query"], **kw), twin.generate(p["decoded_image"], p["query"], **kw)
            assert a.token_ids == b.token_ids and [e.source for e in a.trace] == [e.source for e in b.trace], (family, method)


def test_the_curves_formulas():
    assert layers_for_ratio(10, 4, {4: 0.004, 20: 0.020}, 0.002) == 20  # 1 ms a layer, no fixed cost: 20 ms = 10 * 2 ms
    assert layers_for_ratio(1, 4, {4: 0.004, 20: 0.020}, 0.002) == 4  # never fewer than the verifier's own layers
    costs = {"drafter_1": 1.0, "drafter_comp_k1": 2.0, "verifier_1": 10.0, "verifier_k1": 14.0}
    assert per_call_bound(4.0, costs, 4) == pytest.approx(40.0 / 20.0)
    assert break_even([(2.0, 0.5), (8.0, 1.5)]) == pytest.approx(4.0)  # 1 is halfway: halfway in log r between 2 and 8
    assert break_even([(2.0, 1.5), (8.0, 2.0)]) is None


def test_a_short_curve_writes_its_outputs(tmp_path, capsys):
    from asymspec_mm.bench.cli import main

    args = ["--cost-ratio", "3", "--cost-cases", "1", "--reps", "1", "--max-new-tokens", "6", "--cost-batch", "2", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "cost emulator" in out and "target" in out
    res = json.loads((tmp_path / "cost-curve.json").read_text())
    assert "not a bigger model" in res["what"] and len(res["points"]) == 1
    p = res["points"][0]
    assert p["twin_tokens_equal"]["equal"] == p["twin_tokens_equal"]["of"] == 2
    assert set(p["methods"]) == {"floor", "sd", "asymspec", "drafter"} and "batch_vs_floor" in p["methods"]["asymspec"]
    assert p["measured_ratio"] > 1 and p["costs_s"]["verifier_k1"] > 0
    md = (tmp_path / "cost-curve.md").read_text()
    assert "not a bigger model" in md and "| 3 |" in md
    assert (tmp_path / "cost-curve.png").stat().st_size > 1000
    assert main(["--cost-ratio", "0.5", "--out", str(tmp_path)]) == 2
    assert "give ratios >= 1" in capsys.readouterr().err
