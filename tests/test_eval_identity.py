"""An eval run's identity (run.json): stored with the run, checked on --resume and by `eval merge`.

The CLI tests run the bundled tiny pair on MiniVista (4 problems, --limit 2, one method, 8 tokens) through
`asymspec-mm eval mathvista` in process; the refused runs must load no model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from test_eval_run import ScriptedPipe, make_problems

from asymspec_mm import __version__
from asymspec_mm.base.config import AsymSpecConfig
from asymspec_mm.eval import mathvista as mv
from asymspec_mm.eval import mathvista_cli as eval_cli  # the module that loads the pipeline
from asymspec_mm.eval.cli import main as cli_main
from asymspec_mm.eval.mathvista import identity as run_id
from asymspec_mm.frontend.identity import checkpoint_identity, content_hash, file_sha256, identity_diff, sampled_sha256, show_value
from asymspec_mm.pipeline.presets import TINY_DIR

BASE = ["eval", "mathvista", "--dataset", "minivista", "--minivista-n", "4", "--limit", "2", "--preset", "tiny"]
BASE += ["--max-new-tokens", "8", "--no-chart", "--no-progress"]


def eval_cli_run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main([*BASE, *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def seed0_run(tmp_path_factory) -> Path:
    """A finished seed-0 run of the Floor on 2 MiniVista problems (the folder is copied by each test)."""
    out = tmp_path_factory.mktemp("seed0") / "run"
    assert cli_main([*BASE, "--methods", "floor", "--seed", "0", "--out", str(out)]) == 0
    return out


@pytest.fixture
def run_copy(seed0_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(seed0_run, dst)
    return dst


@pytest.fixture
def no_model(monkeypatch):
    """A refused run must fail before any model loads."""
    monkeypatch.setattr(eval_cli, "pipeline_from_args", lambda *a, **k: pytest.fail("a refused run loaded a model"))


def stored(out: Path) -> dict:
    meta = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert meta["format"] == "asymspec-mm eval" and meta["format_version"] == 1
    return meta["identity"]


def test_the_run_stores_its_full_identity(seed0_run: Path) -> None:
    ident = stored(seed0_run)
    assert ident["protocol"] == "mathvista" and ident["version"] == __version__
    assert ident["dataset"]["name"] == "minivista" and ident["dataset"]["seed"] == 0 and ident["dataset"]["n"] == 4
    assert ident["dataset"]["problems_sha256"] == run_id.problems_sha256(mv.load_minivista_problems(4, 0))
    assert ident["selection"] == {"tasks": "all", "limit": 2, "shard": None, "require_caption": False}
    assert ident["compressed"] == "official" and ident["extract"] == "rules" and ident["max_new_tokens"] == 8
    # every variant's full effective config, defaults included
    assert ident["variants"] == {"floor": {"method": "floor", "config": {**AsymSpecConfig(max_new_tokens=8).as_dict(), "stop_strings": []}}}
    models = ident["models"]
    assert models["preset"] == "tiny" and models["dtype"] == "float32"
    for role in ("drafter", "verifier"):
        weights = TINY_DIR / role / "model.safetensors"
        assert models[role]["files"]["model.safetensors"] == "sha256:" + hashlib.sha256(weights.read_bytes()).hexdigest()
        assert (
            models[role]["files"]["config.json"] == "sha256:" + hashlib.sha256((TINY_DIR / role / "config.json").read_bytes()).hexdigest()
        )
    summary = json.loads((seed0_run / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"] == ident
    assert (seed0_run / "report.md").read_text(encoding="utf-8").startswith("# MiniVista results")


def test_resume_with_another_seed_is_refused_naming_the_keys(run_copy: Path, capsys, no_model) -> None:
    before = (run_copy / "records.jsonl").read_bytes()
    rc, out, err = eval_cli_run(capsys, "--methods", "floor", "--seed", "3", "--out", str(run_copy), "--resume")
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --resume: this run differs from the records in {run_copy}: ")
    assert "dataset.seed 0 -> 3" in err and "dataset.problems_sha256 sha256:" in err
    assert err.rstrip().endswith("; use a new --out or --overwrite")
    assert "resuming" not in out and "new records" not in out  # nothing of the seed-0 run is reported as this one
    assert (run_copy / "records.jsonl").read_bytes() == before


def test_resume_with_a_changed_variant_config_is_refused(run_copy: Path, capsys, no_model) -> None:
    rc, _, err = eval_cli_run(capsys, "--methods", "floor", "--max-new-tokens", "6", "--out", str(run_copy), "--resume")
    assert rc == 2 and err.count("\n") == 1, err
    assert ": max_new_tokens 8 -> 6, variants.floor.config.max_new_tokens 8 -> 6; use a new --out" in err
    rc, _, err = eval_cli_run(capsys, "--methods", "floor", "--compressed", "none", "--out", str(run_copy), "--resume")
    assert rc == 2 and ": compressed 'official' -> 'none'; " in err


def test_existing_records_without_resume_or_overwrite_are_refused_before_loading(run_copy: Path, capsys, no_model) -> None:
    rc, _, err = eval_cli_run(capsys, "--methods", "floor", "--out", str(run_copy))
    assert rc == 2 and err.count("\n") == 1 and "already holds results: pass --resume" in err and "--overwrite" in err


def test_resume_without_an_identity_is_refused(run_copy: Path, capsys, no_model) -> None:
    (run_copy / "run.json").unlink()
    rc, _, err = eval_cli_run(capsys, "--methods", "floor", "--out", str(run_copy), "--resume")
    assert rc == 2 and err.count("\n") == 1 and "has no run.json" in err and "--overwrite" in err


def test_resume_of_the_same_run_adds_variants_and_a_larger_selection(run_copy: Path, capsys) -> None:
    floor_before = [r for r in lines_of(run_copy / "records.jsonl")]
    rc, out, err = eval_cli_run(capsys, "--methods", "floor,drafter", "--limit", "3", "--out", str(run_copy), "--resume")
    assert rc == 0, err
    assert "resume: adding variant(s) drafter" in out and "resume: selection changed (limit 2 -> 3)" in out
    assert "resuming: 2/6 (variant, problem) pairs" in out and "4 new records, 2 already done" in out
    records = lines_of(run_copy / "records.jsonl")
    assert records[:2] == floor_before and sorted(mv.record_key(r) for r in records[2:]) == sorted(
        [("drafter", "1"), ("drafter", "2"), ("drafter", "3"), ("floor", "3")]
    )
    ident = stored(run_copy)
    assert list(ident["variants"]) == ["floor", "drafter"] and ident["selection"]["limit"] == 3
    # a variant left out keeps its records and its place in the identity
    rc, out, _ = eval_cli_run(capsys, "--methods", "drafter", "--limit", "3", "--out", str(run_copy), "--resume")
    assert rc == 0 and "0 new records, 3 already done" in out
    assert list(stored(run_copy)["variants"]) == ["floor", "drafter"]


def test_merge_refuses_records_of_different_runs(run_copy: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other"
    shutil.copytree(run_copy, other)
    meta = json.loads((other / "run.json").read_text(encoding="utf-8"))
    meta["identity"]["dataset"]["seed"] = 3
    (other / "run.json").write_text(json.dumps(meta), encoding="utf-8")
    rc = cli_main(["eval", "merge", str(run_copy), str(other), "--out", str(tmp_path / "merged"), "--no-chart"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "hold records of different runs (dataset.seed 0 -> 3); merge only the shards of one run" in err
    assert not (tmp_path / "merged" / "records.jsonl").exists()
    (other / "run.json").unlink()  # records without an identity cannot be checked against the others
    rc = cli_main(["eval", "merge", str(run_copy), str(other), "--out", str(tmp_path / "merged"), "--no-chart"])
    assert rc == 2 and "has no run.json" in capsys.readouterr().err


def test_shards_of_one_run_merge_and_keep_the_identity(tmp_path: Path) -> None:
    problems = make_problems(5)
    variants = mv.build_variants("asymspec,floor")
    args = argparse.Namespace(
        dataset="minivista",
        seed=0,
        minivista_n=5,
        compressed="none",
        extract="rules",
        max_new_tokens=512,
        limit=None,
        require_caption=False,
    )
    shard_dir = tmp_path / "shards"
    for i in range(2):
        ident = run_id.eval_identity(
            argparse.Namespace(**vars(args), shard=f"{i}/2"),
            problems=problems,
            variants=variants,
            text=None,
            tasks=None,
            models={"preset": "x"},
        )
        part = mv.select_problems(problems, shard=(i, 2))
        path = shard_dir / mv.records_filename((i, 2))
        mv.run_mathvista(
            ScriptedPipe(), part, variants, path, config_factory=dict, compressed="none", progress=False, log=lambda s: None, identity=ident
        )
        assert run_id.run_file(path).name == f"run-shard{i}of2.json" and run_id.stored_identity(path)["selection"]["shard"] == f"{i}/2"
    assert cli_main(["eval", "merge", str(shard_dir), "--out", str(tmp_path / "all"), "--no-chart"]) == 0
    merged = stored(tmp_path / "all")
    assert merged["selection"]["shard"] is None and merged["models"] == {"preset": "x"}
    assert json.loads((tmp_path / "all" / "summary.json").read_text(encoding="utf-8"))["run"] == merged
    assert (tmp_path / "all" / "report.md").read_text(encoding="utf-8").startswith("# MiniVista results")


def test_resume_conflicts_follow_the_rules() -> None:
    old = {
        "models": {"drafter": {"path": "/a/drafter", "revision": None, "files": {"w": "sha256:1"}}, "dtype": "float32"},
        "dataset": {"name": "minivista", "seed": 0},
        "variants": {"asymspec": {"method": "asymspec", "config": {"k": 4}}, "floor": {"method": "floor", "config": {"k": 4}}},
        "selection": {"limit": 2},
    }
    moved = json.loads(json.dumps(old))
    moved["models"]["drafter"]["path"] = "/b/drafter"  # the same files elsewhere: the same model
    moved["selection"]["limit"] = 5  # free to change
    moved["variants"] = {"asymspec": old["variants"]["asymspec"], "sd": {"method": "sd", "config": {"k": 2}}}  # added / left out
    assert run_id.resume_conflicts(old, moved) == []
    changed = json.loads(json.dumps(moved))
    changed["models"]["drafter"]["files"]["w"] = "sha256:2"
    changed["variants"]["asymspec"]["config"]["k"] = 2
    changed["dataset"]["seed"] = 3
    assert run_id.resume_conflicts(old, changed) == [
        "dataset.seed 0 -> 3",
        "models.drafter.files.w 'sha256:1' -> 'sha256:2'",
        "variants.asymspec.config.k 4 -> 2",
    ]
    assert run_id.resume_conflicts(old, {**old, "protocol": "paper"}) == ["protocol (absent) -> 'paper'"]
    assert run_id.resume_conflicts(old, {k: v for k, v in changed.items() if k != "models"}, ignore=("models",)) == [
        "dataset.seed 0 -> 3",
        "variants.asymspec.config.k 4 -> 2",
    ]
    assert run_id.run_file(Path("o/records.jsonl")) == Path("o/run.json")
    assert run_id.run_file(Path("o/records-shard1of3.jsonl")) == Path("o/run-shard1of3.json")


def test_checkpoint_hashes(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}', encoding="utf-8")
    big = folder / "model.safetensors"
    big.write_bytes(bytes(range(256)) * 20000)  # 5 MB
    ident = checkpoint_identity(str(folder))
    assert ident == {
        "path": str(folder.resolve()),
        "revision": None,
        "files": {"config.json": "sha256:" + hashlib.sha256(b'{"a": 1}').hexdigest(), "model.safetensors": file_sha256(big)},
    }
    os.utime(big, (1, 1))  # mtime is no part of it
    assert checkpoint_identity(str(folder)) == ident
    # large files: a sample of evenly spaced chunks, first and last included
    s = sampled_sha256(big, chunks=4, chunk_bytes=1000)
    assert s.startswith("sampled-sha256:") and sampled_sha256(big, chunks=4, chunk_bytes=1000) == s
    data = bytearray(big.read_bytes())
    data[-1] ^= 1
    big.write_bytes(bytes(data))
    assert sampled_sha256(big, chunks=4, chunk_bytes=1000) != s
    # a Hugging Face cache snapshot: the commit from its folder, the file hashes from the blob names (nothing read)
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / ("c" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / ("e" * 64)).write_bytes(b"weights")
    (snap / "model.safetensors").symlink_to(Path("../../blobs") / ("e" * 64))
    assert content_hash(snap / "model.safetensors") == "hf-blob:" + "e" * 64
    assert checkpoint_identity(str(snap))["revision"] == "c" * 40
    assert checkpoint_identity("no-such-org/no-such-model") == {"id": "no-such-org/no-such-model", "revision": None}
    assert identity_diff({"a": {"b": 1}}, {"a": {"b": 2}, "c": 3}) == [("a.b", 1, 2), ("c", "(absent)", 3)]
    assert show_value("sha256:" + "ab" * 32) == "sha256:abababababab..."


def test_mathvista_dataset_identity_hashes_the_problems_file_and_texts(tmp_path: Path) -> None:
    problems = make_problems(3)
    data = tmp_path / "testmini.json"
    data.write_text(json.dumps({p["pid"]: {k: v for k, v in p.items() if k != "decoded_image"} for p in problems}), encoding="utf-8")
    args = argparse.Namespace(dataset="mathvista", source="auto", split="testmini", data_dir=str(tmp_path), images_dir=None)
    text = mv.TextData(captions={"1": "A chart."})
    ident = run_id.dataset_identity(args, problems, text)
    assert ident["source"] == "local" and ident["split"] == "testmini"
    assert ident["data_file"] == {"path": str(data.resolve()), "sha256": "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()}
    other = run_id.dataset_identity(args, problems, mv.TextData(captions={"1": "A table."}))
    assert other["texts_sha256"] != ident["texts_sha256"] and other["problems_sha256"] == ident["problems_sha256"]
    changed = [dict(p) for p in problems]
    changed[0]["answer"] = "something else"
    assert run_id.dataset_identity(args, changed, text)["problems_sha256"] != ident["problems_sha256"]
