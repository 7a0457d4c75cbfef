"""Where the Responses API keeps the conversations that ``previous_response_id`` names: :class:`ResponseStore`, a
small interface with two kinds, :class:`MemoryResponseStore` (this process only, the default) and
:class:`SQLiteResponseStore` (a file that every server on one host started with the same ``--responses-store``
shares, so that a conversation may continue on any replica behind a router). :func:`open_response_store` picks one.

Both are bounded alike: at most ``max_responses`` responses and ``max_bytes`` of conversation (the JSON text of the
messages: text and image data URLs), the least recently used dropped first; a response reads as used when it is
stored and each time a later turn names it. Neither drops by age. A shared file's limits are those of the file, all
servers together. Another kind (a network store for replicas on several hosts) implements the same four methods.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError

#: Responses a store keeps for ``previous_response_id`` (the least recently used go first).
STORE_MAX_RESPONSES = 256
#: Bytes of conversation (the JSON text of the messages: text and image data URLs) a store keeps at most, all
#: responses together.
STORE_MAX_BYTES = 64 * 2**20
#: Seconds a write waits for another process's write to the shared file before it fails.
SQLITE_BUSY_TIMEOUT_S = 30.0
#: The schema of :class:`SQLiteResponseStore`'s file (``PRAGMA user_version``); another number is refused by name.
SQLITE_SCHEMA_VERSION = 1
#: The session keys the routers read, for the advice of a per-process store (docs/deployment.md, "Sessions").
SESSION_KEYS = "X-Session-Id for vllm-router, X-SMG-Routing-Key for SGLang's gateway"


class ResponseStore:
    """The interface: :meth:`put` a response's conversation under its id, :meth:`get` it back (a copy, or None),
    :meth:`advice` (what a client whose ``previous_response_id`` is not held should do), :meth:`close`.
    ``max_responses`` and ``max_bytes`` are its bounds."""

    max_responses: int = STORE_MAX_RESPONSES
    max_bytes: int = STORE_MAX_BYTES

    def put(self, rid: str, messages: list[dict[str, Any]]) -> bool:
        """Keep ``messages`` under ``rid``; False when they alone are over ``max_bytes`` (not kept)."""
        raise NotImplementedError

    def get(self, rid: str) -> list[dict[str, Any]] | None:
        """A copy of the conversation stored under ``rid``, or None (never stored, or dropped since)."""
        raise NotImplementedError

    def advice(self) -> str:
        """Where the store keeps responses and what to do instead, for the 400 of an id it does not hold."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the store holds open (nothing for the memory store)."""

    def __len__(self) -> int:
        raise NotImplementedError


def encoded(messages: list[dict[str, Any]]) -> str:
    """The JSON text a store keeps and counts (its length is the size the bounds read)."""
    return json.dumps(messages, separators=(",", ":"))


class MemoryResponseStore(ResponseStore):
    """The conversations of recent responses in this process's memory: each response's messages (without its
    ``instructions``, as OpenAI's API carries them over) and its answer, images kept as their URLs (loaded again when
    a later turn names it). Gone with the server, and unseen by any other replica."""

    def __init__(self, max_responses: int = STORE_MAX_RESPONSES, max_bytes: int = STORE_MAX_BYTES):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rid: str, messages: list[dict[str, Any]]) -> bool:
        size = len(encoded(messages))
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._items.pop(rid, None)
            self._bytes -= old[1] if old is not None else 0
            self._items[rid] = (messages, size)
            self._bytes += size
            while len(self._items) > self.max_responses or self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped
        return True

    def get(self, rid: str) -> list[dict[str, Any]] | None:
        with self._lock:
            item = self._items.get(rid)
            if item is None:
                return None
            self._items.move_to_end(rid)  # a conversation in use stays
            return copy.deepcopy(item[0])

    def advice(self) -> str:
        return (
            f"this server keeps its last {self.max_responses} responses sent without store=false in its own memory (gone "
            f"when it restarts, unseen by other replicas); behind a router, send a session key so that every turn reaches "
            f"the same replica ({SESSION_KEYS}) or start every replica with the same --responses-store FILE.sqlite; "
            "or send the whole conversation in input"
        )


class SQLiteResponseStore(ResponseStore):
    """The conversations of recent responses in a SQLite file (WAL mode) that several processes on one host share:
    what one server stores, every server opened on the same file reads. Each write is one ``BEGIN IMMEDIATE``
    transaction (the put and the drops it makes), so concurrent servers keep the bounds of the file as a whole. Not
    for a file on a network file system (SQLite's locks do not hold there): one host only."""

    def __init__(self, path: str | Path, max_responses: int = STORE_MAX_RESPONSES, max_bytes: int = STORE_MAX_BYTES):
        self.path = Path(path).expanduser()
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._lock = threading.Lock()  # one connection, shared by the server's threads
        self._db = _open(self.path)

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def put(self, rid: str, messages: list[dict[str, Any]]) -> bool:
        text = encoded(messages)
        if len(text) > self.max_bytes:
            return False
        with self._lock, _write(self._db) as db:
            db.execute(
                "INSERT OR REPLACE INTO responses (rid, messages, bytes, used) "
                "VALUES (?, ?, ?, (SELECT COALESCE(MAX(used), 0) + 1 FROM responses))",
                (rid, text, len(text)),
            )
            count, total = db.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses").fetchone()
            if count > self.max_responses or total > self.max_bytes:
                db.executemany("DELETE FROM responses WHERE rid = ?", [(r,) for r in self._overflow(db, count, total)])
        return True

    def _overflow(self, db: sqlite3.Connection, count: int, total: int) -> list[str]:
        """The least recently used ids to drop until the file is within both bounds."""
        out = []
        for rid, size in db.execute("SELECT rid, bytes FROM responses ORDER BY used"):
            if count <= self.max_responses and total <= self.max_bytes:
                break
            out.append(rid)
            count, total = count - 1, total - size
        return out

    def get(self, rid: str) -> list[dict[str, Any]] | None:
        with self._lock, _write(self._db) as db:
            row = db.execute(
                "UPDATE responses SET used = (SELECT MAX(used) + 1 FROM responses) WHERE rid = ? RETURNING messages", (rid,)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def advice(self) -> str:
        return (
            f"the shared store {str(self.path)!r} keeps the last {self.max_responses} responses sent without store=false "
            "by every server started with it; send the whole conversation in input"
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _write:
    """A ``BEGIN IMMEDIATE`` transaction (the file's write lock, waited for up to the busy timeout): committed on
    success, rolled back on an error."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, *rest: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _open(path: Path) -> sqlite3.Connection:
    """The store's file opened (created when new) in WAL mode with its table; a path that cannot be a store is an
    :class:`AsymSpecError` naming it and the fix."""
    where = f"--responses-store {str(path)!r}"
    if not path.parent.is_dir():
        raise AsymSpecError(f"{where}: the folder {str(path.parent)!r} does not exist; create it or name a file in an existing folder")
    if path.is_dir():
        raise AsymSpecError(f"{where} is a folder; name a file, e.g. {str(path / 'responses.sqlite')!r}")
    try:
        db = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        mode = _journal_mode_wal(db)
        if mode.lower() != "wal":
            db.close()
            raise AsymSpecError(f"{where}: SQLite cannot use WAL mode there (got {mode!r}); put the file on a local disk")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL's safe setting: a commit survives a crash of the process
        with _write(db):  # one server at a time makes the table: another starting beside it waits, then finds it
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables - {"responses"} or (tables and version != SQLITE_SCHEMA_VERSION):
                raise AsymSpecError(f"{where} is a SQLite database of something else (tables {', '.join(sorted(tables))}); name a new file")
            db.execute(
                "CREATE TABLE IF NOT EXISTS responses "
                "(rid TEXT PRIMARY KEY, messages TEXT NOT NULL, bytes INTEGER NOT NULL, used INTEGER NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS responses_by_use ON responses (used)")
            db.execute(f"PRAGMA user_version={SQLITE_SCHEMA_VERSION}")
    except sqlite3.Error as exc:
        raise AsymSpecError(f"{where} cannot be opened as a SQLite database ({exc}); name a new file or one this server made") from None
    return db


def _journal_mode_wal(db: sqlite3.Connection) -> str:
    """Switch ``db``'s file to WAL and return the journal mode SQLite reports. Several servers starting on a new file
    at once race for the switch, and SQLite answers "database is locked" at once there, without its busy handler:
    retry for up to the busy timeout, as any other write waits."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            return db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def open_response_store(path: str | Path | None = None) -> ResponseStore:
    """The store of ``--responses-store``: None, the memory of this process; a path, that SQLite file (created when
    new), shared by every server opened on it."""
    return MemoryResponseStore() if path is None else SQLiteResponseStore(path)
