"""Keep the cyclic garbage collector off the loaded heap while an engine decodes.

A loaded pipeline is about 500,000 container objects (the models' modules and parameters, tokenizers, processors,
transformers' and torch's own tables). Python's oldest-generation collection scans every one of them, and it runs
whenever enough new objects have survived: in a tiny-pair scheduler's minute of decoding, 8 such collections took
34-316 ms each, on the engine loop's thread, where a decode step takes 2-20 ms. :func:`frozen_heap` moves what is
alive when an engine starts into the permanent generation (``gc.freeze()``, what vLLM does once its engine has
warmed up), so the collector scans only what was made since; each engine that starts freezes what is alive then
(a second pipeline loaded meanwhile too), and when the last one ends the heap goes back (``gc.unfreeze()``), so that
a dropped pipeline caught in a reference cycle is still collected.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0  # engines running inside frozen_heap (threads of one process share the heap)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Within the block the heap alive at its entry is frozen (``gc.freeze()`` only moves the collector's lists: O(1));
    the last block to end unfreezes it (a process-wide count: engines on several threads overlap)."""
    global _holders
    with _lock:
        gc.freeze()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.unfreeze()
