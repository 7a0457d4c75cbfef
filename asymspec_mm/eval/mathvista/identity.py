"""An eval run's identity (``run.json`` next to ``records.jsonl``) and the resume / merge rules built on it.

The identity holds everything a record depends on: ``protocol``, ``models`` (preset, each checkpoint's
revision and file hashes, dtype), ``dataset`` (name, split/source or MiniVista's seed and n, the problems
file's hash, a hash of every loaded problem and of the caption/OCR/query texts), ``compressed`` (the
verifier's view), ``extract`` (answer extraction), ``max_new_tokens``, ``variants`` (each variant's method
and full effective :class:`AsymSpecConfig`) and ``version`` (the package's); plus ``selection`` (tasks,
limit, shard, require-caption), which is stored but free to change. A model whose files are hashed is
compared by its revision and hashes, not by its folder's path.

Rules. ``--resume`` continues the records only when every key but ``selection`` and ``variants`` is equal
and every variant present in both has the same method and config; a new variant adds records, a variant
left out keeps its records, a changed selection only changes which problems are run and reported.
``eval merge`` applies the same rule between its inputs (shards of one run differ only in ``selection``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...base.errors import AsymSpecError
from ...frontend.identity import comparable, file_sha256, identity_diff, ocr_engine_of, read_identity_file, show_value, write_identity_file
from .records import PROBLEM_FIELDS, _json_default

FORMAT = "asymspec-mm eval"
FORMAT_VERSION = 1
#: Identity keys stored with the run that a resume may change (records do not depend on them).
FREE_KEYS = ("selection",)
_FIX = "use a new --out or --overwrite"


def run_file(records_path: str | Path) -> Path:
    """``run.json`` for ``records.jsonl``, ``run-shard0of3.json`` for ``records-shard0of3.jsonl``."""
    p = Path(records_path)
    if p.name.startswith("records") and p.name.endswith(".jsonl"):
        return p.with_name("run" + p.name[len("records") : -len(".jsonl")] + ".json")
    return p.with_name(p.name + ".run.json")


def _identity_default(obj: Any) -> Any:
    """JSON for what a problem may hold besides JSON: an image by its pixels' hash (its ``repr`` names a memory
    address, which would make every run another one), the rest as records write it."""
    if hasattr(obj, "mode") and hasattr(obj, "tobytes") and hasattr(obj, "size"):
        return {"image": f"{obj.mode} {obj.size[0]}x{obj.size[1]}", "sha256": hashlib.sha256(obj.tobytes()).hexdigest()}
    return _json_default(obj)


def _sha256_json(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=_identity_default)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def problems_sha256(problems: Iterable[Mapping[str, Any]]) -> str:
    """A hash of every problem's MathVista fields (question, choices, answer, metadata, ...), in pid order."""
    rows = sorted(({k: p.get(k) for k in PROBLEM_FIELDS} for p in problems), key=lambda r: str(r.get("pid")))
    return _sha256_json(rows)


def texts_sha256(text: Any) -> str | None:
    """A hash of the queries, captions and OCR texts a :class:`TextData` holds (None without one)."""
    if text is None:
        return None
    return _sha256_json({"queries": text.queries, "captions": text.captions, "ocrs": text.ocrs})


def variants_identity(variants: Sequence[Any], make_config: Callable[..., Any] | None = None) -> dict[str, Any]:
    """``{name: {"method", "config"}}`` with each variant's full effective config (defaults filled in)."""
    if make_config is None:
        from ...base.config import AsymSpecConfig as make_config
    out = {}
    for v in variants:
        cfg = make_config(**dict(v.config))
        cfg = cfg.as_dict() if hasattr(cfg, "as_dict") else dict(cfg)
        out[v.name] = {"method": v.method, "config": json.loads(json.dumps(cfg, default=_json_default))}
    return out


def dataset_identity(args: Any, problems: Sequence[Mapping[str, Any]], text: Any) -> dict[str, Any]:
    """The data a run reads: MathVista's source/split (and the problems file's hash) or MiniVista's seed and n."""
    if args.dataset == "minivista":
        out: dict[str, Any] = {"name": "minivista", "seed": args.seed, "n": args.minivista_n}
    else:
        source = args.source if args.source != "auto" else ("local" if args.data_dir or args.images_dir else "hf")
        out = {"name": args.dataset, "source": source, "split": args.split}
        if args.data_dir:
            from .problems import _find_problems_file

            path = _find_problems_file(Path(args.data_dir), args.split)
            out["data_file"] = {"path": str(path.resolve()), "sha256": file_sha256(path)}
        out["texts_sha256"] = texts_sha256(text)
    out["problems_sha256"] = problems_sha256(problems)
    return out


def eval_identity(
    args: Any,
    *,
    problems: Sequence[Mapping[str, Any]],
    variants: Sequence[Any],
    text: Any,
    tasks: Sequence[str] | None,
    models: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The identity of an ``eval mathvista`` run (``models`` added once known: see :func:`check_resume`)."""
    from ... import __version__

    identity: dict[str, Any] = {"protocol": getattr(args, "protocol", "mathvista")}
    if models is not None:
        identity["models"] = dict(models)
    identity.update(
        dataset=dataset_identity(args, problems, text),
        compressed=args.compressed,
        ocr_engine=ocr_engine_of(getattr(args, "ocr_engine", None), (models or {}).get("preset")),
        extract=args.extract,
        max_new_tokens=args.max_new_tokens,
        variants=variants_identity(variants),
        version=__version__,
        selection={
            "tasks": list(tasks) if tasks else "all",
            "limit": args.limit,
            "shard": args.shard,
            "require_caption": bool(args.require_caption),
        },
    )
    if getattr(args, "families", None):
        identity["selection"]["families"] = args.families
    if "agent" in (getattr(args, "families", None) or ""):
        identity["max_turns"], identity["tool_choice"] = args.max_turns, args.tool_choice
    return identity


def resume_conflicts(old: Mapping[str, Any], new: Mapping[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """``"dataset.seed 0 -> 3"`` for every key that must agree but does not (see the module's rules)."""
    skip = set(FREE_KEYS) | {"variants"} | set(ignore)
    diffs = identity_diff(comparable(old, skip), comparable(new, skip))
    old_v, new_v = old.get("variants") or {}, new.get("variants") or {}
    for name in old_v:
        if name in new_v:
            diffs += identity_diff(old_v[name], new_v[name], f"variants.{name}.")
    return [f"{key} {show_value(a)} -> {show_value(b)}" for key, a, b in diffs]


def stored_identity(records_path: str | Path) -> dict[str, Any] | None:
    """The identity in the run file of ``records_path`` (None when it has none)."""
    return read_identity_file(run_file(records_path), FORMAT, _FIX)


def check_resume(records_path: str | Path, identity: Mapping[str, Any], *, ignore: Sequence[str] = ()) -> dict[str, Any]:
    """The stored identity of the records at ``records_path``; an :class:`AsymSpecError` naming the differing
    keys when this run is another one (``ignore``: keys not known yet, e.g. ``models`` before loading)."""
    records_path = Path(records_path)
    old = stored_identity(records_path)
    if old is None:
        raise AsymSpecError(
            f"--resume: {records_path} has no {run_file(records_path).name} (the run's identity), "
            f"so this run cannot be checked against it: {_FIX}"
        )
    conflicts = resume_conflicts(old, identity, ignore)
    if conflicts:
        raise AsymSpecError(f"--resume: this run differs from the records in {records_path.parent}: {', '.join(conflicts)}; {_FIX}")
    return old


def combined(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` with the variants of both (``old``'s first): the identity of the records after a resume."""
    out = dict(new)
    out["variants"] = {**(old.get("variants") or {}), **(new.get("variants") or {})}
    return out


def resume_notes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What a resume changes that it may: variants added, the selection."""
    notes = []
    added = [v for v in new.get("variants") or {} if v not in (old.get("variants") or {})]
    if added:
        notes.append(f"resume: adding variant(s) {', '.join(added)}")
    changed = identity_diff(old.get("selection") or {}, new.get("selection") or {})
    if changed:
        notes.append("resume: selection changed (" + ", ".join(f"{k} {show_value(a)} -> {show_value(b)}" for k, a, b in changed) + ")")
    return notes


def bind_identity(records_path: str | Path, identity: Mapping[str, Any], *, resuming: bool, log: Callable[[str], None] = print) -> dict:
    """Check ``identity`` against the stored one when resuming existing records, then write the run file."""
    stored = dict(identity)
    if resuming:
        old = check_resume(records_path, identity)
        for note in resume_notes(old, identity):
            log(note)
        stored = combined(old, identity)
    write_run_file(records_path, stored)
    return stored


def merged_identity(record_files: Sequence[Path]) -> dict[str, Any] | None:
    """The identity of records merged from ``record_files``; an :class:`AsymSpecError` when they come from
    different runs. None when none of them has a run file (records written without an identity)."""
    found = [(f, stored_identity(f)) for f in record_files]
    have = [(f, i) for f, i in found if i is not None]
    if not have:
        return None
    missing = [f for f, i in found if i is None]
    if missing:
        raise AsymSpecError(
            f"eval merge: {missing[0]} has no {run_file(missing[0]).name}, so it cannot be checked against {have[0][0]}: "
            "merge only the records of one run"
        )
    first, merged = have[0]
    for path, ident in have[1:]:
        conflicts = resume_conflicts(merged, ident)
        if conflicts:
            raise AsymSpecError(
                f"eval merge: {path} and {first} hold records of different runs ({', '.join(conflicts)}); merge only the shards of one run"
            )
        merged = combined(merged, ident)
    merged = dict(merged)
    merged["selection"] = {**(merged.get("selection") or {}), "shard": None}
    return merged


def write_run_file(records_path: str | Path, identity: Mapping[str, Any]) -> Path:
    """Write ``identity`` as the run file of ``records_path``."""
    return write_identity_file(run_file(records_path), FORMAT, FORMAT_VERSION, identity)
