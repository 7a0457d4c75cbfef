"""The Responses API's stores (issue #50, item 2): the in-memory one and the SQLite file that replicas on one host
share. Both keep the same bounds; the file is read and written by several processes at once (real processes, each
its own connection); two live servers on one file answer each other's ``previous_response_id`` through the ``openai``
client, and two servers with their own memories refuse it with a 400 saying what to do behind a router."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from asymspec_mm.base.errors import AsymSpecError
from asymspec_mm.serve.responses_store import (
    STORE_MAX_BYTES,
    STORE_MAX_RESPONSES,
    MemoryResponseStore,
    SQLiteResponseStore,
    open_response_store,
)


def message(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request, tmp_path):
    """A factory of stores of one kind with the given bounds, closed after the test."""
    made = []

    def make(**bounds):
        path = tmp_path / f"r{len(made)}.sqlite"
        store = MemoryResponseStore(**bounds) if request.param == "memory" else SQLiteResponseStore(path, **bounds)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def test_both_stores_are_bounded_alike(make_store):
    store = make_store(max_responses=2, max_bytes=1000)
    for rid in ("a", "b", "c"):
        assert store.put(rid, message(rid))
    assert store.get("a") is None and store.get("b") == message("b") and len(store) == 2
    assert not store.put("big", message("x" * 2000)) and store.get("big") is None
    store.put("d", message("y" * 900))  # over the bytes with b and c: both go, the least recently used first
    assert store.get("d") == message("y" * 900) and store.get("c") is None and len(store) == 1
    used = make_store(max_responses=2)
    used.put("e", message("e"))
    used.put("f", message("f"))
    used.get("e")  # e is used again: f is now the least recently used
    used.put("g", message("g"))
    assert used.get("f") is None and used.get("e") is not None and used.get("g") is not None
    used.put("g", message("h"))  # a second put of one id replaces it and counts it once
    assert used.get("g") == message("h") and len(used) == 2


def test_a_stored_conversation_round_trips_unchanged(make_store):
    store = make_store()
    convo = [
        *message("Which bar is the tallest? é ✓"),
        {"role": "user", "content": [{"type": "image_url", "url": "data:image/png;base64,AAAA", "param": "previous_response_id"}]},
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, None]}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "7"}]},
    ]
    store.put("r", convo)
    got = store.get("r")
    assert got == convo and got is not convo
    got[0]["content"][0]["text"] = "changed"  # a copy: the caller's edits stay out of the store
    assert store.get("r") == convo


def test_the_defaults_are_the_documented_bounds(tmp_path):
    memory, shared = open_response_store(), open_response_store(tmp_path / "r.sqlite")
    assert isinstance(memory, MemoryResponseStore) and isinstance(shared, SQLiteResponseStore)
    assert (memory.max_responses, memory.max_bytes) == (shared.max_responses, shared.max_bytes) == (256, 64 * 2**20)
    assert (STORE_MAX_RESPONSES, STORE_MAX_BYTES) == (256, 64 * 2**20)
    assert sqlite3.connect(tmp_path / "r.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    shared.close()


WRITER = textwrap.dedent(
    """
    import sys
    from asymspec_mm.serve.responses_store import SQLiteResponseStore
    path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = SQLiteResponseStore(path, max_responses=100)
    for i in range(n):
        messages = [{"role": "user", "content": [{"type": "text", "text": f"{name} {i}"}]}]
        assert store.put(f"{name}-{i}", messages)
        # read back as written; or already dropped, when this process was descheduled while the two others wrote
        # the 100 newer responses that push it out (seen on a loaded machine)
        assert store.get(f"{name}-{i}") in (messages, None)
    store.close()
    """
)


def test_several_processes_share_one_file_within_its_bounds(tmp_path):
    """Three processes write 60 responses each at once (and read each back) into one file bounded at 100: none fails
    on the file's lock, the file ends with exactly 100, this process reads each of them as it was written, and what
    was dropped is each writer's oldest (the least recently used go first, across processes)."""
    path = tmp_path / "shared.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, "60"]) for name in ("p", "q", "r")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    reader = SQLiteResponseStore(path, max_responses=100)
    rids = [rid for (rid,) in reader._db.execute("SELECT rid FROM responses")]
    assert len(reader) == len(rids) == 100
    for rid in rids:
        name, i = rid.split("-")
        assert reader.get(rid) == message(f"{name} {i}")
    for name in ("p", "q", "r"):
        kept = sorted(int(r.split("-")[1]) for r in rids if r.startswith(name))
        assert kept == list(range(60 - len(kept), 60))
    reader.close()


def test_a_path_that_cannot_be_a_store_is_a_one_line_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a database, just text " * 100)
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("CREATE TABLE users (name TEXT)")
    other.commit()
    other.close()
    cases = {
        tmp_path / "missing" / "r.sqlite": "does not exist",
        tmp_path: "is a folder",
        tmp_path / "notes.txt": "cannot be opened as a SQLite database",
        tmp_path / "other.sqlite": "of something else",
    }
    for path, problem in cases.items():
        with pytest.raises(AsymSpecError) as err:
            open_response_store(path)
        text = str(err.value)
        assert problem in text and "--responses-store" in text and "\n" not in text, text


def test_serve_refuses_a_bad_store_before_loading(capsys, tmp_path):
    from asymspec_mm.cli.main import main

    rc = main(["serve", "--preset", "tiny", "--port", "0", "--responses-store", str(tmp_path / "nope" / "r.sqlite")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--responses-store" in err and "does not exist" in err, err
    assert "loaded" not in err


# ---------------------------------------------------------------------------------------------- two live servers
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")


def two_servers(pipe, stores):
    from asymspec_mm.serve.app import create_app
    from asymspec_mm.serve.server import ServerThread

    return [ServerThread(create_app(pipe, max_batch_size=2, responses_store=store)).start() for store in stores]


def continued_elsewhere(servers) -> tuple:
    """A first turn on one server, its next turn (by ``previous_response_id``) on the other."""
    a, b = (openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300) for s in servers)
    first = a.responses.create(model="tiny", input="Which bar is the tallest?", max_output_tokens=4)
    return first, b.responses.create(model="tiny", previous_response_id=first.id, input="And the shortest?", max_output_tokens=4)


def test_servers_on_one_file_answer_each_others_previous_response_id(tiny_pipe, tmp_path):
    stores = [SQLiteResponseStore(tmp_path / "shared.sqlite") for _ in range(2)]  # a connection each, as two processes
    servers = two_servers(tiny_pipe, stores)
    try:
        first, second = continued_elsewhere(servers)
        whole = [
            {"role": "user", "content": "Which bar is the tallest?"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And the shortest?"},
        ]
        direct = openai.OpenAI(base_url=servers[0].url + "/v1", api_key="unused", max_retries=0, timeout=300)
        assert second.previous_response_id == first.id
        assert second.output_text == direct.responses.create(model="tiny", input=whole, max_output_tokens=4).output_text
    finally:
        for s in servers:
            s.stop()
        for store in stores:
            store.close()


def test_servers_with_their_own_memory_say_what_to_do_behind_a_router(tiny_pipe):
    servers = two_servers(tiny_pipe, [None, None])
    try:
        with pytest.raises(openai.BadRequestError) as err:
            continued_elsewhere(servers)
    finally:
        for s in servers:
            s.stop()
    body = err.value.body
    assert body["param"] == "previous_response_id" and body["code"] == "previous_response_not_found"
    text = body["message"]
    assert "\n" not in text and all(k in text for k in ("X-Session-Id", "X-SMG-Routing-Key", "--responses-store", "whole conversation")), (
        text
    )
