"""The tiny pair's training script: phase specs, the shared vision pass, and real runs end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from asymspec_mm.eval import minivista as mv
from asymspec_mm.tiny import data, losses, models, train

TINY = Path(__file__).resolve().parents[1] / "asymspec_mm" / "presets_data" / "tiny"
needs_tiny = pytest.mark.skipif(not (TINY / "drafter").is_dir(), reason="tiny pair not shipped")


def test_phase_specs_parse_with_default_colour_weight():
    phases = train.parse_phases(train.DRAFTER_PHASES)  # the shipped drafter's recipe
    assert [(p[0], p[1], p[3]) for p in phases] == [(1200, 2e-3, 0.0), (800, 1.5e-3, 0.3), (600, 1e-3, 0.3), (300, 1e-3, 0.3)]
    assert phases[0][2] == ("visual", "figure", "visual", "geometry")
    assert phases[1][2] == ("figure", "figure", "visual")
    assert phases[2][2] == ("figure", "figure", "visual", "mixed") and phases[3][2] == ("figure", "visual", "geometry", "mixed")
    assert train.parse_phases("10:1e-3:all:0")[0][2] == ()  # "all": every family in turn
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
def test_each_worker_stream_sees_every_family_in_turn(tok_proc):
    """The two workers take every other problem index; each must still get all four families evenly
    (a rotation by index gave the verifier only visual and mixed and the drafter only figure and
    geometry), on disjoint problems; a mix cycles in its own order."""
    tok, proc = tok_proc
    n = 2 * len(mv.FAMILIES)
    drafter = data.Stream(proc, tok, start=0, stride=2).take(n)
    verifier = data.Stream(proc, tok, start=1, stride=2).take(n)
    for taken in (drafter, verifier):
        assert [e["family"] for e in taken] == list(mv.FAMILIES) * 2
    assert not {e["problem"]["query"] + e["problem"]["response"] for e in drafter} & {
        e["problem"]["query"] + e["problem"]["response"] for e in verifier
    }
    assert [e["problem"]["pid"] for e in drafter] == [str(1 + 2 * i) for i in range(n)]
    mixed = data.Stream(proc, tok, start=0, stride=2, mix=("figure", "figure", "mixed")).take(6)
    assert [e["family"] for e in mixed] == ["figure", "figure", "mixed"] * 2


@needs_tiny
def test_shared_vision_step_equals_separate_forwards(tok_proc):
    """One tower pass shared by the full-view batch, the dense descriptions and the token probe gives the
    same loss and the same gradients as the plain way: each batch forwarded with its own pixels (the
    descriptions' prompts built by the processor from each image), the probe on a separate tower pass."""
    tok, proc = tok_proc
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    drafter, _ = models.build_models(tok, seed=3)
    torch.manual_seed(5)
    probe = torch.nn.Linear(drafter.config.text_config.hidden_size, data.N_PROBE_CLASSES)
    problems = [
        mv.make_problem(mv.TRAIN_SEED, i, fam)
        for i, fam in enumerate(("mixed", "visual", "geometry", "visual", "figure", "mixed", "visual", "geometry"))
    ]
    ex = [data.encode(p, proc, tok) for p in problems]
    caps = [data.encode_caption(mv.make_problem(mv.TRAIN_SEED, 50 + j), proc, tok) for j in range(2)]
    params = list(drafter.parameters()) + list(probe.parameters())
    colour, n_perc = 0.3, 5

    tap = losses.LayerTap(drafter)
    loss, parts = train.shared_vision_step(drafter, probe, tap, ex, caps, proc, tok, pad, colour, n_perc)
    grads = torch.autograd.grad(loss, params)

    def forward(batch):
        tap.clear()
        return drafter(**data.model_inputs(batch), use_cache=False).logits

    bf = data.collate(ex + caps, "full", pad, dec_weight=train.DRAFTER_DECISIVE_WEIGHT)
    logits = forward(bf)
    assert len(bf["flat"][0]) == 4  # two mixed problems, two computed numbers each
    ref = 0.6 * (
        losses.lm_loss(logits, bf["labels"], bf["weights"]) + losses.flat_loss(logits, bf["flat"])
    ) + colour * losses.image_position_loss(logits, bf, tap)
    img = proc.image_processor(
        images=[p["decoded_image"] for p in problems] + [c["problem"]["decoded_image"] for c in caps], return_tensors="pt"
    )
    feats = drafter.model.visual(img["pixel_values"], grid_thw=img["image_grid_thw"], return_dict=True).pooler_output
    ref = ref + losses.probe_loss(probe, feats, torch.cat([e["tok_targets"] for e in ex + caps]))
    bp = data.collate([data.encode_perception(p, proc, tok) for p in problems[:n_perc]], "full", pad)
    logits = forward(bp)
    ref = ref + 0.5 * losses.lm_loss(logits, bp["labels"]) + colour * losses.image_position_loss(logits, bp, tap)
    bc = data.collate(ex[: len(ex) // 4], "comp", pad)
    logits = forward(bc)
    assert len(bc["flat"][0]) == 2  # the compressed view of the first (mixed) problem
    ref = ref + 0.4 * (losses.lm_loss(logits, bc["labels"]) + losses.flat_loss(logits, bc["flat"]))
    ref_grads = torch.autograd.grad(ref, params)

    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    assert set(parts) == {"full", "imgcol", "tok", "flat", "perc", "comp"}
    # the check can fail: descriptions paired with the wrong images (the described problems' scenes rotated
    # by one, images kept) give another loss
    crossed = [dict(e, problem=ex[(i + 1) % n_perc]["problem"]) for i, e in enumerate(ex[:n_perc])] + ex[n_perc:]
    with torch.no_grad():
        wrong = train.shared_vision_step(drafter, probe, tap, crossed, caps, proc, tok, pad, colour, n_perc)[1]
    assert abs(wrong["perc"] - parts["perc"]) > 1e-3


MONITOR = ["--monitor-n", "4"]  # the EVAL lines score one held-out problem of each family


def _drafter_run(tmp_path: Path, tok, proc, *extra: str) -> Path:
    """A short real run of the script (batch 4, evaluation only at phase ends) in ``tmp_path/run``."""
    work = tmp_path / "run" / "_work"
    tok.save_pretrained(work / "tokenizer")
    proc.save_pretrained(work / "processor")
    if "--only" in extra:
        shutil.copytree(TINY / "verifier", work / "verifier", dirs_exist_ok=True)
    argv = ["--out", str(tmp_path / "run"), "--batch", "4", "--eval-every", "1000", "--eval-n", "0", *MONITOR, *extra]
    assert train.main(argv) == 0
    return work


@pytest.fixture(scope="module")
def drafter_runs(tmp_path_factory, tok_proc):
    """The drafter alone (beside the shipped verifier), its widening step at 1 (one thread: the bytes are compared, not
    the thread count): two one-step phases in one command (``one``: the first without the colour loss, the second with
    it), and the same two as a command and a resumed one (``two``). Returns both runs' ``_work`` folders and the
    drafter ``two``'s first command exported."""
    tok, proc = tok_proc
    root = tmp_path_factory.mktemp("drafter_runs")
    common = ["--only", "drafter", "--drafter-widen-at", "1", "--threads", "1"]
    one = _drafter_run(root / "one", tok, proc, *common, "--drafter-phases", "1:1e-3:figure,visual:0;1:1e-3:geometry")
    _drafter_run(root / "two", tok, proc, *common, "--drafter-phases", "1:1e-3:figure,visual:0")
    first_phase = (root / "two" / "run" / "drafter" / "model.safetensors").read_bytes()
    two = _drafter_run(root / "two", tok, proc, *common, "--drafter-resume-from", "1", "--drafter-phases", "1:1e-3:geometry")
    return {"one": one, "two": two, "first_phase": first_phase}


@needs_tiny
def test_two_drafter_phases_train_and_export_a_loadable_pair(drafter_runs):
    """Two real optimizer steps in two phases (the first without the colour loss, the second with it,
    from the first's checkpoint), then the export: a pair the pipeline loads and runs."""
    work = drafter_runs["one"]
    log = (work / "train.log").read_text()
    assert "[drafter] EVAL step 1 " in log and "[drafter] EVAL step 2 " in log  # phase 2 resumed at step 1
    assert log.count("[drafter] done in") == 2

    from asymspec_mm import AsymSpecPipeline

    pipe = AsymSpecPipeline.from_pretrained(work.parent / "drafter", work.parent / "verifier", ocr="none")
    p = mv.make_problem(mv.HELDOUT_SEED, 0, "figure")
    out = pipe.generate(p["decoded_image"], p["query"], caption=p["caption"], ocr=False, max_new_tokens=4)
    assert len(out.token_ids) == 4  # the shipped verifier answers in sentences: no early end


@needs_tiny
def test_drafter_widens_at_its_fixed_step_after_the_verifier_and_runs_repeat_exactly(tmp_path, tok_proc):
    """Both models in one run: the drafter waits at ``--drafter-widen-at`` until the verifier's last phase
    has finished, then takes both threads; and the same command twice gives the same checkpoints, byte
    for byte (the widening step is fixed, not timed)."""
    tok, proc = tok_proc
    args = ["--verifier-steps", "1", "--verifier-phase2-steps", "1", "--drafter-phases", "2:1e-3:all:0", "--drafter-widen-at", "1"]
    threads = torch.get_num_threads()
    runs = []
    for name in ("a", "b"):
        work = _drafter_run(tmp_path / name, tok, proc, *args)
        log = (work / "train.log").read_text().splitlines()
        widened = [i for i, line in enumerate(log) if line == "[drafter] step 1: 2 threads from here"]
        verifier_done = [i for i, line in enumerate(log) if line.startswith("[verifier] done in")]
        assert len(widened) == 1 and len(verifier_done) == 2  # two verifier phases
        assert widened[0] > verifier_done[-1]
        runs.append(tmp_path / name / "run")
    assert torch.get_num_threads() == threads  # the two threads were the workers' (and the export's), not the caller's
    for model in ("drafter", "verifier"):
        a, b = ((r / model / "model.safetensors").read_bytes() for r in runs)
        assert a == b, f"{model} differs between two identical runs"


@needs_tiny
def test_a_resumed_phase_gives_the_same_drafter_as_one_run(drafter_runs):
    """Two phases in one command, and the same two as a command plus a resumed one
    (``--drafter-resume-from``), give byte-identical drafters: a pair made in pieces is the default
    command's output. A phase that starts past the widening step starts widened, in both."""
    first, pieces = ((drafter_runs[k].parent / "drafter" / "model.safetensors").read_bytes() for k in ("one", "two"))
    assert first == pieces
    for k in ("one", "two"):
        log = (drafter_runs[k] / "train.log").read_text().splitlines()
        assert log.count("[drafter] step 1: 1 threads from here") == 1, k
    # the check can fail: the second phase changed the drafter
    assert drafter_runs["first_phase"] != first


@needs_tiny
@pytest.mark.timeout(600)  # on a regression the drafter trains for 100,000 steps: fail instead of hanging
def test_a_failed_verifier_stops_the_run_instead_of_leaving_the_drafter_waiting(tmp_path, tok_proc):
    """The verifier cannot save its checkpoint (a file sits where its folder goes): the command reports the
    failure (exit 1) and stops the drafter, which would otherwise wait at its widening step for ever, or
    train for 100,000 steps."""
    tok, proc = tok_proc
    work = tmp_path / "run" / "_work"
    tok.save_pretrained(work / "tokenizer")
    proc.save_pretrained(work / "processor")
    (work / "verifier").write_text("not a folder")
    rc = train.main(
        [
            "--out",
            str(tmp_path / "run"),
            "--batch",
            "4",
            "--eval-every",
            "1",
            "--eval-n",
            "0",
            *MONITOR,
            "--verifier-steps",
            "1",
            "--verifier-phase2-steps",
            "0",
            "--drafter-phases",
            "100000:1e-3:all:0",
            "--drafter-widen-at",
            "1",
        ]
    )
    assert rc == 1
    assert "[drafter] done in" not in (work / "train.log").read_text()


def test_bad_thread_options_are_refused():
    with pytest.raises(SystemExit):
        train.main(["--out", "unused", "--threads", "0"])


def test_verifier_mix_parses_and_bad_families_are_refused(capsys):
    assert train.parse_families(train.VERIFIER_MIX) == ("figure", "visual", "geometry", "mixed", "mixed")
    assert train.parse_families("all") == ()
    with pytest.raises(ValueError, match="unknown family 'charts'; choose among figure, visual, geometry, mixed"):
        train.parse_families("figure,charts")
    with pytest.raises(SystemExit):
        train.main(["--out", "unused", "--verifier-mix", "figure,charts"])
    assert "--verifier-mix: unknown family 'charts'" in capsys.readouterr().err


@needs_tiny
def test_drafter_is_taught_mixed_readings_not_the_sum_and_the_verifier_the_whole_answer(tok_proc):
    """The drafter's views of a mixed answer: every token labelled except the two computed numbers (the
    result and the final answer), which go to the flat loss with every possible answer as candidates;
    the readings weighted. The verifier: the whole answer, nothing flat. Other families: unchanged."""
    tok, proc = tok_proc
    mixed, figure = data.encode(mv.make_problem(0, 3, "mixed"), proc, tok), data.encode(mv.make_problem(0, 0, "figure"), proc, tok)
    scene, answer = mixed["problem"]["scene"], mixed["problem"]["answer"]
    values = [str(scene["values"][scene["colors"].index(c)]) for c in scene["asked"]]
    assert [tok.decode([int(mixed["ans"][i])]).strip() for i in mixed["read_idx"]] == values
    ans = mixed["ans"].tolist()
    computed = [i for i, t in enumerate(ans) if tok.decode([t]) == f" {answer}" and i > mixed["read_idx"][-1]]
    assert mixed["flat_idx"] == computed and len(computed) == 2  # "... = r, so the answer is r."
    assert [tok.decode([t]) for t in mixed["flat_ids"]] == [f" {k}" for k in range(1, 18)]
    for view in ("full", "comp"):
        b = data.collate([mixed, figure], view, 0, dec_weight=8.0)
        p = b["ans_start"][0]
        kept = [i for i in range(len(ans)) if i not in computed]
        assert (b["labels"][0][p : p + len(ans)] != data.PAD_LABEL).nonzero().flatten().tolist() == kept
        assert b["labels"][0][p : p + len(ans)][kept].tolist() == [ans[i] for i in kept]
        weighted = (b["weights"][0][p : p + len(ans)] == 8.0) & (b["labels"][0][p : p + len(ans)] != data.PAD_LABEL)
        assert weighted.nonzero().flatten().tolist() == mixed["read_idx"]  # the readings, of the labelled tokens
        assert b["flat"] == ([0, 0], [p + i for i in computed], [mixed["flat_ids"]] * 2)
        # the other families keep their whole answer
        assert tok.decode(b["labels"][1][b["labels"][1] != data.PAD_LABEL]) == figure["problem"]["response"] + "<|im_end|>"
    v = data.collate([mixed], "ver", 0)
    assert tok.decode(v["labels"][0][v["labels"][0] != data.PAD_LABEL]) == mixed["problem"]["response"] + "<|im_end|>"
    assert v["flat"] == ([], [], [])


def test_flat_loss_is_the_kl_from_uniform_over_the_candidates():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11) * 3
    flat = ([0, 1, 1], [3, 5, 2], [[1, 2, 3], [4, 5, 6, 7], [0, 10]])
    expected = []
    for r, q, cand in zip(*flat):  # the prediction for position q is read at q - 1
        p = torch.softmax(logits[r, q - 1].double(), dim=-1)
        expected.append(sum((1 / len(cand)) * torch.log((1 / len(cand)) / p[c]) for c in cand))
    assert torch.allclose(losses.flat_loss(logits, flat).double(), torch.stack(expected).mean(), atol=1e-5)
    even = torch.full((1, 4, 11), -30.0)
    even[0, 1, [2, 5, 9]] = 4.0
    assert losses.flat_loss(even, ([0], [2], [[2, 5, 9]])).item() < 1e-6  # all mass evenly on the candidates
    assert losses.flat_loss(even, ([0], [2], [[2, 5]])).item() > 0.2  # mass left on a non-candidate
    assert losses.flat_loss(logits, ([], [], [])).item() == 0.0


def test_probe_targets_mark_the_leftmost_and_rightmost_shapes():
    seen = set()
    for i in range(40):
        p = mv.make_problem(mv.TRAIN_SEED, i, "visual")
        cells = p["scene"]["cells"]
        side = data.token_targets(p)[:, 2].tolist()
        cols = {c: c % 4 for c in cells}
        lo, hi = min(cols.values()), max(cols.values())
        for cell in range(16):
            if cell not in cols:
                want = data.SIDE_NONE
            else:
                want = {
                    (True, True): data.SIDE_BOTH,
                    (True, False): data.SIDE_LEFT,
                    (False, True): data.SIDE_RIGHT,
                    (False, False): data.SIDE_NONE,
                }[(cols[cell] == lo, cols[cell] == hi)]
            assert side[cell] == want, (cells, cell)
        seen.update(side)
        if p["metadata"]["kind"] == "leftmost":  # the answer is the shape the LEFT mark sits on
            left = [k for c, k in zip(cells, p["scene"]["kinds"]) if side[c] == data.SIDE_LEFT]
            assert left == [p["answer"]]
    assert {data.SIDE_LEFT, data.SIDE_RIGHT, data.SIDE_NONE} <= seen
    for fam in ("figure", "mixed", "geometry"):  # no side for charts and triangles
        assert (data.token_targets(mv.make_problem(mv.TRAIN_SEED, 0, fam))[:, 2] == data.PAD_LABEL).all()


def test_probe_loss_sums_the_cross_entropies_of_the_labelled_columns():
    torch.manual_seed(0)
    probe = torch.nn.Linear(8, data.N_PROBE_CLASSES)
    feats = torch.randn(32, 8)
    chart = data.token_targets(mv.make_problem(mv.TRAIN_SEED, 0, "figure"))
    scene = data.token_targets(mv.make_problem(mv.TRAIN_SEED, 1, "visual"))
    targets = torch.cat([chart, scene])
    logits = probe(feats)
    bounds = [0, data.N_COLOR_CLASSES, data.N_COLOR_CLASSES + data.N_ATTR_CLASSES, data.N_PROBE_CLASSES]
    expected = 0.0
    for k in range(3):  # mean over the rows that carry column k
        rows = (targets[:, k] != data.PAD_LABEL).nonzero().flatten()
        expected += torch.stack([-torch.log_softmax(logits[r, bounds[k] : bounds[k + 1]], -1)[targets[r, k]] for r in rows]).mean()
    assert torch.allclose(losses.probe_loss(probe, feats, targets), expected, atol=1e-5)
    # charts alone: no side labels at all, and the loss stays finite (the side term is left out)
    only_chart = losses.probe_loss(probe, feats[:16], chart)
    assert torch.isfinite(only_chart) and only_chart.item() > 0
    geometry = data.token_targets(mv.make_problem(mv.TRAIN_SEED, 2, "geometry"))
    assert losses.probe_loss(probe, feats[:16], geometry).item() == 0.0
