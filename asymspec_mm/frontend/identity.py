"""A run's identity: what must not change between a run and its ``--resume`` (shared by ``batch`` and ``eval``).

An identity is a nested JSON dict (models, data, effective configs, package version, ...). It is stored next to
the run's results (:func:`write_identity_file`) and compared key by key on resume (:func:`identity_diff`), so a
refusal can name every differing key (``dataset.seed 0 -> 3``).

Models are named by what is on disk (:func:`checkpoint_identity`): a local checkpoint folder by a content hash
of each of its files (every byte of files up to :data:`FULL_HASH_LIMIT`, a fixed sample of larger ones; neither
size nor mtime enters, so a copied checkpoint keeps its identity), a Hugging Face cache snapshot by its commit
and the blob names the cache already keys its files by (free: nothing is read).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError

#: Files up to this size are hashed whole; larger ones (multi-GB weights) by :func:`sampled_sha256`.
FULL_HASH_LIMIT = 256 << 20
#: Chunks (and their size) a large file's sampled hash reads, spread evenly over the file.
SAMPLE_CHUNKS, SAMPLE_BYTES = 16, 1 << 18
_HEX = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")

MISSING = "(absent)"


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """``sha256:<hex>`` of every byte of ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def sampled_sha256(path: str | Path, chunks: int = SAMPLE_CHUNKS, chunk_bytes: int = SAMPLE_BYTES) -> str:
    """``sampled-sha256:<hex>`` over the file's length and ``chunks`` evenly spaced blocks (first and last
    included; a safetensors header, which names every tensor's dtype, shape and offset, is in the first)."""
    size = os.path.getsize(path)
    h = hashlib.sha256(f"{size}|{chunks}|{chunk_bytes}|".encode())
    last = max(0, size - chunk_bytes)
    with open(path, "rb") as f:
        for i in range(chunks):
            f.seek(last * i // max(1, chunks - 1))
            h.update(f.read(chunk_bytes))
    return "sampled-sha256:" + h.hexdigest()


def content_hash(path: str | Path) -> str:
    """A content hash of one checkpoint file: the Hugging Face cache's blob name when it is a link into a
    cache's ``blobs/`` (sha256 of LFS files, git sha1 of small ones), else :func:`file_sha256` /
    :func:`sampled_sha256` by size."""
    p = Path(path)
    if p.is_symlink():
        target = Path(os.readlink(p))
        if target.parent.name == "blobs" and _HEX.match(target.name):
            return "hf-blob:" + target.name
    return file_sha256(p) if p.stat().st_size <= FULL_HASH_LIMIT else sampled_sha256(p)


def _snapshot_revision(folder: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot folder (``.../snapshots/<commit>``), else None."""
    return folder.name if folder.parent.name == "snapshots" and _HEX.match(folder.name) else None


def checkpoint_identity(ref: str) -> dict[str, Any]:
    """A model as the identity names it: ``{"path", "revision", "files": {name: hash}}`` for a local folder,
    ``{"id", "revision", "files"}`` for a hub id already in the local cache (no network), ``{"id",
    "revision": None}`` for one that is not (it is then named by id alone)."""
    p = Path(ref).expanduser()
    out: dict[str, Any]
    if p.exists():
        folder = p.resolve() if not p.is_dir() else p.absolute()
        out = {"path": str(p.resolve())}
    else:
        out = {"id": ref}
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(ref, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached (or no hub library): named by id alone
            return {**out, "revision": None}
    out["revision"] = _snapshot_revision(folder)
    if folder.is_dir():
        names = sorted(q.name for q in folder.iterdir() if not q.name.startswith(".") and q.is_file())
        out["files"] = {name: content_hash(folder / name) for name in names}
    else:
        out["files"] = {folder.name: content_hash(folder)}
    return out


def model_ref(name: str) -> str:
    """A model argument as a stable text: a local path made absolute, a hub id as given."""
    p = Path(name).expanduser()
    return str(p.resolve()) if p.exists() else name


def models_identity(
    preset: str | None, drafter: str | None, verifier: str | None, device: str | None, dtype: str | None, *, hashes: bool = True
) -> tuple[dict[str, Any], str | None]:
    """The pair a run loads, without loading it, and the preset name to load (None: an explicit pair).

    ``{"preset"?, "drafter", "verifier", "dtype"}``: the drafter and verifier by :func:`checkpoint_identity`
    (``hashes=False``: by :func:`model_ref` alone). ``auto`` is decided here, once.
    """
    from ..engines.loading import resolve_device

    name = checkpoint_identity if hashes else model_ref
    if drafter or verifier:
        if not (drafter and verifier):
            raise AsymSpecError("give both --drafter and --verifier (or a --preset)")
        models: dict[str, Any] = {"drafter": name(drafter), "verifier": name(verifier)}
        defaults: dict[str, Any] = {}
        preset_name = None
    else:
        from ..pipeline.presets import resolve_preset

        chosen = resolve_preset(preset or "auto")
        models = {"preset": chosen.name}
        if hashes:
            models.update(drafter=name(chosen.drafter), verifier=name(chosen.verifier))
        defaults = chosen.pipeline_kwargs
        preset_name = chosen.name
    _, resolved = resolve_device(device or defaults.get("device"), dtype or defaults.get("dtype"))
    models["dtype"] = str(resolved).replace("torch.", "")
    return models, preset_name


def ocr_engine_of(ocr_engine: str | None, preset_name: str | None) -> str:
    """The OCR engine a run uses: the one asked for, else the preset's (``tiny``: RapidOCR), else ``auto``."""
    if ocr_engine:
        return ocr_engine
    from ..pipeline.presets import PRESETS

    if preset_name in PRESETS:
        return str(PRESETS[preset_name]().pipeline_kwargs.get("ocr", "auto"))
    return "auto"


def comparable(identity: Mapping[str, Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """The keys a resume compares: ``skip`` left out, and a model's folder path where its files are hashed
    (the same checkpoint moved or reinstalled elsewhere is the same model)."""
    skip = set(skip)
    out = {k: v for k, v in identity.items() if k not in skip}
    if isinstance(out.get("models"), Mapping):
        out["models"] = {
            k: ({f: x for f, x in m.items() if f != "path"} if isinstance(m, Mapping) and "files" in m else m)
            for k, m in out["models"].items()
        }
    return out


def identity_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, old, new)`` for every leaf that differs (nested dicts are walked; a key only one side has
    shows :data:`MISSING` on the other)."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, MISSING), new.get(key, MISSING)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += identity_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out


_HASH = re.compile(r"^((?:sampled-)?sha256|hf-blob):([0-9a-f]{12})[0-9a-f]{28,}$")


def show_value(value: Any) -> str:
    """A value in a diff message: text quoted, a hash by its first 12 digits, :data:`MISSING` bare, a long value cut."""
    if isinstance(value, str) and (m := _HASH.match(value)):
        return f"{m.group(1)}:{m.group(2)}..."
    text = value if value == MISSING else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def write_identity_file(path: str | Path, fmt: str, version: int, identity: Mapping[str, Any], **extra: Any) -> Path:
    """Write ``{"format", "format_version", "identity", **extra, "created"}`` atomically."""
    path = Path(path)
    meta = {"format": fmt, "format_version": version, "identity": dict(identity), **extra}
    meta["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_identity_file(path: str | Path, fmt: str, fix: str) -> dict[str, Any] | None:
    """The identity stored in ``path`` (None when there is no such file); a file of another kind or a
    broken one is an :class:`AsymSpecError` ending with ``fix``."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        identity = meta["identity"]
        ok = meta.get("format") == fmt and isinstance(identity, dict)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        ok = False
    if not ok:
        raise AsymSpecError(f"{path} is not the identity file of an {fmt} run: {fix}")
    return identity
