"""SD with its own text drafter (``sd_drafter``, the paper's SD baseline): loading, vocabulary check, losslessness."""

from __future__ import annotations

import pytest
import torch
from conftest import make_case

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline
from asymspec_mm.base.errors import UnknownOptionError, VocabularyMismatchError


def _save_text_drafter(tiny_dirs, out, *, seed: int = 7, extra_vocab: int = 0, layers: int = 1):
    """A small random Qwen3 causal LM built from the tiny verifier's config (fewer layers, own seed), pulled
    towards the verifier's weights so that it agrees with it often but not always; saved with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from asymspec_mm.checkpoints.small import correlate_

    cfg = AutoConfig.from_pretrained(tiny_dirs[1])
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:layers]
    cfg.vocab_size += extra_vocab
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    verifier = AutoModelForCausalLM.from_pretrained(tiny_dirs[1])
    correlate_(model, verifier, 0.3)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dirs[1]).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def sd_dir(tiny_dirs, tmp_path_factory):
    return _save_text_drafter(tiny_dirs, tmp_path_factory.mktemp("sd_drafter"))


@pytest.fixture(scope="module")
def sd_pipe(tiny_dirs, sd_dir):
    return AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", sd_drafter=sd_dir)


def _kw(seed: int, k: int = 3, max_new: int = 14) -> dict:
    case = make_case(seed)
    return dict(
        image=case["image"],
        question=case["question"],
        caption=case["caption"],
        ocr=case["ocr"],
        config=AsymSpecConfig(k=k, max_new_tokens=max_new),
    )


@torch.no_grad()
def _greedy(model, ids: torch.Tensor, n: int) -> list[int]:
    """n greedy tokens of ``model`` after ``ids`` ``[L]``, each from a full no-cache forward."""
    out: list[int] = []
    for _ in range(n):
        logits = model(input_ids=torch.cat([ids, torch.tensor(out, dtype=torch.long)])[None]).logits[0, -1]
        out.append(int(logits.argmax()))
    return out


def test_sd_with_text_drafter_equals_floor_token_for_token(sd_pipe, sd_dir):
    sources: dict[str, int] = {}
    for seed in range(8):
        kw = _kw(seed)
        floor = sd_pipe.generate(method="floor", **kw)
        sd = sd_pipe.generate(method="sd", **kw)
        assert sd.token_ids == floor.token_ids, seed
        assert sd.stats["sd_drafter"] == str(sd_dir)
        for ev in sd.trace:
            sources[ev.source] = sources.get(ev.source, 0) + 1
    assert sources.get("accepted") and sources.get("corrected"), sources  # both branches of SD ran


def test_text_drafter_drafts_on_the_verifier_prompt(sd_pipe):
    """The first step's drafts are the text drafter's greedy tokens after the verifier's prompt (a no-cache
    forward of the drafter itself), not the VL drafter's: accepted ones are emitted, the first mismatch is
    recorded as the corrected event's draft."""
    k, checked = 3, 0
    for seed in range(8):
        sd = sd_pipe.generate(method="sd", **_kw(seed, k=k))
        prompt = sd.prompts.verifier_ids[0]
        # it read the verifier's prompt (what earlier requests stored of it is reused)
        assert sd.stats["prefill_tokens"]["drafter_comp"] + sd.stats["cached_tokens"]["drafter_comp"] == prompt.numel() - 1
        drafts = _greedy(sd_pipe.sd_drafter, prompt, k)
        first = [ev for ev in sd.trace if ev.step == 1]
        n_acc = sum(ev.source == "accepted" for ev in first)
        assert [ev.token_id for ev in first[:n_acc]] == drafts[:n_acc]
        if n_acc < k and len(first) > n_acc:
            assert first[n_acc].source == "corrected" and first[n_acc].draft_token == drafts[n_acc]
            checked += 1
    assert checked  # some first step ended at a mismatch


def test_default_sd_drafter_is_the_vl_drafter(tiny_pipe):
    sd = tiny_pipe.generate(method="sd", **_kw(0))
    assert tiny_pipe.sd_drafter is None and sd.stats["sd_drafter"] == "drafter (compressed view)"
    used = sd.stats["prefill_tokens"]["drafter_comp"] + sd.stats["cached_tokens"]["drafter_comp"]
    assert used == sd.prompts.drafter_comp_ids.shape[1] - 1
    assert "sd_drafter" not in tiny_pipe.generate(method="floor", **_kw(0)).stats


def test_batched_sd_with_text_drafter_equals_single_rows(sd_pipe):
    seeds = range(5)
    cfg = AsymSpecConfig(k=3, max_new_tokens=12)
    requests = []
    for s in seeds:
        case = make_case(s)
        requests.append({"image": case["image"], "question": case["question"], "caption": case["caption"], "ocr": case["ocr"]})
    batched = sd_pipe.generate_batch(requests, method="sd", config=cfg, batch_size=3)
    for req, res in zip(requests, batched):
        single = sd_pipe.generate(req["image"], req["question"], caption=req["caption"], ocr=req["ocr"], method="sd", config=cfg)
        assert res.token_ids == single.token_ids
        assert [ev.source for ev in res.trace] == [ev.source for ev in single.trace]
        assert res.stats["sd_drafter"] == single.stats["sd_drafter"]
    assert max(r.stats["batch_size"] for r in batched) == 3


def test_vocabulary_mismatch_is_one_line(tiny_dirs, tmp_path):
    bad = _save_text_drafter(tiny_dirs, tmp_path / "wide", extra_vocab=8)
    with pytest.raises(VocabularyMismatchError) as err:
        AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", sd_drafter=bad)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("the SD drafter has ") and "output logits and the verifier" in msg


def test_missing_sd_drafter_is_one_line(tiny_dirs, tmp_path):
    with pytest.raises(UnknownOptionError) as err:
        AsymSpecPipeline.from_pretrained(*tiny_dirs, ocr="none", sd_drafter=tmp_path / "nothing-here")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"the SD drafter checkpoint {str(tmp_path / 'nothing-here')!r} does not exist")


@pytest.mark.parametrize("command", [["generate"], ["eval", "mathvista"], ["bench"], ["batch"], ["serve"]])
def test_sd_drafter_option_on_the_commands(command, capsys):
    from asymspec_mm.cli.main import main

    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert "--sd-drafter ID" in capsys.readouterr().out


def test_cli_generate_loads_the_sd_drafter(tiny_dirs, sd_dir, capsys, tmp_path):
    import json

    from asymspec_mm.cli.main import main

    case = make_case(2)
    img = tmp_path / "img.png"
    case["image"].save(img)
    argv = ["generate", "--drafter", str(tiny_dirs[0]), "--verifier", str(tiny_dirs[1]), "--ocr-engine", "none", "--image", str(img)]
    argv += ["--question", case["question"], "--caption", case["caption"], "--no-ocr", "--max-new-tokens", "6", "--json"]
    assert main(argv + ["--method", "sd", "--sd-drafter", str(sd_dir)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["sd_drafter"] == str(sd_dir) and out["method"] == "sd"
    assert main(argv + ["--method", "floor"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == out["token_ids"]


@pytest.mark.parametrize("prefill", ["pipeline", "synthetic"])
def test_bench_runs_sd_with_the_text_drafter(sd_pipe, sd_dir, prefill):
    """bench with the SD drafter and a gamma-swept variant: every run passes its bookkeeping checks, the meta
    names the SD drafter, and SD's drafting stream read the verifier's prompt."""
    from asymspec_mm.bench import run_bench
    from asymspec_mm.bench.cli import main_variants

    variants = main_variants("floor;sd;asymspec", gamma="0.4")
    fast = dict(reps=1, warmup=0, cases=1, max_new_tokens=6, prompt_lengths=(24,), k_values=(), probe_batching=False, progress=False)
    res = run_bench("random-tiny", pipeline=sd_pipe, variants=variants, prefill=prefill, image_tokens=5, **fast)
    assert res["meta"]["sd_drafter"] == str(sd_dir)
    runs = {run["variant"]: run for run in res["main"]["runs"]}
    assert set(runs) == {"floor", "sd", "asymspec@gamma=0.4"}
    for run in runs.values():
        assert run["checks"]["forwarded_ok"], run["checks"]
    sd_prefill = runs["sd"]["prefill_tokens"]
    assert sd_prefill["drafter_comp"] == sd_prefill["verifier"]  # the text drafter read the verifier's prompt (or its length)


def test_batch_resume_identity_names_the_sd_drafter(tiny_dirs, sd_dir):
    """A batch run's identity (what --resume must find unchanged) holds the SD drafter when method is sd."""
    import argparse

    from asymspec_mm.cli.batch import identity_diff, run_identity

    base = dict(
        drafter=str(tiny_dirs[0]), verifier=str(tiny_dirs[1]), preset=None, device="cpu", dtype="fp32", ocr_engine="none", trace=False
    )
    cfg = AsymSpecConfig()
    with_sd, _ = run_identity(argparse.Namespace(**base, method="sd", sd_drafter=str(sd_dir)), cfg)
    without, _ = run_identity(argparse.Namespace(**base, method="sd", sd_drafter=None), cfg)
    assert with_sd["models"]["sd_drafter"]["path"] == str(sd_dir.resolve()) and with_sd["models"]["sd_drafter"]["files"]
    (diff,) = identity_diff(without, with_sd)
    assert diff.startswith("models.sd_drafter ((absent) -> ") and str(sd_dir.resolve()) in diff
    floor, _ = run_identity(argparse.Namespace(**base, method="floor", sd_drafter=str(sd_dir)), cfg)
    assert "sd_drafter" not in floor["models"]  # Floor's tokens do not depend on it
