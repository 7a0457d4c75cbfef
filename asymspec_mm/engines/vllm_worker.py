"""vLLM's side of the backend: the worker extension that captures the logits rows the engines ask for.

vLLM loads it by qualified name (``worker_extension_cls``, :data:`asymspec_mm.engines.vllm.EXTENSION`, which
re-exports :class:`AsymSpecWorkerExtension`); it runs in vLLM's worker processes (every tensor-parallel rank).
``asymspec_install`` wraps the worker's model runner's ``execute_model`` *on that instance*: after each forward it
reads the final hidden states of the tokens computed in the step (the runner's
``execute_model_state.hidden_states``, the tensor vLLM itself samples from), keeps the rows a request asked for
(its ``SamplingParams.extra_args["asymspec"]``: a key and the first wanted position) and applies the model's own
``compute_logits`` to them. The engines collect them with ``collective_rpc("asymspec_take_many", ...)``. Rows of
every step of a request are kept, so a request that prefills in chunks or decodes several tokens
(``max_tokens > 1``: :meth:`asymspec_mm.engines.vllm_rows.VLLMBatchEngine.draft`) returns the rows of all its steps.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("asymspec_mm.vllm")

ARG = "asymspec"  # key in SamplingParams.extra_args


class AsymSpecWorkerExtension:
    """Mixed into vLLM's GPU/CPU worker (``worker_extension_cls``); methods are called via ``collective_rpc``.

    The worker's ``__init__`` does not run ours, so state is created by :meth:`asymspec_install`.
    """

    def asymspec_install(self) -> dict:
        """Wrap this worker's ``model_runner.execute_model`` (idempotent). Returns what was hooked."""
        runner = self.model_runner
        if getattr(runner, "_asymspec_store", None) is not None:
            return {"installed": True, "runner": type(runner).__module__}
        store: dict[str, dict] = {}  # key -> {"first": first computed position, "rows": {pos: logits}}
        tracked: dict[str, list] = {}  # vLLM req id -> [key, wanted_from, next position]
        original = runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            out = original(scheduler_output, *args, **kwargs)
            if kwargs.get("dummy_run") or scheduler_output is None:  # profiling / DP padding runs
                return out
            try:
                _capture(runner, scheduler_output, store, tracked)
            except Exception as exc:  # never break vLLM's step; the engine raises with this message
                log.exception("asymspec: capturing hidden states failed")
                for rid in scheduler_output.num_scheduled_tokens:
                    if rid in tracked and tracked[rid][0] in store:
                        store[tracked[rid][0]]["error"] = f"{type(exc).__name__}: {exc}"
            return out

        runner.execute_model = execute_model
        runner._asymspec_store = store
        runner._asymspec_tracked = tracked
        return {"installed": True, "runner": type(runner).__module__}

    def asymspec_take(self, key: str, to_cpu: bool = True):
        """Pop the rows captured for ``key``: ``(first_computed_position, positions [m], logits [m, V])``.

        ``logits`` is None on ranks that do not hold the gathered logits (TP rank > 0).
        """
        entry = self.model_runner._asymspec_store.pop(key, None)
        if entry is None:
            return None
        if "error" in entry:
            raise RuntimeError(f"capturing the hidden states in vLLM's worker failed: {entry['error']}")
        rows = entry["rows"]
        positions = sorted(rows)
        logits = None
        if positions and rows[positions[0]] is not None:
            logits = torch.stack([rows[p] for p in positions])
            if to_cpu:
                logits = logits.cpu()
        return entry["first"], positions, logits

    def asymspec_take_many(self, keys: list[str], to_cpu: bool = True) -> list:
        """:meth:`asymspec_take` for several keys in one RPC (one entry per key, ``None`` where nothing was captured)."""
        out, error = [], None
        for key in keys:  # every key is popped, even after a failed one (nothing may leak)
            try:
                out.append(self.asymspec_take(key, to_cpu))
            except RuntimeError as exc:
                error = error or exc
                out.append(None)
        if error is not None:
            raise error
        return out

    def asymspec_pending(self) -> int:
        """Number of captured, not yet taken entries (tests check nothing leaks)."""
        return len(self.model_runner._asymspec_store)


def _batch_order(runner, state) -> list[str]:
    """Request ids in the row order of the step's hidden states (V2: state.input_batch, V1: runner.input_batch)."""
    batch = getattr(state, "input_batch", None)
    if batch is None:
        batch = runner.input_batch
    return [r for r in list(batch.req_ids)[: batch.num_reqs] if r is not None]


@torch.inference_mode()
def _capture(runner, scheduler_output, store: dict, tracked: dict) -> None:
    for rid in getattr(scheduler_output, "finished_req_ids", ()) or ():
        tracked.pop(rid, None)
    for new in scheduler_output.scheduled_new_reqs:
        sp = new.sampling_params
        extra = (sp.extra_args or {}).get(ARG) if sp is not None else None
        if extra:
            tracked[new.req_id] = [extra["key"], int(extra["from"]), int(new.num_computed_tokens)]
            store.setdefault(extra["key"], {"first": int(new.num_computed_tokens), "rows": {}})
    if not tracked:
        return
    cached = getattr(scheduler_output, "scheduled_cached_reqs", None)  # continuing (chunked, resumed) requests
    if cached is not None:  # their computed count at the start of this step
        for rid, done in zip(getattr(cached, "req_ids", ()) or (), getattr(cached, "num_computed_tokens", ()) or ()):
            if rid in tracked:
                tracked[rid][2] = int(done)
    num_sched = scheduler_output.num_scheduled_tokens
    if not any(rid in tracked for rid in num_sched):
        return
    state = getattr(runner, "execute_model_state", None)
    hidden = getattr(state, "hidden_states", None) if state is not None else None
    if not isinstance(hidden, torch.Tensor):
        raise RuntimeError("no hidden states after the step (pipeline parallelism or a pooling model?)")
    offset = 0
    for rid in _batch_order(runner, state):
        n = int(num_sched.get(rid, 0))
        t = tracked.get(rid)
        if t is not None and n:
            key, wanted, start = t
            lo = max(wanted - start, 0)
            if lo < n:
                logits = runner.model.compute_logits(hidden[offset + lo : offset + n])
                entry = store[key]
                for i in range(n - lo):
                    entry["rows"][start + lo + i] = None if logits is None else logits[i].float()
            t[2] = start + n
        offset += n
