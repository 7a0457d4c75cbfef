"""What the demo shows for a run, checked on real runs of the tiny pair: the hover box's gate decision and what
fusion did, the token alignment of the three outputs, the trace downloads, the plain answer while streaming,
method=floor, the API's output names and errors, and the demo's check of its port."""

from __future__ import annotations

import csv
import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_case, sigint_as_a_terminal_gives_it

from ui.align import alignment_columns, render_alignment_html
from ui.outputs import RUN_OUTPUTS, outputs_as_dict
from ui.provenance import fusion_line, gate_line, num
from ui.render import _Decoder, _tooltip, plain_text, render_trace_html
from ui.trace_files import CSV_COLUMNS, trace_csv, trace_json

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio's queue


@pytest.fixture(scope="module")
def shipped_pipe():
    from asymspec_mm import AsymSpecPipeline
    from asymspec_mm.pipeline.presets import TINY_DIR

    if not (TINY_DIR / "drafter" / "config.json").is_file():
        pytest.skip("the shipped tiny pair is not in this checkout")
    return AsymSpecPipeline.from_preset("tiny", ocr="none")


@pytest.fixture(scope="module")
def example_runs(shipped_pipe):
    """The first bundled example (AsymSpec recovers it) decoded by the three methods, plus runs with a low gamma and
    with a fixed high one (also on the figure example, where fusion then changes the verifier's token), so that fused
    tokens both change and keep the verifier's token."""
    from ui.examples import load_examples

    ex, chart = load_examples()[0], next(e for e in load_examples() if e["family"] == "figure")
    args = (ex["image"], ex["question"])
    kw = dict(caption=ex["caption"], ocr=ex["ocr"], max_new_tokens=64)
    runs = {m: shipped_pipe.generate(*args, method=m, **kw) for m in ("asymspec", "floor", "drafter")}
    runs["low_gamma"] = shipped_pipe.generate(*args, gamma=0.05, **kw)
    runs["high_gamma"] = shipped_pipe.generate(*args, gamma=1.0, gate="fixed", **kw)
    chart_kw = dict(caption=chart["caption"], ocr=chart["ocr"], max_new_tokens=64)
    runs["high_gamma_chart"] = shipped_pipe.generate(chart["image"], chart["question"], gamma=1.0, gate="fixed", **chart_kw)
    return ex, runs


def test_tooltip_spells_out_the_gate_with_the_event_values(shipped_pipe, example_runs):
    _, runs = example_runs
    dec = _Decoder(shipped_pipe.tokenizer)
    events = [ev for r in runs.values() for ev in r.trace]
    accepted = [ev for ev in events if ev.source == "accepted"]
    fused = [ev for ev in events if ev.source == "fused"]
    assert accepted and fused
    for ev in accepted:
        bound = ev.gamma_eff * ev.p_base
        assert ev.p_verifier > bound  # the gate's rule (Eq. 4) held for every accepted draft
        line = f"gate: p_v = {num(ev.p_verifier)} > gamma_eff * p_base = {num(ev.gamma_eff)} * {num(ev.p_base)} = {num(bound)} -> accepted"
        assert gate_line(ev) == line and line in _tooltip(ev, dec)
        assert re.fullmatch(r"gate: p_v = \S+ > gamma_eff \* p_base = \S+ \* \S+ = \S+ -> accepted", line)
    for ev in fused:
        tip = _tooltip(ev, dec)
        bound = ev.gamma_eff * ev.draft_p_base
        assert ev.draft_p_verifier <= bound  # the rejected draft failed Eq. 4, with the numbers shown
        numbers = f" = {num(ev.draft_p_verifier)} <= gamma_eff * p_base = {num(ev.gamma_eff)} * {num(ev.draft_p_base)} = {num(bound)}"
        assert re.search(r"gate: p_v\(draft '[^']*'\)" + re.escape(numbers) + " -> draft rejected", tip), tip
    bonus = [ev for ev in events if ev.source == "bonus"]
    for ev in bonus:
        assert "no gate: the verifier's own token" in _tooltip(ev, dec)
    greedy = runs["floor"].trace[0]
    assert gate_line(greedy) is None and "gate:" not in _tooltip(greedy, dec)


def test_fused_tokens_say_whether_fusion_changed_the_verifiers_token(shipped_pipe, example_runs):
    _, runs = example_runs
    dec = _Decoder(shipped_pipe.tokenizer)
    fused = [ev for r in runs.values() for ev in r.trace if ev.source == "fused"]
    changed = [ev for ev in fused if ev.token_id != ev.verifier_argmax]
    same = [ev for ev in fused if ev.token_id == ev.verifier_argmax]
    assert changed and [ev for ev in same if ev.token_id not in shipped_pipe.eos_ids], "fused tokens of both kinds"
    for ev in changed:
        verifier = dec(ev.verifier_argmax)
        assert fusion_line(ev, verifier) == f"fused, changed the verifier's token (verifier alone: {verifier!r}): the image's steer"
        html_text = render_trace_html([ev], shipped_pipe.tokenizer)
        assert 'data-fusion="changed"' in html_text and "tok-steered" in html_text
    for ev in same:
        line = fusion_line(ev, dec(ev.verifier_argmax))
        assert line == "fused, same token as the verifier alone: fusion changed nothing here"
        assert "the image's steer" not in _tooltip(ev, dec)
        if ev.token_id in shipped_pipe.eos_ids:
            continue  # the end of the answer is drawn as an "end" mark, with no fusion attribute
        html_text = render_trace_html([ev], shipped_pipe.tokenizer)
        assert 'data-fusion="same"' in html_text and "tok-steered" not in html_text
    for ev in (e for r in runs.values() for e in r.trace if e.source != "fused"):
        assert fusion_line(ev) is None


def test_alignment_marks_the_positions_where_the_outputs_differ(example_runs):
    _, runs = example_runs
    traces = [runs[m].trace for m in ("asymspec", "floor", "drafter")]
    cols = alignment_columns(traces)
    width = max(len(t) for t in traces)
    assert len(cols) == width
    for i, (ids, differ) in enumerate(cols):
        expect = [t[i].token_id if i < len(t) else None for t in traces]
        assert ids == expect and differ == (len(set(expect)) > 1)
    assert any(d for _, d in cols) and not all(d for _, d in cols)  # they agree at first, then differ
    html_text = render_alignment_html([("AsymSpec", traces[0]), ("Floor", traces[1]), ("Drafter alone", traces[2])])
    heads = re.findall(r'<th class="[^"]*" data-differ="(\d)">(\d+)</th>', html_text)
    assert [(int(d), int(i)) for d, i in heads] == [(int(d), i) for i, (_, d) in enumerate(cols)]
    n_diff = sum(d for _, d in cols)
    first = next(i for i, (_, d) in enumerate(cols) if d)
    assert f'data-differing="{n_diff}"' in html_text and f"first difference at token #{first}" in html_text
    rows = re.findall(r'<tr data-output="([^"]+)">(.*?)</tr>', html_text)
    assert [r[0] for r in rows] == ["AsymSpec", "Floor", "Drafter alone"]
    for (_, cells), trace in zip(rows[1:], traces[1:]):  # a cell is marked where it differs from AsymSpec's token
        marked = ["al-diff" in c.split() for c in re.findall(r'<td class="([^"]*)"', cells)]
        assert marked == [i < len(trace) and (i >= len(traces[0]) or trace[i].token_id != traces[0][i].token_id) for i in range(width)]
    assert 'data-columns="0"' in render_alignment_html([("AsymSpec", traces[0])])


def test_trace_downloads_have_one_row_per_token(shipped_pipe, example_runs):
    ex, runs = example_runs
    results = {m: runs[m] for m in ("asymspec", "floor", "drafter")}
    rows = list(csv.DictReader(io.StringIO(trace_csv(results, shipped_pipe.tokenizer))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert len(rows) == sum(len(r.trace) for r in results.values())
    i = 0
    for method, res in results.items():
        for ev in res.trace:
            row = rows[i]
            i += 1
            assert (row["method"], int(row["index"]), int(row["token_id"]), row["text"], row["source"]) == (
                method,
                ev.index,
                ev.token_id,
                ev.text,
                ev.source,
            )
            for key in ("p_verifier", "p_base", "gamma_eff", "jsd"):
                value = getattr(ev, key)
                assert (row[key] == "") if value is None else float(row[key]) == value, key
            assert row["steered"] == str(ev.steered)
            if ev.verifier_argmax is not None:
                assert row["verifier_argmax_text"] == shipped_pipe.tokenizer.decode([ev.verifier_argmax])
    data = json.loads(trace_json(results, shipped_pipe.tokenizer, question=ex["question"], settings={"k": 4}))
    assert data["question"] == ex["question"] and data["settings"] == {"k": 4}
    for method, res in results.items():
        got = data["methods"][method]
        assert got["text"] == res.text and [e["token_id"] for e in got["trace"]] == res.token_ids
        assert [e["jsd"] for e in got["trace"]] == [ev.jsd for ev in res.trace]
        assert got["view"] == {"caption": ex["caption"], "ocr": ex["ocr"]}


def demo_args(ex, method="asymspec", compare=True, max_new_tokens=64):
    return (
        {"path": ex["image"]},
        ex["question"],
        ex["caption"],
        ex["ocr"],
        False,
        method,
        4,
        1.0,
        0.5,
        "cda",
        "contrast",
        "verifier",
        max_new_tokens,
        "image+text",
        compare,
    )


def test_streamed_plain_answer_never_shows_special_tokens(shipped_pipe, example_runs):
    from ui.jobs import DemoApp

    ex, runs = example_runs
    ref = runs["asymspec"]
    assert ref.trace[-1].text == "<|im_end|>"  # the answer ends with the special token, which the text drops
    state = DemoApp(shipped_pipe, stream_interval=0.0)
    try:
        outs = [outputs_as_dict(o) for o in state.run(*demo_args(ex), session="stream")]
    finally:
        state.close()
    texts = [o["answer_text"] for o in outs if isinstance(o["answer_text"], str)]
    assert len(texts) > 2 and texts[-1] == ref.text
    assert all("<|" not in t for t in texts) and all(ref.text.startswith(t) for t in texts)
    assert plain_text(ref.trace, shipped_pipe.tokenizer.all_special_ids) == ref.text


def test_the_trace_files_are_the_apps_and_go_when_it_closes(shipped_pipe, example_runs):
    """Each finished run's downloads are written into one ``asymspec_trace_*`` temporary folder of the app, which
    ``close()`` removes with every file in it (before, every run left a folder of its own in the temp directory)."""
    from ui.jobs import DemoApp

    ex, _ = example_runs
    state = DemoApp(shipped_pipe, stream_interval=0.0)
    try:
        outs = [outputs_as_dict(list(state.run(*demo_args(ex, "floor", False, 2), session=f"files-{i}"))[-1]) for i in range(2)]
        files = [Path(o[k]) for o in outs for k in ("trace_json", "trace_csv")]
        (root,) = {f.parents[1] for f in files}
        assert root.name.startswith("asymspec_trace_") and all(f.is_file() for f in files) and len(set(files)) == 4
        assert json.loads(files[2].read_text(encoding="utf-8"))["methods"]["floor"]["text"] == outs[1]["answer_text"]
    finally:
        state.close()
    assert not root.exists()


def test_trace_folders_keep_the_last_runs_and_remove_the_rest():
    """The last ``keep`` runs' folders stay (Gradio has copied older ones into its cache), ``close()`` removes them
    all, a later write starts a new folder, and a folder its owner never closed goes with the owner."""
    import gc

    from ui.trace_files import TraceFolders

    folders = TraceFolders(keep=2)
    written = [Path(folders.write({}, question=str(i))[0]) for i in range(3)]
    assert [p.is_file() for p in written] == [False, True, True] and json.loads(written[2].read_text(encoding="utf-8"))["question"] == "2"
    root = folders.root
    folders.close()
    assert not root.exists() and folders.root is None
    again = Path(folders.write({})[1])
    assert again.is_file() and again.parents[1] != root
    del folders
    gc.collect()
    assert not again.parents[1].exists()


def test_method_floor_shows_floor_once_and_no_empty_chart(shipped_pipe, example_runs):
    from ui.jobs import DemoApp

    ex, runs = example_runs
    state = DemoApp(shipped_pipe, stream_interval=0.0)
    try:
        out = outputs_as_dict(list(state.run(*demo_args(ex, method="floor"), session="floor"))[-1])
    finally:
        state.close()
    assert "Floor: verifier alone" in out["answer_html"] and 'data-state="done"' in out["answer_html"]
    assert 'data-state="off"' in out["floor_html"] and "shown in the panel above" in out["floor_html"]
    assert 'class="tok ' not in out["floor_html"]  # not the same tokens twice
    assert out["chart"] is None  # no JSD / gamma_eff: no chart (the page hides the empty one)
    assert 'data-output="Floor: verifier alone"' in out["alignment_html"] and 'data-output="Drafter alone"' in out["alignment_html"]
    assert out["answer_text"] == runs["floor"].text


@pytest.fixture(scope="module")
def served_client(served_demo):
    return served_demo[1]


def test_api_outputs_have_names(served_client):
    info = served_client.view_api(print_info=False, return_format="dict")
    returns = [r["label"] for r in info["named_endpoints"]["/run"]["returns"]]
    # the named components: the page's HTML parts by their names in RUN_OUTPUTS, the others under the labels the page
    # shows (no internal names on the page)
    shown = {
        "answer_text": "Answer (plain text)",
        "chart": "JSD and gamma_eff per token",
        "caption": "Caption",
        "ocr": "OCR text",
        "trace_json": "Trace (JSON)",
        "trace_csv": "Trace (CSV, one row per token)",
        "result_json": "Raw result",
    }
    assert returns == [shown.get(name, name) for name in RUN_OUTPUTS]
    assert not any(r.startswith("value_") for r in returns)


def test_api_errors_are_not_html_escaped(served_client, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    path = tmp_path / "x.png"
    make_case(1)["image"].save(path)
    args = [
        handle_file(str(path)),
        "What is shown?",
        "a chart",
        "",
        False,
        "asymspec",
        4,
        1.0,
        -1.0,
        "cda",
        "contrast",
        "verifier",
        8,
        "image+text",
        True,
    ]
    with pytest.raises(AppError) as err:
        served_client.predict(*args, api_name="/run")
    assert "gamma=-1.0 must be >= 0" in str(err.value) and "&gt;" not in str(err.value)


def test_demo_port_in_use_is_one_line_before_models_load(tmp_path):
    """The port is checked first: with checkpoints that do not exist, the only error is the port's (a load
    before the check would fail on the missing models instead)."""
    missing = str(tmp_path / "no-such-checkpoint")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "asymspec_mm.cli", "demo", "--drafter", missing, "--verifier", missing, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**__import__("os").environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
        )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"error: port {port} on 127.0.0.1 is already in use: stop the other server or pick another port with --port N"
    )
    assert "loaded" not in proc.stderr + proc.stdout and "Loading" not in proc.stderr + proc.stdout


def test_demo_start_up_names_its_url_and_the_share_flag(tmp_path, tiny_dirs):
    """`asymspec-mm demo` says where it serves and how to share it in its own words: the `--share` flag, not Gradio's
    "set `share=True` in `launch()`" (a keyword argument the command-line user has no way to set). Issue #41."""
    import os
    import threading

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    drafter, verifier = (str(d) for d in tiny_dirs)
    cmd = [sys.executable, "-m", "asymspec_mm.cli", "demo", "--drafter", drafter, "--verifier", verifier, "--ocr-engine", "none"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_a_terminal_gives_it,  # stopped with SIGINT below
    )
    url, up, said = f"http://127.0.0.1:{port}", False, []
    started = threading.Event()

    def read() -> None:  # every line it prints; its start-up line comes once it serves (after launch returns)
        for line in proc.stdout:
            said.append(line)
            if line.startswith("asymspec-mm demo: serving on"):
                started.set()
        started.set()  # it exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        started.wait(600)  # a bound on a hang: loading took 28 s here on a loaded machine
        up = proc.poll() is None and httpx.get(url, timeout=60).status_code == 200
    finally:
        proc.send_signal(2)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)
        reader.join(60)
    output = "".join(said)
    assert up, output
    assert "share=True" not in output and "launch()" not in output, output
    lines = [line for line in output.splitlines() if f"{url}/" in line or line.rstrip().endswith(url)]
    assert len(lines) == 1 and lines[0].startswith("asymspec-mm demo: "), output
    assert "--share" in lines[0] and "public link" in lines[0], lines[0]


def test_the_tiny_pair_warns_when_asked_outside_minivista(shipped_pipe, example_runs):
    """A plain question (not MiniVista's layout) is answered; from the run's first update on, a box of its own above
    the status says the answer means nothing, in the page's terms (no command-line flags); the green "Done" line
    holds only the outcome."""
    from ui.jobs import DemoApp

    ex, _ = example_runs
    state = DemoApp(shipped_pipe, stream_interval=0.0)
    try:
        plain = [outputs_as_dict(o) for o in state.run(*demo_args({**ex, "question": "Which bar is the tallest?"}), session="plain")]
        fine = outputs_as_dict(list(state.run(*demo_args(ex), session="fine"))[-1])
        early = state.enqueue("early", {"path": ex["image"]}, "Which bar is the tallest?")
    finally:
        state.close()
    box = re.compile(
        r'^<div class="asym-status asym-status-(\w+)"[^>]*>(.*?)</div><div class="asym-warning" data-warning="1" role="note">(.*)</div>$'
    )
    first, last = box.match(plain[0]["status"]), box.match(plain[-1]["status"])
    assert first and first.group(1) == "run" and 'data-tokens="0"' in plain[0]["answer_html"]  # before any token
    assert last and last.group(1) == "ok" and last.group(2).startswith("Done in")
    warning = last.group(3)
    assert "Outside what these models learned" in warning and "MiniVista" in warning
    assert "not in MathVista&#x27;s layout" in warning and "bundled examples on this page" in warning
    assert "--" not in warning and "asymspec-mm" not in warning  # no command line on a web page
    assert "MiniVista" not in last.group(2) and "Warning" not in last.group(2)
    assert "Done in" in fine["status"] and "asym-warning" not in fine["status"]
    assert box.match(early) and "Starting the run" in early  # as the page hands the run over: before the run


def test_special_tokens_are_not_drawn_as_answer_tokens(shipped_pipe, example_runs):
    """The answer ends with <|im_end|>: the panels draw it as a neutral end mark and the alignment says "end"."""
    from ui.jobs import DemoApp

    ex, runs = example_runs
    ref = runs["asymspec"]
    assert ref.trace[-1].text == "<|im_end|>"
    html_text = render_trace_html(ref.trace, shipped_pipe.tokenizer)
    assert html_text.count('class="tok-end"') == 1 and f'data-tokens="{len(ref.trace) - 1}"' in html_text
    assert re.search(
        r'<span class="tok-end" data-token-id="2" data-source="\w+" title="end of the answer: [^"]*">end</span></div>$', html_text
    )
    assert len(re.findall(r'<span class="tok tok-', html_text)) == len(ref.trace) - 1
    state = DemoApp(shipped_pipe, stream_interval=0.0)
    try:
        out = outputs_as_dict(list(state.run(*demo_args(ex), session="eos"))[-1])
    finally:
        state.close()
    for key in ("answer_html", "floor_html", "drafter_html"):  # the drawn texts (a hover box may name it as an alternative)
        drawn = re.findall(r'<span class="tok-text">([^<]*)</span>', out[key])
        assert drawn and not any("im_end" in t for t in drawn), key
        assert out[key].count('class="tok-end"') == 1, key  # each of the three answers ended with it
    cells = re.findall(r"<td [^>]*>([^<]*)</td>", out["alignment_html"])
    assert not any("im_end" in c for c in cells) and "end" in cells
    assert 'class="al-tok al-eos' in out["alignment_html"]
