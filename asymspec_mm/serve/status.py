"""What load balancers, routers and orchestrators read: ``GET /health`` (liveness), ``GET /ready`` (readiness),
``GET /get_load`` and ``GET /get_server_info`` (SGLang's shapes, which vllm-router and SGLang's Model Gateway poll).

- ``/health``: ``200`` while the process serves (draining included: a liveness probe must not restart a replica that
  is finishing its requests); ``503`` once the decoding worker stopped (the server cannot answer any more).
- ``/ready``: ``200 {"status": "ready"}`` while the server takes new requests; ``503`` with ``"draining"`` after
  SIGTERM, or ``"error"`` once the decoding worker stopped. While the models load, ``serve`` answers both (and
  every other request) with ``503`` ``"loading"``: :mod:`asymspec_mm.serve.loading`.
- ``/get_load``: by default (``load_format="sglang"``) a list with one entry per data-parallel rank (one here), as
  SGLang answers: ``num_reqs`` (running
  plus waiting), ``num_waiting_reqs`` and ``num_tokens`` (the context tokens the live rows hold; SGLang also counts
  the waiting prompts, which are not tokenized here until set up); SGLang's gateway (sglang-router 0.3.2) sums
  ``num_tokens``. vllm-router 0.1.17 reads an object's ``load`` instead (and shows -1 for the list):
  ``load_format="vllm-router"`` answers ``{"load": running + waiting}``. Measured with both routers' ``/get_loads``.
- ``/get_server_info``: the fields the routers' worker registration reads (``model_id``, ``model_path``,
  ``tokenizer_path``, ``dp_size``, ``version``, ``max_running_requests``, ...) plus this server's limits.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.responses import Response

from .. import __version__

#: The shapes ``/get_load`` can answer in (``--load-format``): SGLang's list, or vllm-router's ``{"load": n}``.
LOAD_FORMATS = ("sglang", "vllm-router")


def load_of(scheduler: Any) -> dict[str, int]:
    """The scheduler's load now: running rows, waiting requests and the tokens the rows hold."""
    running, waiting = int(scheduler.live_rows), int(scheduler.waiting)
    return {"num_running_reqs": running, "num_waiting_reqs": waiting, "num_tokens": int(getattr(scheduler, "live_tokens", 0))}


def add_status_routes(app: FastAPI, state: Any, json_response: Any) -> None:
    """Register ``/health``, ``/ready``, ``/get_load`` and ``/get_server_info`` on ``app`` (``state``: the app's
    :class:`~asymspec_mm.serve.app.ServerState`; ``json_response(body, status)``: the app's JSON answer)."""

    def stopped() -> Any:
        return getattr(state.scheduler, "error", None)

    @app.get("/health")
    async def health() -> Response:
        error = stopped()
        if error is not None:  # the decoding worker stopped: load balancers should take this server out
            return json_response({"status": "error", "model": state.model, "error": str(error)}, status=503)
        return json_response({"status": "draining" if state.drain.draining else "ok", "model": state.model})

    @app.get("/ready")
    async def ready() -> Response:
        error = stopped()
        if error is not None:
            return json_response({"status": "error", "model": state.model, "error": str(error)}, status=503)
        if state.drain.draining:
            return json_response({"status": "draining", "model": state.model, "in_flight": state.drain.in_flight}, status=503)
        return json_response({"status": "ready", "model": state.model})

    @app.get("/get_load")
    async def get_load() -> Response:
        load = load_of(state.scheduler)
        if state.load_format == "vllm-router":
            return json_response({"load": load["num_running_reqs"] + load["num_waiting_reqs"]})
        entry = {
            "dp_rank": 0,
            "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"],
            "num_tokens": load["num_tokens"],
            **load,
        }
        return json_response([entry])

    @app.get("/get_server_info")
    async def get_server_info() -> Response:
        pipe, scheduler = state.pipe, state.scheduler
        tokenizer_path = getattr(getattr(pipe, "verifier_tokenizer", None), "name_or_path", None) or state.model
        config = getattr(getattr(pipe, "verifier", None), "config", None)
        info = {
            "model_id": state.model,
            "served_model_name": state.model,
            "model_path": tokenizer_path,
            "tokenizer_path": tokenizer_path,
            "context_length": getattr(config, "max_position_embeddings", None),
            "dp_size": 1,
            "tp_size": 1,
            "version": __version__,
            "backend": "asymspec-mm",
            "max_batch_size": scheduler.max_batch_size,
            "max_running_requests": scheduler.max_batch_size,
            "max_queued_requests": scheduler.max_queue,
            "max_kv_bytes": scheduler.max_kv_bytes,
            "max_stall": getattr(scheduler, "max_stall", None),
            "draining": state.drain.draining,
            "internal_states": [load_of(scheduler)],
        }
        return json_response(info)
