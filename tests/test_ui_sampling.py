"""Sampling in the steering inspector: temperature, top-p and seed make every row sample; the answer equals
``pipe.generate`` with the same settings, the status names the seed that repeats it, the hover box shows the
acceptance probability; bad settings are one-line errors. Real forwards on the tiny random pair."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import saved_case  # noqa: E402
from test_ui import RUN_DEFAULTS, demo_args  # noqa: E402

from ui.app import DemoInputError, outputs_as_dict  # noqa: E402
from ui.sampling_inputs import check_sampling_inputs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio

CONFIG_FIELDS = ("k", "beta", "gamma", "gate", "delta", "bonus", "max_new_tokens", "drafter_view")


@pytest.fixture
def image_case(tmp_path):
    return saved_case(tmp_path, 81, "sampled.png")


def run_sampled(state, path, case, temperature, top_p, seed, **kw):
    args = demo_args(path, case, **kw)
    return outputs_as_dict(list(state.run(*args, False, "", "auto", temperature, top_p, seed, session="s"))[-1])


def reference(pipe, path, case, method="asymspec", **kw):
    o = {**RUN_DEFAULTS, **kw}
    settings = {f: o[f] for f in CONFIG_FIELDS} | {k: kw[k] for k in ("temperature", "top_p", "seed") if k in kw}
    return pipe.generate(str(path), case["question"], caption=case["caption"], ocr=case["ocr"] or False, method=method, **settings)


def test_a_sampled_run_equals_generate_and_names_its_seed(tiny_pipe, state, image_case):
    path, case = image_case
    out = run_sampled(state, path, case, 1.1, 0.9, 7, max_new_tokens=16)
    want = reference(tiny_pipe, path, case, temperature=1.1, top_p=0.9, seed=7, max_new_tokens=16)
    assert out["result_json"]["main"]["token_ids"] == want.token_ids
    assert "sampled at temperature 1.1, seed 7" in out["status"]
    floor = reference(tiny_pipe, path, case, method="floor", temperature=1.1, top_p=0.9, seed=7, max_new_tokens=16)
    assert out["result_json"]["floor"]["token_ids"] == floor.token_ids  # the comparisons sample too
    assert "sampled: acceptance probability" in out["answer_html"]


def test_an_empty_seed_draws_one_that_repeats_the_run(tiny_pipe, state, image_case):
    path, case = image_case
    out = run_sampled(state, path, case, 0.8, 1.0, None, max_new_tokens=12, compare=False)
    seed = int(re.search(r"sampled at temperature 0.8, seed (\d+)", out["status"]).group(1))
    again = run_sampled(state, path, case, 0.8, 1.0, seed, max_new_tokens=12, compare=False)
    assert again["result_json"]["main"]["token_ids"] == out["result_json"]["main"]["token_ids"]


def test_greedy_runs_are_unchanged(tiny_pipe, state, image_case):
    path, case = image_case
    out = run_sampled(state, path, case, 0, 1.0, None, max_new_tokens=10, compare=False)
    assert out["result_json"]["main"]["token_ids"] == reference(tiny_pipe, path, case, max_new_tokens=10).token_ids
    assert "sampled at" not in out["status"] and "sampled:" not in out["answer_html"]


def test_bad_settings_are_one_line_errors_and_the_app_keeps_serving(state, image_case):
    path, case = image_case
    out = run_sampled_error(state, path, case, 3.0, 1.0, None)
    assert "temperature=3.0 must be" in out and "\n" not in out
    out = run_sampled(state, path, case, 0.5, 1.0, 3, max_new_tokens=4, compare=False)
    assert 'data-status="ok"' in out["status"]
    assert check_sampling_inputs(0.7, 0.8, 12.0) == {"temperature": 0.7, "top_p": 0.8, "seed": 12}
    assert check_sampling_inputs(None, None, float("nan")) == {"temperature": 0.0, "top_p": 1.0}
    for bad, words in (((0.5, 0, None), "top_p=0.0 must be"), ((0.5, 1, 1.5), "whole number"), ((0.5, 1, -1), "whole number")):
        with pytest.raises(DemoInputError, match=words):
            check_sampling_inputs(*bad)


def run_sampled_error(state, path, case, temperature, top_p, seed) -> str:
    """The status text of a refused run (the handler yields the error, then raises Gradio's error)."""
    run = state.run(*demo_args(path, case), False, "", "auto", temperature, top_p, seed, session="e")
    first = outputs_as_dict(next(run))
    with pytest.raises(Exception):  # noqa: B017 - gr.Error: the toast
        next(run)
    return re.sub(r"<[^>]+>", "", first["status"])


def test_the_seed_field_starts_empty_and_reads_what_is_typed():
    """#41: the field showed 0 on load (Gradio's Number shows 0 for no value), so every sampled run used seed 0. It is
    a text field now, empty on load; typed digits (blanks around them too) are the seed, blanks none."""
    import gradio as gr

    from ui.sampling_inputs import build_sampling_inputs

    with gr.Blocks():
        _, _, seed = build_sampling_inputs()
    assert seed.value == "" and not isinstance(seed, gr.Number) and "fresh" in seed.placeholder
    assert check_sampling_inputs(0.7, 1.0, " 42 ")["seed"] == 42 and check_sampling_inputs(0.7, 1.0, "0")["seed"] == 0
    assert "seed" not in check_sampling_inputs(0.7, 1.0, "") and "seed" not in check_sampling_inputs(0.7, 1.0, "   ")
    with pytest.raises(DemoInputError, match="whole number"):
        check_sampling_inputs(0.7, 1.0, "4 2")
