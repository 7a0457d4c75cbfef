"""The runner: :func:`run_mathvista` runs method variants over problems, one durable record per finished pair."""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...base.config import AsymSpecConfig
from ...base.errors import DatasetUnavailableError, UnknownOptionError
from ...frontend.variants import Variant
from ..extraction import LLM, extract_answer_detailed
from ..paper_extraction import paper_score
from ..samples import request_config
from ..scoring import score_problem
from .identity import bind_identity
from .paper_prompts import check_protocol, check_records_protocol, paper_view, record_marks
from .problems import load_image
from .records import RecordStore, _json_default, log_failure, problem_fields, stats_subset
from .texts import TextData, official_query, view_for


class _Progress:
    """tqdm when installed (and enabled), else a line every few percent."""

    def __init__(self, total: int, initial: int, enabled: bool, desc: str = "mathvista") -> None:
        self.total, self.n, self.enabled = total, initial, enabled
        self._bar: Any = None
        self._last_print = 0.0
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def update(self, postfix: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)
            return
        now = time.monotonic()
        step = max(1, self.total // 20)
        if self.n == self.total or self.n % step == 0 or now - self._last_print > 30:
            self._last_print = now
            print(f"[{self.n}/{self.total}] {postfix}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@dataclass
class RunSummary:
    """What :func:`run_mathvista` did: new/skipped/failed counts and all records of the run's pairs."""

    records: list[dict[str, Any]]
    new: int = 0
    skipped: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Tally:
    """Each variant's running accuracy, plus acceptance and speed, over the pairs this run finished: the
    progress bar's postfix (a variant's accuracy is its own: methods differ, so one number would mislead).
    Acceptance is each speculative variant's pooled rate, computed as the report computes it
    (:func:`~asymspec_mm.eval.report.speculation_summary`), so the bar's last value is the report's."""

    per_variant: dict[str, list[int]] = field(default_factory=dict)
    stats: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tok: float = 0.0
    wall: float = 0.0

    def add(self, variant: str, true_false: Any, stats: Mapping[str, Any], new_tokens: Any, wall_s: float) -> str:
        """Count one finished pair; returns the postfix (``floor 40.0% asymspec 55.0% | accept (pooled) asymspec 0.867 | tok/s=...``)."""
        counts = self.per_variant.setdefault(variant, [0, 0])
        counts[0] += bool(true_false)
        counts[1] += 1
        self.stats.setdefault(variant, []).append({"stats": dict(stats)})
        if new_tokens:
            self.tok += float(new_tokens)
        self.wall += wall_s
        return self.postfix()

    def postfix(self) -> str:
        from ..report import speculation_summary

        parts = [" ".join(f"{name} {100 * c / n:.1f}%" for name, (c, n) in self.per_variant.items())]
        pooled = {name: speculation_summary(recs)[0] for name, recs in self.stats.items()}
        # floor and drafter draft nothing (no rate): a 0.0 for them would read as a failed speculation
        shown = [f"{name} {rate:.3f}" for name, rate in pooled.items() if rate is not None]
        if shown:
            parts.append("accept (pooled) " + " ".join(shown))
        if self.wall > 0 and self.tok:
            parts.append(f"tok/s={self.tok / self.wall:.1f}")
        return " | ".join(parts)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _check_config_consistency(store: RecordStore, variants: Sequence[Variant]) -> None:
    seen: dict[str, Mapping[str, Any]] = {}
    for (vname, _pid), rec in store.records.items():
        seen.setdefault(vname, rec.get("config") or {})
    for v in variants:
        old = seen.get(v.name)
        if old is not None and dict(old) != json.loads(json.dumps(dict(v.config), default=_json_default)):
            raise UnknownOptionError(
                f"variant {v.name!r} in {store.path} was run with config {dict(old)}, now {dict(v.config)}: "
                "use the same flags to resume, or a new --out"
            )


def _make_record(
    res: Any,
    problem: Mapping[str, Any],
    variant: Variant,
    query: str,
    wall_s: float,
    *,
    compressed: str,
    dataset: str,
    llm: LLM | None,
    extract_mode: str,
) -> dict[str, Any]:
    """The record of one generation: response, extraction, score, stats and the problem's fields
    (``extract_mode="paper"``: the paper's extraction and scoring, else MathVista's)."""
    pid = str(problem["pid"])
    response = str(getattr(res, "text", "") or "")
    stats = stats_subset(getattr(res, "stats", None))
    token_ids = getattr(res, "token_ids", None)
    new_tokens = stats.get("new_tokens")
    if new_tokens is None and token_ids is not None:
        try:
            new_tokens = len(token_ids)
        except TypeError:
            new_tokens = None
    fields = problem_fields(problem, query)
    if extract_mode == "paper":
        ext, true_false = paper_score(response, fields)
        prediction = ext.answer
    else:
        ext = extract_answer_detailed(response, fields, llm=llm, mode=extract_mode)
        prediction, true_false = score_problem(fields, ext.answer)
    return {
        "pid": pid,
        "variant": variant.name,
        "method": variant.method,
        "config": dict(variant.config),
        "dataset": dataset,
        "compressed": compressed,
        "response": response,
        "extraction": ext.answer,
        "extraction_rule": ext.rule,
        "prediction": prediction,
        "true_false": true_false,
        "answer": problem.get("answer"),
        "task": (problem.get("metadata") or {}).get("task"),
        "new_tokens": new_tokens,
        "wall_s": round(wall_s, 4),
        "stats": stats,
        "problem": fields,
        "time": _now(),
    }


def _seed_of(make_config: Callable[..., Any], variant: Variant, pid: str) -> dict[str, int]:
    """``{"seed": ...}``: a sampled request's own seed for ``generate_batch`` ({} when greedy)."""
    seed = getattr(request_config(make_config, variant, pid), "seed", None)
    return {} if seed is None else {"seed": seed}


def _batch_results(pipe: Any, chunk: list[tuple], variants: Sequence[Variant], make_config: Callable[..., Any]) -> dict:
    """``{(variant, pid): result}`` of one chunk of problems, each variant's pending problems in one
    ``generate_batch`` call. A chunk whose batch fails is left out, so its problems run one by one and each
    failure is recorded against its own problem, exactly as in a sequential run."""
    out: dict[tuple[str, str], Any] = {}
    for variant in variants:
        rows = [(str(p["pid"]), q, c, o, img) for p, pending, q, c, o, img in chunk if variant in pending]
        if not rows:
            continue
        requests = [
            {"image": img, "question": q, "caption": c, "ocr": o, **_seed_of(make_config, variant, pid)} for pid, q, c, o, img in rows
        ]
        try:
            results = pipe.generate_batch(requests, method=variant.method, config=make_config(**dict(variant.config)), batch_size=len(rows))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception:  # noqa: BLE001 - retried one by one, where each error is logged against its problem
            continue
        out.update({(variant.name, pid): res for (pid, *_), res in zip(rows, results)})
    return out


def run_mathvista(
    pipe: Any,
    problems: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    records_path: str | Path,
    *,
    text: TextData | None = None,
    compressed: str = "official",
    resume: bool = False,
    overwrite: bool = False,
    llm: LLM | None = None,
    extract_mode: str = "rules",
    on_error: str = "skip",
    progress: bool = True,
    config_factory: Callable[..., Any] | None = None,
    dataset: str = "mathvista",
    image_loader: Callable[[Mapping[str, Any]], Any] = load_image,
    log: Callable[[str], None] = print,
    batch_size: int = 1,
    identity: Mapping[str, Any] | None = None,
    protocol: str = "mathvista",
) -> RunSummary:
    """Run every variant on every problem, appending one record per finished pair to ``records_path``.

    ``pipe`` needs ``generate(image, question, caption=..., ocr=..., method=..., config=...)``
    returning an object with ``text`` and ``stats`` (and optionally ``token_ids``).
    ``config_factory(**variant.config)`` makes the config (default: ``AsymSpecConfig``).
    Problems are the outer loop, so one image serves all variants. ``on_error="skip"`` logs a
    failed generation to ``errors.jsonl`` next to the records and goes on (the pair stays
    unfinished and a resumed run retries it); ``"raise"`` stops. ``KeyboardInterrupt`` propagates
    after everything finished so far is on disk. ``batch_size`` > 1 (with a pipeline that has
    ``generate_batch``) decodes that many problems of one variant together; the records are the same,
    appended in the same order. ``identity`` (see :mod:`.identity`) is checked against the stored one when
    resuming existing records (a different run is refused, naming the keys) and written to ``run.json``.
    ``protocol="paper"`` gives every problem the paper's caption/OCR texts
    (:func:`~.paper_prompts.paper_view`, with ``compressed="official"``) and needs a pipeline built with
    ``prompt_style=PAPER_STYLE``; ``extract_mode="paper"`` the paper's extraction and scoring.
    """
    if on_error not in ("skip", "raise"):
        raise UnknownOptionError(f"on_error={on_error!r}: expected 'skip' or 'raise'")
    check_protocol(protocol, pipe)
    make_config = config_factory or AsymSpecConfig
    records_path = Path(records_path)
    summary = RunSummary(records=[])
    with RecordStore(records_path, resume=resume, overwrite=overwrite) as store:
        _check_config_consistency(store, variants)
        if identity is not None:
            bind_identity(records_path, identity, resuming=bool(store.records), log=log)
        check_records_protocol(store.records.values(), protocol, store.path)
        pairs_total = len(problems) * len(variants)
        already = sum(1 for p in problems for v in variants if (v.name, str(p["pid"])) in store)
        summary.skipped = already
        if already:
            log(f"resuming: {already}/{pairs_total} (variant, problem) pairs already in {records_path}")
        bar = _Progress(pairs_total, already, progress)
        tally = _Tally()
        try:
            batched = batch_size > 1 and callable(getattr(pipe, "generate_batch", None))
            for start in range(0, len(problems), batch_size if batched else 1):
                chunk = []
                for problem in problems[start : start + (batch_size if batched else 1)]:
                    pid = str(problem["pid"])
                    pending = [v for v in variants if (v.name, pid) not in store]
                    if pending:
                        query = official_query(problem, text)
                        if protocol == "paper" and compressed == "official":
                            caption, ocr = paper_view(problem, text)
                        else:
                            caption, ocr = view_for(problem, compressed, text, dataset=dataset)
                        chunk.append((problem, pending, query, caption, ocr, image_loader(problem)))
                done = _batch_results(pipe, chunk, variants, make_config) if batched else {}
                for problem, pending, query, caption, ocr, image in chunk:
                    pid = str(problem["pid"])
                    for variant in pending:
                        t0 = time.perf_counter()
                        try:
                            res = done.get((variant.name, pid))
                            if res is None:
                                res = pipe.generate(
                                    image,
                                    query,
                                    caption=caption,
                                    ocr=ocr,
                                    method=variant.method,
                                    config=request_config(make_config, variant, pid),
                                )
                        except (KeyboardInterrupt, SystemExit, DatasetUnavailableError):
                            raise
                        except Exception as exc:  # noqa: BLE001 - a failed generation must not lose the run
                            if on_error == "raise":
                                raise
                            summary.errors.append(log_failure(records_path, pid, variant.name, exc, log))
                            bar.update("error")
                            continue
                        wall_s = res.stats.get("wall_s", 0.0) if (variant.name, pid) in done else time.perf_counter() - t0
                        record = _make_record(
                            res, problem, variant, query, wall_s, compressed=compressed, dataset=dataset, llm=llm, extract_mode=extract_mode
                        )
                        record.update(record_marks(protocol, extract_mode, problem, text, dataset))
                        if store.append(record):
                            summary.new += 1
                        bar.update(tally.add(variant.name, record["true_false"], record["stats"], record["new_tokens"], wall_s))
        except KeyboardInterrupt:
            bar.close()
            log(f"\ninterrupted: {len(store)} records are safe in {records_path}; rerun with --resume to continue")
            raise
        bar.close()
        wanted = {(v.name, str(p["pid"])) for p in problems for v in variants}
        summary.records = [r for k, r in store.records.items() if k in wanted]
    return summary
