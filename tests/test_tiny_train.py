"""The tiny pair's training script: phase specs, the token probe's features, and a few real steps end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from asymspec_mm.eval import minivista as mv
from asymspec_mm.tiny import train

TINY = Path(__file__).resolve().parents[1] / "asymspec_mm" / "presets_data" / "tiny"
needs_tiny = pytest.mark.skipif(not (TINY / "drafter").is_dir(), reason="tiny pair not shipped")


def test_phase_specs_parse_with_default_colour_weight():
    phases = train.parse_phases(train.DRAFTER_PHASES)  # the shipped drafter's recipe
    assert [(p[0], p[1], p[3]) for p in phases] == [(1500, 2e-3, 0.0), (1000, 1.5e-3, 0.3), (400, 1e-3, 0.3)]
    assert phases[0][2] == ()  # "all": the generator's own rotation of families
    assert phases[1][2] == ("figure", "figure", "visual", "geometry")
    assert train.parse_phases("10:1e-3:visual")[0][3] == train.IMAGE_COLOUR_WEIGHT
    assert train.parse_phases(" ; ") == []


@pytest.mark.parametrize("spec", ["100:1e-3", "0:1e-3:figure", "10:1e-3:charts", "10:1e-3:figure:-1", "10:x:figure", "1:1:figure:0:9"])
def test_bad_phase_specs_name_the_problem(spec):
    with pytest.raises(ValueError, match="bad drafter phase"):
        train.parse_phases(spec)


@pytest.fixture(scope="module")
def tok_proc():
    from transformers import AutoTokenizer, Qwen3VLProcessor

    return AutoTokenizer.from_pretrained(TINY / "drafter"), Qwen3VLProcessor.from_pretrained(TINY / "drafter")


@needs_tiny
def test_probe_on_the_full_batch_reads_the_same_tokens_as_a_separate_tower_pass(tok_proc):
    """The probe's default reads the merged vision tokens the full-view forward computed (VisionTap), in
    the order of the batch's images: its loss equals the loss of a separate vision-tower pass on the same
    problems, whose targets come from each problem's own scene."""
    tok, proc = tok_proc
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    drafter, _ = train.build_models(tok, seed=3)
    drafter.eval()
    probe = torch.nn.Linear(drafter.config.text_config.hidden_size, train.N_COLOR_CLASSES + train.N_ATTR_CLASSES)
    problems = [mv.make_problem(mv.TRAIN_SEED, i, fam) for i, fam in enumerate(("figure", "visual", "geometry", "visual"))]
    batch = train.collate([train.encode(p, proc, tok) for p in problems], "full", pad)
    tap = train.VisionTap(drafter)
    with torch.no_grad():
        drafter(**train.model_inputs(batch), use_cache=False)
        assert tap.feats.shape[0] == 16 * len(problems)
        from_batch = train.probe_loss(probe, tap.feats, torch.cat([train.token_targets(p) for p in problems]))
        separate = train.token_probe_loss(drafter, probe, problems, proc)
        # a different order of targets must give a different loss (the check can fail)
        shuffled = train.probe_loss(probe, tap.feats, torch.cat([train.token_targets(p) for p in problems[::-1]]))
    torch.testing.assert_close(from_batch, separate, rtol=1e-5, atol=1e-5)
    assert abs(float(shuffled) - float(separate)) > 1e-3


@needs_tiny
@pytest.mark.parametrize("probe_batch", ["4", "0"])
def test_two_drafter_phases_train_and_export_a_loadable_pair(tmp_path, tok_proc, probe_batch):
    """Three real optimizer steps in two phases (the first without the colour loss, the second with it,
    from the first's checkpoint; the token probe on its own images or on the batch's), then the export:
    a pair the pipeline loads and runs."""
    tok, proc = tok_proc
    work = tmp_path / "run" / "_work"
    tok.save_pretrained(work / "tokenizer")
    proc.save_pretrained(work / "processor")
    shutil.copytree(TINY / "verifier", work / "verifier")
    rc = train.main(["--out", str(tmp_path / "run"), "--only", "drafter", "--batch", "4", "--eval-every", "1000", "--eval-n", "0", "--probe-batch", probe_batch,
                     "--drafter-phases", "2:1e-3:figure,visual:0;1:1e-3:geometry"])
    assert rc == 0
    log = (work / "train.log").read_text()
    assert "[drafter] EVAL step 2 " in log and "[drafter] EVAL step 3 " in log  # phase 2 resumed at step 2
    assert log.count("[drafter] done in") == 2

    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(tmp_path / "run" / "drafter", tmp_path / "run" / "verifier", ocr="none")
    p = mv.make_problem(mv.HELDOUT_SEED, 0, "figure")
    out = pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=False, max_new_tokens=4)
    assert len(out.token_ids) == 4  # the shipped verifier answers in sentences: no early end
