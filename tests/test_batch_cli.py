"""``asymspec-mm batch``: real forwards on the bundled tiny pair over MiniVista problems saved as PNG files.

Each answer equals ``pipe.generate`` of that request alone; a run killed mid-way and resumed ends with every
id once and the same answers as an uninterrupted run, and Ctrl-C says how to resume; a changed configuration and an
existing output are refused; bad lines (a repeated id, a line that is not UTF-8, text that is not valid Unicode among
them) are reported with their line numbers while good ones are answered.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sigint_as_a_terminal_gives_it

from asymspec_mm.cli import batch as batch_cli
from asymspec_mm.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
N = 10
MAX_NEW = 32


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``asymspec-mm`` in process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def batch_args(inp: Path, out: Path, *extra) -> list:
    return ["batch", "--input", inp, "--output", out, "--preset", "tiny", "--ocr-engine", "none", "--max-new-tokens", MAX_NEW, *extra]


@pytest.fixture(scope="module")
def vista(tmp_path_factory):
    """A folder with images/<pid>.png and questions.jsonl (relative image paths) for N MiniVista problems."""
    from asymspec_mm.eval.mathvista import load_minivista_problems

    root = tmp_path_factory.mktemp("vista")
    (root / "images").mkdir()
    lines = []
    for p in load_minivista_problems(N, 0):
        p["decoded_image"].save(root / p["image"])
        lines.append({"id": p["pid"], "image": p["image"], "question": p["query"], "caption": p["caption"], "ocr": p["ocr"] or False})
    (root / "questions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return root, lines


@pytest.fixture(scope="module")
def pipe():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", ocr="none")


@pytest.fixture(scope="module")
def refs(vista, pipe):
    """Each problem answered alone by ``pipe.generate``."""
    root, lines = vista
    return {
        x["id"]: pipe.generate(str(root / x["image"]), x["question"], caption=x["caption"], ocr=x["ocr"], max_new_tokens=MAX_NEW)
        for x in lines
    }


@pytest.fixture
def shared_pipe(monkeypatch, pipe):
    """In-process runs reuse the module's pipeline (the subprocess test loads the preset for real)."""
    calls = []

    def load(args, preset_name):
        calls.append(preset_name)
        return pipe

    monkeypatch.setattr(batch_cli, "load_batch_pipeline", load)
    return calls


@pytest.fixture(scope="module")
def full_run(vista, pipe, tmp_path_factory):
    """One uninterrupted run over the N problems (with traces): (output path, records, stderr), and the names of the
    threads that ran the models' forwards (read with forward hooks)."""
    from test_loop_setup import _threads_running

    root, _ = vista
    out = tmp_path_factory.mktemp("full") / "answers.jsonl"
    mp = pytest.MonkeyPatch()
    mp.setattr(batch_cli, "load_batch_pipeline", lambda args, preset_name: pipe)
    seen, hooks = _threads_running([pipe.drafter, pipe.verifier])
    try:
        rc, err = run_cli(batch_args(root / "questions.jsonl", out, "--batch-size", 4, "--trace"))
    finally:
        mp.undo()
        for h in hooks:
            h.remove()
    assert rc == 0, err
    return out, read_jsonl(out), err, seen


def test_end_to_end_each_answer_equals_generate_alone(full_run, refs):
    """Every answer equals ``pipe.generate`` alone, decoded by an engine loop (every forward on its decode thread:
    the requests' set-up on its set-up threads, captions as its rows)."""
    out, records, err, seen = full_run
    assert seen == {"asymspec-scheduler"}, seen
    assert sorted(r["id"] for r in records) == sorted(refs)
    for rec in records:
        ref = refs[rec["id"]]
        assert rec["answer"] == ref.text
        assert [ev["token_id"] for ev in rec["trace"]] == ref.token_ids
        assert [ev["text"] for ev in rec["trace"]] == [ev.text for ev in ref.trace]
        assert [ev["source"] for ev in rec["trace"]] == [ev.source for ev in ref.trace]
        assert rec["method"] == "asymspec" and rec["config"]["k"] == 4 and rec["config"]["max_new_tokens"] == MAX_NEW
        assert rec["view"] == {"caption": ref.view.caption, "ocr_text": ref.view.ocr_text}
        assert rec["stats"]["new_tokens"] == len(ref.token_ids) and 1 <= rec["stats"]["batch_size"] <= 4
        for ev in rec["trace"]:  # token texts of the verifier's own choice and of the top alternatives
            assert ev["verifier_text"] is None or isinstance(ev["verifier_text"], str)
            assert all(isinstance(t[1], str) for t in ev["top_verifier"])
    assert max(r["stats"]["batch_size"] for r in records) > 1  # rows really shared steps
    meta = json.loads((out.parent / "answers.jsonl.meta.json").read_text())
    ident = meta["identity"]
    assert ident["models"]["preset"] == "tiny" and ident["method"] == "asymspec" and ident["trace"] is True
    assert ident["models"]["drafter"]["files"]["model.safetensors"].startswith("sha256:")
    assert ident["config"]["k"] == 4 and ident["dtype"] == "float32" and ident["version"]
    assert ident["ocr_engine"] == "none" and ident["ocr_layout"] == "inline"  # the tiny preset's OCR text layout
    assert not (out.parent / "answers.jsonl.errors.jsonl").exists()
    assert f"{N}/{N}" in err  # the progress bar, on stderr
    assert f"{N} answered" in err


def test_the_progress_bar_shows_pooled_acceptance(full_run):
    """The bar's acceptance is accepted over drafted tokens summed over the answers (eval's measure), not the mean of
    the per-answer rates, which would give a short answer's few drafts the weight of a long one's many."""
    _, records, err, _ = full_run
    drafted = sum(r["stats"]["drafted"] for r in records)
    accepted = sum(r["stats"]["accepted"] for r in records)
    rates = [r["stats"]["accepted"] / r["stats"]["drafted"] for r in records if r["stats"]["drafted"]]
    pooled, mean = accepted / drafted, sum(rates) / len(rates)
    assert f"{pooled:.2f}" != f"{mean:.2f}", "these answers cannot tell the two measures apart"
    assert f"accept (pooled)={pooled:.2f}" in err.rsplit(f"{N}/{N}", 1)[-1]  # the bar's last refresh, on stderr


def test_an_out_of_domain_line_is_warned_in_the_batch_file_s_terms(vista, tmp_path, shared_pipe):
    """The tiny pair's warning on a line it cannot answer advises what a batch file's author can change (the line's
    question, --preset), not the Python API's calls nor generate's --choices (issue #49)."""
    root, lines = vista
    inp = tmp_path / "q.jsonl"
    inp.write_text(
        json.dumps({**lines[0], "image": str(root / lines[0]["image"]), "question": "Tell me a story."}) + "\n", encoding="utf-8"
    )
    out = tmp_path / "a.jsonl"
    rc, err = run_cli(batch_args(inp, out, "--no-progress", "--max-new-tokens", 2))
    assert rc == 0, err
    (warning,) = read_jsonl(out)[0]["warnings"]
    assert warning.endswith(batch_cli.DOMAIN_ADVICE) and "not in MathVista's layout" in warning
    assert "from_preset" not in warning and "--choices" not in warning


def test_floor_method_and_images_dir(vista, pipe, tmp_path, shared_pipe):
    root, lines = vista
    inp = tmp_path / "q.jsonl"  # bare file names, resolved against --images-dir
    inp.write_text("".join(json.dumps({**x, "image": Path(x["image"]).name}) + "\n" for x in lines[:3]), encoding="utf-8")
    out = tmp_path / "a.jsonl"
    rc, err = run_cli(batch_args(inp, out, "--images-dir", root / "images", "--method", "floor", "--no-progress"))
    assert rc == 0, err
    assert "%|" not in err  # no progress bar
    for rec in read_jsonl(out):
        x = next(x for x in lines if x["id"] == rec["id"])
        ref = pipe.generate(
            str(root / x["image"]), x["question"], caption=x["caption"], ocr=x["ocr"], method="floor", max_new_tokens=MAX_NEW
        )
        assert rec["answer"] == ref.text and rec["method"] == "floor" and "trace" not in rec


def test_killed_mid_run_then_resumed_without_duplicates(vista, full_run, tmp_path, shared_pipe):
    root, _ = vista
    out = tmp_path / "answers.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "asymspec_mm.cli"] + [str(a) for a in batch_args(root / "questions.jsonl", out, "--batch-size", 2)]
    cmd += ["--trace", "--no-progress"]
    log = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"the run ended before it could be killed: {(tmp_path / 'stderr.txt').read_text()[-2000:]}"
        assert out.exists() and out.read_bytes().count(b"\n") >= 2, "no rows within the time limit"
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        log.close()
    raw = out.read_bytes()
    before = [json.loads(line) for line in raw[: raw.rfind(b"\n") + 1].splitlines()]  # whole lines (a cut one is repaired)
    assert 2 <= len(before) < N and len({r["id"] for r in before}) == len(before)

    rc, err = run_cli(batch_args(root / "questions.jsonl", out, "--batch-size", 3, "--trace", "--resume"))  # another batch size is fine
    assert rc == 0, err
    assert f"{len(before)} already answered" in err
    after = read_jsonl(out)
    assert after[: len(before)] == before  # the killed run's lines are kept as they were
    ids = [r["id"] for r in after]
    assert len(ids) == len(set(ids)) == N
    _, uninterrupted, _, _ = full_run
    expect = {r["id"]: (r["answer"], [ev["token_id"] for ev in r["trace"]]) for r in uninterrupted}
    assert {r["id"]: (r["answer"], [ev["token_id"] for ev in r["trace"]]) for r in after} == expect

    rc, err = run_cli(batch_args(root / "questions.jsonl", out, "--trace", "--resume"))  # nothing left: no model load
    assert rc == 0 and f"0 answered, {N} already answered" in err
    assert read_jsonl(out) == after


def test_resume_repairs_a_partial_last_line(vista, full_run, tmp_path, shared_pipe):
    root, _ = vista
    src, records, _, _ = full_run
    out = tmp_path / "answers.jsonl"
    lines = src.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # a write cut short
    shutil.copy(src.parent / "answers.jsonl.meta.json", tmp_path / "answers.jsonl.meta.json")
    rc, err = run_cli(batch_args(root / "questions.jsonl", out, "--trace", "--resume", "--no-progress"))
    assert rc == 0, err
    assert "partial last line" in err
    after = read_jsonl(out)
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in records)
    assert {r["id"]: r["answer"] for r in after} == {r["id"]: r["answer"] for r in records}


def test_resume_with_changed_config_is_refused_naming_the_key(vista, full_run, tmp_path, monkeypatch):
    root, _ = vista
    src, _, _, _ = full_run
    out = tmp_path / "answers.jsonl"
    shutil.copy(src, out)
    shutil.copy(src.parent / "answers.jsonl.meta.json", tmp_path / "answers.jsonl.meta.json")
    monkeypatch.setattr(batch_cli, "load_batch_pipeline", lambda *a: pytest.fail("refused runs load no model"))
    before = out.read_bytes()
    rc, err = run_cli(batch_args(root / "questions.jsonl", out, "--trace", "--resume", "--k", 2))
    assert rc == 2
    assert err.count("\n") == 1 and "differing: k (4 -> 2)" in err, err
    rc, err = run_cli(batch_args(root / "questions.jsonl", out, "--resume", "--method", "floor"))  # and no --trace
    assert rc == 2 and "method ('asymspec' -> 'floor')" in err and "trace (True -> False)" in err
    assert out.read_bytes() == before


def test_existing_output_refused_without_resume_or_overwrite(vista, refs, tmp_path, shared_pipe):
    root, lines = vista
    inp = tmp_path / "q.jsonl"
    inp.write_text("".join(json.dumps({**x, "image": str(root / x["image"])}) + "\n" for x in lines[:2]), encoding="utf-8")
    out = tmp_path / "a.jsonl"
    out.write_text('{"id": "old"}\n', encoding="utf-8")
    rc, err = run_cli(batch_args(inp, out, "--no-progress"))
    assert rc == 2 and "already holds answers" in err and "--resume" in err and "--overwrite" in err
    assert out.read_text() == '{"id": "old"}\n' and not shared_pipe
    rc, err = run_cli(batch_args(inp, out, "--resume", "--no-progress"))  # no identity file to check against
    assert rc == 2 and "meta.json" in err
    rc, err = run_cli(batch_args(inp, out, "--overwrite", "--no-progress"))
    assert rc == 0, err
    assert {r["id"]: r["answer"] for r in read_jsonl(out)} == {x["id"]: refs[x["id"]].text for x in lines[:2]}
    with pytest.raises(SystemExit) as exc:  # argparse: not both
        run_cli(batch_args(inp, out, "--resume", "--overwrite"))
    assert exc.value.code == 2


def test_bad_lines_reported_with_line_numbers_good_ones_answered(vista, refs, tmp_path, shared_pipe):
    root, lines = vista
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    good = [json.dumps({**x, "image": str(root / x["image"])}) for x in lines[:2]]
    rows = [
        good[0],  # 1
        "{not json",  # 2
        json.dumps({"id": "noq", "image": str(root / lines[0]["image"])}),  # 3: missing question
        json.dumps({"id": "url", "image": "https://example.com/a.png", "question": "What?"}),  # 4: a URL
        "",  # 5: blank lines are skipped
        json.dumps({"id": "gone", "image": "missing.png", "question": "What?"}),  # 6: no such file
        json.dumps({"id": "broken", "image": "broken.png", "question": "What?", "ocr": False}),  # 7: unreadable
        json.dumps({"id": "extra", "image": str(root / lines[0]["image"]), "question": "What?", "answer": "x"}),  # 8
        good[1],  # 9
    ]
    inp = tmp_path / "bad.jsonl"
    inp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "a.jsonl"
    rc, err = run_cli(batch_args(inp, out, "--no-progress"))
    assert rc == 1
    errors = read_jsonl(tmp_path / "a.jsonl.errors.jsonl")
    assert [e["line"] for e in errors] == [2, 3, 4, 6, 8, 7]  # input checks first, the unreadable image when prepared
    by_line = {e["line"]: e for e in errors}
    assert "invalid JSON" in by_line[2]["error"] and by_line[2]["input"] == "{not json"
    assert "'question'" in by_line[3]["error"] and by_line[3]["id"] == "noq"
    assert "never fetched" in by_line[4]["error"]
    assert "not found" in by_line[6]["error"]
    assert by_line[7]["stage"] == "prepare" and by_line[7]["id"] == "broken"
    assert "'answer'" in by_line[8]["error"]
    for n in (2, 3, 4, 6, 7, 8):
        assert f"bad.jsonl:{n}: " in err
    assert {r["id"]: r["answer"] for r in read_jsonl(out)} == {x["id"]: refs[x["id"]].text for x in lines[:2]}
    assert "2 answered" in err and "6 failed" in err

    rc, err = run_cli(batch_args(inp, tmp_path / "b.jsonl", "--no-progress", "--on-error", "raise"))
    assert rc == 2 and err.strip().splitlines() == [
        f"error: {inp}:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"
    ]


def test_a_duplicate_id_is_a_bad_line_and_the_run_goes_on(vista, refs, tmp_path, shared_pipe):
    root, lines = vista
    good = [json.dumps({**x, "image": str(root / x["image"])}) for x in lines[:2]]
    inp = tmp_path / "dup.jsonl"
    inp.write_text("\n".join([good[0], good[1], good[0]]) + "\n", encoding="utf-8")
    out = tmp_path / "a.jsonl"
    rc, err = run_cli(batch_args(inp, out, "--no-progress"))
    assert rc == 1, err
    message = f"duplicate id '{lines[0]['id']}' (first on line 1); ids must be unique, this line is skipped"
    assert f"dup.jsonl:3: {message}\n" in err
    assert read_jsonl(tmp_path / "a.jsonl.errors.jsonl") == [
        {"line": 3, "id": lines[0]["id"], "error": message, "stage": "input", "input": good[0]}
    ]
    assert {r["id"]: r["answer"] for r in read_jsonl(out)} == {x["id"]: refs[x["id"]].text for x in lines[:2]}
    assert "2 answered, 1 failed" in err


def test_a_non_utf8_line_is_a_bad_line_and_resume_treats_it_as_one(vista, refs, tmp_path, shared_pipe):
    """One line in Latin-1 (issue #41): it goes to the errors file with its line number and reason, the rest runs;
    ``--resume`` reports it again as it does any bad line, and answers it once it is saved as UTF-8."""
    root, lines = vista
    good = [json.dumps({**x, "image": str(root / x["image"])}, ensure_ascii=False) for x in lines[:3]]
    latin = json.dumps({**lines[1], "image": str(root / lines[1]["image"]), "question": "caf\u00e9?"}, ensure_ascii=False)
    column = latin.encode("latin-1").index(b"\xe9") + 1
    inp = tmp_path / "latin1.jsonl"
    inp.write_bytes(b"\n".join([good[0].encode(), latin.encode("latin-1"), good[2].encode()]) + b"\n")
    out, err_file = tmp_path / "a.jsonl", tmp_path / "a.jsonl.errors.jsonl"
    message = f"not UTF-8 text (byte 0xe9 at column {column}); save the input as UTF-8"
    record = {"line": 2, "id": lines[1]["id"], "error": message, "stage": "input", "input": latin.replace("\u00e9", "\\xe9")}

    rc, err = run_cli(batch_args(inp, out, "--no-progress"))
    assert rc == 1, err
    assert f"latin1.jsonl:2: {message}\n" in err and "2 answered, 1 failed" in err
    assert read_jsonl(err_file) == [record]
    assert {r["id"]: r["answer"] for r in read_jsonl(out)} == {x["id"]: refs[x["id"]].text for x in (lines[0], lines[2])}

    rc, err = run_cli(batch_args(inp, out, "--no-progress", "--resume"))  # as any bad line: reported again
    assert rc == 1 and "0 answered, 2 already answered, 1 failed" in err, err
    assert read_jsonl(err_file) == [record]

    inp.write_bytes("\n".join(good).encode() + b"\n")  # saved as UTF-8 (and its question fixed)
    rc, err = run_cli(batch_args(inp, out, "--no-progress", "--resume"))
    assert rc == 0 and "1 answered, 2 already answered" in err, err
    assert not err_file.exists()
    assert sorted(r["id"] for r in read_jsonl(out)) == sorted(x["id"] for x in lines[:3])
    assert {r["id"]: r["answer"] for r in read_jsonl(out)}[lines[1]["id"]] == refs[lines[1]["id"]].text

    inp.write_bytes(latin.encode("latin-1") + b"\n")
    rc, err = run_cli(batch_args(inp, tmp_path / "b.jsonl", "--on-error", "raise"))
    assert rc == 2 and err.strip().splitlines() == [f"error: {inp}:1: {message}"]


def test_text_that_is_not_valid_unicode_is_a_bad_line(vista, refs, tmp_path, shared_pipe):
    """A lone surrogate (JSON's \\ud800 escape) in a line's question, caption, OCR text or id: that line goes to the
    errors file naming the field, before any model runs; the rest runs."""
    root, lines = vista
    base = {**lines[0], "image": str(root / lines[0]["image"])}
    rows = [
        json.dumps({**base, "id": "q", "question": "\ud800 What?"}),
        json.dumps({**base, "id": "c", "caption": "a \ud800 chart"}),
        json.dumps({**base, "id": "o", "ocr": "12 \ud800"}),
        json.dumps({**base, "id": "bad \ud800 id"}),
        json.dumps(base),
    ]
    assert "\\ud800" in rows[0]  # the escape, as a client's JSON writer sends it
    inp = tmp_path / "surrogates.jsonl"
    inp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "a.jsonl"
    rc, err = run_cli(batch_args(inp, out, "--no-progress"))
    assert rc == 1, err
    errors = read_jsonl(tmp_path / "a.jsonl.errors.jsonl")
    assert [(e["line"], e["id"], e["stage"]) for e in errors] == [
        (1, "q", "input"),
        (2, "c", "input"),
        (3, "o", "input"),
        (4, None, "input"),
    ]
    assert [e["error"] for e in errors] == [
        "question: not valid Unicode text (lone surrogate U+D800 at character 0); send UTF-8 text",
        "caption: not valid Unicode text (lone surrogate U+D800 at character 2); send UTF-8 text",
        "ocr: not valid Unicode text (lone surrogate U+D800 at character 3); send UTF-8 text",
        "id: not valid Unicode text (lone surrogate U+D800 at character 4); send UTF-8 text",
    ]
    assert {r["id"]: r["answer"] for r in read_jsonl(out)} == {lines[0]["id"]: refs[lines[0]["id"]].text}


def test_ctrl_c_says_what_was_kept_and_how_to_resume(vista, full_run, tmp_path, shared_pipe):
    root, _ = vista
    out = tmp_path / "answers.jsonl"
    out.write_text('{"id": "stale"}\n', encoding="utf-8")  # started over with --overwrite
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = batch_args(root / "questions.jsonl", out, "--batch-size", 2, "--no-progress")
    # The CLI starts with SIGINT at its default and unblocked, as a terminal starts it: an ignored or blocked SIGINT
    # is inherited through exec, and then Python raises no KeyboardInterrupt (seen in full parallel runs, where the
    # run went on to the end).
    parent_sigint = (signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    proc = subprocess.Popen(
        [sys.executable, "-m", "asymspec_mm.cli", *map(str, argv), "--overwrite"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_a_terminal_gives_it,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and out.read_bytes().count(b"\n") < 2:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    kept = read_jsonl(out)
    assert proc.returncode == 130 and 2 <= len(kept) < N, (
        proc.returncode,
        len(kept),
        parent_sigint,
        stderr.decode(errors="replace")[-2000:],
    )
    assert stderr.decode().splitlines()[-1] == (
        f"asymspec-mm batch: interrupted; {len(kept)} answers kept in {out}, {N - len(kept)} not answered; "
        "to continue, run the same command with --resume in place of --overwrite"
    )
    rc, err = run_cli([*argv, "--resume"])  # what the line says
    assert rc == 0 and f"{N - len(kept)} answered, {len(kept)} already answered" in err, err
    _, uninterrupted, _, _ = full_run
    assert {r["id"]: r["answer"] for r in read_jsonl(out)} == {r["id"]: r["answer"] for r in uninterrupted}


def test_any_pair_through_drafter_and_verifier(tiny_dirs, tiny_pipe, tmp_path):
    """The same command on a pair from_pretrained loads (the random tiny pair of conftest), really loaded."""
    from conftest import make_case

    cases = [make_case(i) for i in range(3)]
    for i, c in enumerate(cases):
        c["image"].save(tmp_path / f"{i}.png")
    inp = tmp_path / "q.jsonl"
    inp.write_text(
        "".join(
            json.dumps({"id": i, "image": f"{i}.png", "question": c["question"], "caption": c["caption"], "ocr": c["ocr"]}) + "\n"
            for i, c in enumerate(cases)
        ),
        encoding="utf-8",
    )
    out = tmp_path / "a.jsonl"
    argv = ["batch", "--input", inp, "--output", out, "--drafter", tiny_dirs[0], "--verifier", tiny_dirs[1], "--ocr-engine", "none"]
    rc, err = run_cli(argv + ["--max-new-tokens", 12, "--batch-size", 2, "--no-progress"])
    assert rc == 0, err
    got = {r["id"]: r["answer"] for r in read_jsonl(out)}
    assert got == {
        i: tiny_pipe.generate(tmp_path / f"{i}.png", c["question"], caption=c["caption"], ocr=c["ocr"], max_new_tokens=12).text
        for i, c in enumerate(cases)
    }
    meta = json.loads((tmp_path / "a.jsonl.meta.json").read_text())
    models = meta["identity"]["models"]
    assert [models[k]["path"] for k in ("drafter", "verifier")] == [str(Path(d).resolve()) for d in tiny_dirs]
    assert set(models["verifier"]["files"]) >= {"config.json", "model.safetensors"}
    assert meta["identity"]["ocr_layout"] == "plain"  # any other pair: one text line per line
    rc, err = run_cli(argv + ["--max-new-tokens", 16, "--resume"])
    assert rc == 2 and "max_new_tokens (12 -> 16)" in err
    # models are named by their files: the same checkpoint in another folder resumes, an edited one does not
    import shutil

    moved, edited = tmp_path / "moved_verifier", tmp_path / "edited_verifier"
    shutil.copytree(tiny_dirs[1], moved)
    shutil.copytree(tiny_dirs[1], edited)
    cfg_file = edited / "config.json"
    cfg_file.write_text(cfg_file.read_text(encoding="utf-8").replace("{", '{"_edited": true, ', 1), encoding="utf-8")
    with_verifier = lambda d: [d if a == tiny_dirs[1] else a for a in argv] + ["--max-new-tokens", 12, "--resume", "--no-progress"]  # noqa: E731
    rc, err = run_cli(with_verifier(moved))
    assert rc == 0, err
    rc, err = run_cli(with_verifier(edited))
    assert rc == 2 and "models.verifier.files.config.json (sha256:" in err, err
