"""KV reuse across requests: a radix tree of prompt keys per model, each edge holding its tokens' keys/values.

A stream's KV at position ``i`` depends only on what came before it: the tokens ``0..i`` and, at image pads,
which image they show (3D M-RoPE positions are a function of that prefix too). So a request whose prompt starts
like an earlier one's can start from the earlier KV and forward only the rest. This is what a conversation needs:
turn N+1 repeats turn N's prompt and answer before its new messages, and an agent framework resends the whole
history every step.

Terms, used throughout:

- *key* ``[L]`` int64: what identifies a stream's context token by token. Text tokens are their ids; the pads of
  an image are all one negative marker derived from that image's content hash (:func:`reuse_key`), so two images
  never share KV and the same image always does.
- *space*: the model the KV belongs to (``id(model)``). Streams on one model share a tree: the drafter's full and
  compressed views of a conversation without images are the same tokens and the same KV.
- *match*: the longest stored prefix of a key, found token by token, never assumed. Qwen3's template renders an
  earlier assistant turn without the empty ``<think>`` block its generation prompt had, and the answer's text
  may tokenize differently from the tokens that were generated; the match simply stops where they differ.

Entries are copied in (:meth:`PrefixKV.insert` clones only the part of a key not yet stored) and out
(:meth:`PrefixKV.match` concatenates into new tensors), so a live cache that grows, is cropped or is written in
place never shares memory with the tree, and eviction never disturbs a request. The tree stays within
``max_bytes`` by evicting least-recently-used leaves. One lock makes it safe to share between threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..base.checks import is_int

#: Default byte budget of the KV kept for reuse (all models together).
DEFAULT_PREFIX_KV_BYTES = 1024 * 2**20


def image_marker(image_key: str) -> int:
    """The key value of every pad of the image with content key ``image_key``: a negative int64 (token ids are
    never negative)."""
    return -1 - (int.from_bytes(hashlib.sha256(image_key.encode()).digest()[:8], "big") >> 2)


def reuse_key(
    ids: torch.Tensor, mm_token_type_ids: torch.Tensor | None = None, image_keys: list[str] | tuple[str, ...] = ()
) -> torch.Tensor:
    """The reuse key ``[L]`` of a prompt ``ids`` ``[L]``: the ids, with the pads of the j-th image (the j-th run of
    1s in ``mm_token_type_ids`` ``[>= L]``) replaced by :func:`image_marker` of ``image_keys[j]``."""
    key = ids.reshape(-1).to("cpu", torch.long).clone()
    if mm_token_type_ids is None or not len(image_keys):
        return key
    pads = mm_token_type_ids.reshape(-1)[: key.numel()].to("cpu") == 1
    starts = (pads & ~torch.cat([torch.zeros(1, dtype=torch.bool), pads[:-1]])).nonzero().reshape(-1).tolist()
    ends = (pads & ~torch.cat([pads[1:], torch.zeros(1, dtype=torch.bool)])).nonzero().reshape(-1).tolist()
    if len(starts) > len(image_keys):
        raise ValueError(f"the prompt has {len(starts)} images but {len(image_keys)} image keys")
    for start, end, image_key in zip(starts, ends, image_keys):
        key[start : end + 1] = image_marker(image_key)
    return key


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading elements ``a`` ``[n]`` and ``b`` ``[m]`` share."""
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(keys, values)]`` per layer of a single-row ``DynamicCache``, each ``[1, H, T, D]``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def new_cache(config: Any, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A ``DynamicCache`` holding ``layers`` (``[(keys, values)]``, each ``[1, H, n, D]``)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


@dataclass(eq=False)
class _Node:
    key: torch.Tensor  # [n]: the edge's tokens
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, H, n, D]
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    used: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)

    def split(self, at: int) -> _Node:
        """Cut the edge after ``at`` tokens: this node keeps the head, a new child the tail (and the children)."""
        tail = _Node(self.key[at:], [(k[:, :, at:].clone(), v[:, :, at:].clone()) for k, v in self.kv], self, self.children, self.used)
        for child in tail.children.values():
            child.parent = tail
        self.key = self.key[:at].clone()
        self.kv = [(k[:, :, :at].clone(), v[:, :, :at].clone()) for k, v in self.kv]
        self.children = {int(tail.key[0]): tail}
        return tail


@dataclass
class PrefixMatch:
    """The stored prefix of a key: ``length`` tokens and their ``layers`` (``[(keys, values)]``, each ``[1, H,
    length, D]``, new tensors; empty when nothing matched)."""

    length: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class PrefixKV:
    """The toolkit's KV reuse (module docstring): ``match(space, key)`` finds the longest stored prefix of ``key``,
    ``insert(space, key, layers)`` stores a context; LRU leaves are evicted past ``max_bytes`` (0 stores nothing).

    Counters: ``hits`` / ``misses`` count matches that found any tokens or none, ``queried_tokens`` the tokens the
    matches looked up, ``matched_tokens`` the tokens they served, ``stored_tokens`` the tokens inserted (new ones
    only), ``evictions`` the leaves dropped.
    """

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_KV_BYTES):
        if not is_int(max_bytes, minimum=0):
            raise ValueError(f"max_bytes={max_bytes!r} must be an integer >= 0")
        self.max_bytes = max_bytes
        self._roots: dict[Any, _Node] = {}
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self._paused = 0
        self.nbytes = 0
        self.hits = self.misses = self.queried_tokens = self.matched_tokens = self.stored_tokens = self.evictions = 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Within it nothing is matched or stored (what is stored stays): requests are prefilled from scratch, as
        a benchmark that times prefill, or compares with and without reuse, needs."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    @staticmethod
    def space(model: Any) -> int:
        """The space of ``model``'s KV (models live as long as the pipeline that holds this cache)."""
        return id(model)

    def _walk(self, space: Any, key: torch.Tensor) -> tuple[list[_Node], int]:
        """The nodes whose edges ``key`` follows (the last possibly only partly) and how many tokens it follows."""
        path: list[_Node] = []
        node, n = self._roots.get(space), 0
        while node is not None and n < key.numel():
            child = node.children.get(int(key[n]))
            if child is None:
                break
            m = common_prefix(child.key, key[n:])
            path.append(child)
            n += m
            if m < child.key.numel():
                break
            node = child
        return path, n

    def match(self, space: Any, key: torch.Tensor) -> PrefixMatch:
        """The longest stored prefix of ``key`` ``[L]`` in ``space`` (its KV copied out)."""
        key = key.reshape(-1).to("cpu", torch.long)
        with self._lock:
            path, n = self._walk(space, key) if not self._paused else ([], 0)
            self.queried_tokens += key.numel()
            if not n:
                self.misses += 1
                return PrefixMatch(0, [])
            now = next(self._clock)
            pieces, left = [], n
            for node in path:
                node.used = now
                take = min(left, node.key.numel())
                pieces.append([(k[:, :, :take], v[:, :, :take]) for k, v in node.kv])
                left -= take
            layers = [(torch.cat([p[i][0] for p in pieces], 2), torch.cat([p[i][1] for p in pieces], 2)) for i in range(len(pieces[0]))]
            self.hits += 1
            self.matched_tokens += n
            return PrefixMatch(n, layers)

    def stored(self, space: Any, key: torch.Tensor) -> int:
        """How many leading tokens of ``key`` ``[L]`` are stored in ``space`` (nothing is copied or counted)."""
        with self._lock:
            return 0 if self._paused else self._walk(space, key.reshape(-1).to("cpu", torch.long))[1]

    def insert(self, space: Any, key: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]], *, offset: int = 0) -> int:
        """Store the context ``key`` ``[L]`` whose KV from position ``offset`` on is ``layers`` (``[(keys, values)]``,
        each ``[1, H, >= L - offset, D]``; only the positions not stored yet are read, and copied). Nothing is stored
        when fewer than ``offset`` tokens of ``key`` are (the KV between is unknown). Returns the tokens added."""
        key = key.reshape(-1).to("cpu", torch.long)
        if not self.max_bytes or not key.numel() or not layers:
            return 0
        with self._lock:
            if self._paused:
                return 0
            root = self._roots.setdefault(space, _Node(key[:0], [], None))
            path, n = self._walk(space, key)
            if n < offset:
                return 0
            now = next(self._clock)
            for node in path:
                node.used = now
            parent = path[-1] if path else root
            added = key.numel() - n
            if added:
                followed = sum(p.key.numel() for p in path)
                if followed > n:  # the key leaves the last edge part-way: cut it there
                    parent.split(parent.key.numel() - (followed - n))
                a, b = n - offset, key.numel() - offset
                kv = [(k[:, :, a:b].clone(), v[:, :, a:b].clone()) for k, v in layers]
                leaf = _Node(key[n:].clone(), kv, parent, used=now)
                parent.children[int(key[n])] = leaf
                self.nbytes += leaf.nbytes
                self.stored_tokens += added
            self._evict()
            return added

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes:
            leaves = [node for root in self._roots.values() for node in _nodes(root) if not node.children and node.parent is not None]
            if not leaves:
                return
            victim = min(leaves, key=lambda node: node.used)
            del victim.parent.children[int(victim.key[0])]
            self.nbytes -= victim.nbytes
            self.evictions += 1

    def tokens(self) -> int:
        """Tokens stored (over all spaces)."""
        with self._lock:
            return sum(node.key.numel() for root in self._roots.values() for node in _nodes(root))

    def clear(self) -> None:
        with self._lock:
            self._roots.clear()
            self.nbytes = 0

    def stats(self) -> dict[str, int]:
        return {
            "bytes": self.nbytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "queried_tokens": self.queried_tokens,
            "matched_tokens": self.matched_tokens,
            "stored_tokens": self.stored_tokens,
            "evictions": self.evictions,
        }


def _nodes(root: _Node):
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())
