"""The steering inspector on a cross-family pair: a run answers as ``pipe.generate``, each token's hover box and data
attributes carry both its verifier id and its drafter id, a position where the verifier decided alone says so, and the
CSV download has both ids. Real forwards on the tiny drafter and a verifier of another tokenizer family."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from conftest import saved_case  # noqa: E402
from test_ui import demo_args, parse  # noqa: E402
from test_ui_sampling import reference  # noqa: E402

from ui import app as ui_app  # noqa: E402
from ui.app import outputs_as_dict  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio


def test_the_inspector_shows_both_ids_of_each_token(two_vocab_pipe, tmp_path):
    pipe = two_vocab_pipe
    path, case = saved_case(tmp_path, 81, "two_vocab.png")
    app = ui_app.DemoApp(pipe, stream_interval=0.0)
    try:
        out = outputs_as_dict(list(app.run(*demo_args(path, case, max_new_tokens=24), False, "", "auto", 0, 1.0, None, session="s"))[-1])
        trace_csv = Path(out["trace_csv"]).read_text(encoding="utf-8")  # the app removes its trace files on close
    finally:
        app.close()
    want = reference(pipe, path, case, max_new_tokens=24)
    assert out["result_json"]["main"]["token_ids"] == want.token_ids
    tokens = [t for t in parse(out["answer_html"]).tokens if not t["end"]]
    events = [ev for ev in want.trace if ev.token_id not in set(pipe.tokenizer.all_special_ids)]
    assert len(tokens) == len(events) > 0
    alone = 0
    for tok, ev in zip(tokens, events):
        assert int(tok["attrs"]["data-drafter-token-id"]) == ev.drafter_token_id == pipe.vocab_map.to_drafter[ev.token_id]
        assert f"(verifier id {ev.token_id}, drafter id {ev.drafter_token_id})" in tok["tip"]
        said = "the verifier decided alone" in tok["tip"]
        assert said == ev.verifier_alone == (tok["attrs"].get("data-verifier-alone") == "1")
        alone += said
    assert alone > 0
    # Floor's panel: the verifier's own ids only
    floor = [t for t in parse(out["floor_html"]).tokens if not t["end"]]
    assert floor and all("data-drafter-token-id" not in t["attrs"] and "drafter id" not in t["tip"] for t in floor)
    rows = list(csv.DictReader(io.StringIO(trace_csv)))
    main = [r for r in rows if r["method"] == "asymspec"]
    assert [int(r["drafter_token_id"]) for r in main] == [ev.drafter_token_id for ev in want.trace]
    assert [r["verifier_alone"] == "True" for r in main] == [ev.verifier_alone for ev in want.trace]
