"""User text that cannot be encoded: found once, where a request is built, and refused naming its field.

A Python ``str`` may hold lone surrogates (U+D800..U+DFFF): JSON's ``"\\ud800"`` escape decodes to one, and a
command line or file read with ``surrogateescape`` keeps each undecodable byte as one (U+DC80..U+DCFF). Tokenizers,
UTF-8 files and JSON writers with ``ensure_ascii=False`` all fail on them deep inside a request (a tokenizer's
``TypeError`` surfaced as a server's 500), so every edge that takes user text (the server's request body, the Python
API's ``prepare`` / ``prepare_chat`` / scheduler / ``generate_batch``, the CLI's options, a batch file's lines) walks
the values it was given with :func:`check_text_fields` first.

Pure and torch-free, so the CLI and the batch reader can refuse text before any model loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import InvalidTextError

#: How to fix it, the same at every edge (the text is what the caller sends, whatever the channel).
FIX = "send UTF-8 text"


def first_bad_character(text: str) -> tuple[int, int] | None:
    """``(index, code point)`` of the first character of ``text`` that UTF-8 cannot encode (a lone surrogate), or
    ``None`` when all of it can."""
    try:
        text.encode("utf-8")  # the common case, at C speed
        return None
    except UnicodeEncodeError as exc:
        return exc.start, ord(text[exc.start])


def describe_character(code: int) -> str:
    """``lone surrogate U+D800``; a surrogate that ``surrogateescape`` made of an undecodable byte names the byte
    too (``lone surrogate U+DCE9 (undecodable byte 0xe9)``), as that is what the user's file or terminal holds."""
    what = f"lone surrogate U+{code:04X}"
    return f"{what} (undecodable byte 0x{code - 0xDC00:02x})" if 0xDC80 <= code <= 0xDCFF else what


def text_problem(text: str) -> str | None:
    """Why ``text`` is not valid Unicode text (``lone surrogate U+D800 at character 0``), or ``None`` when it is."""
    bad = first_bad_character(text)
    if bad is None:
        return None
    index, code = bad
    return f"{describe_character(code)} at character {index}"


def _child(path: str, key: Any) -> str:
    """The path of ``key`` under ``path``: ``a.b`` for a name, ``a[2]`` for an index, ``a["x y"]`` otherwise."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    shown = json.dumps(key) if isinstance(key, str) else repr(key)  # json.dumps escapes a bad key too
    return f"{path}[{shown}]"


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in ``value`` (nested mappings, lists and tuples; object keys included) as ``(path, text)``, in
    document order. Iterative, so a deeply nested body cannot exhaust the stack; other values (numbers, images,
    bytes) are not text and are skipped."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            yield where, v
        elif isinstance(v, Mapping):
            children = []
            for key, item in v.items():
                if isinstance(key, str) and first_bad_character(key) is not None:
                    yield f"{where} (key {ascii(key)})", key
                children.append((_child(where, key), item))
            stack.extend(reversed(children))
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed([(_child(where, i), item) for i, item in enumerate(v)]))


def find_bad_text(fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(field path, problem)`` of the first string in ``fields`` (field name -> value, walked as
    :func:`_strings` does) that is not valid Unicode text, or ``None`` when all of them are."""
    for name, value in fields.items():
        for where, text in _strings(value, name):
            problem = text_problem(text)
            if problem is not None:
                return where, problem
    return None


def invalid_text_message(path: str, problem: str) -> str:
    """The one-line refusal: ``messages[0].content: not valid Unicode text (lone surrogate U+D800 at character 0);
    send UTF-8 text``."""
    return f"{path}: not valid Unicode text ({problem}); {FIX}"


def check_text_fields(fields: Mapping[str, Any], prefix: str = "") -> None:
    """Raise :class:`~asymspec_mm.base.errors.InvalidTextError` (its ``param`` the field path, under ``prefix``, e.g.
    ``requests[3]``) for the first string in ``fields`` that is not valid Unicode text."""
    found = find_bad_text({_child(prefix, name) if prefix else name: v for name, v in fields.items()})
    if found is not None:
        path, problem = found
        raise InvalidTextError(invalid_text_message(path, problem), param=path)


def chat_text_fields(messages: Any, caption: Any, ocr: Any, tools: Any, tool_choice: Any, response_format: Any) -> dict[str, Any]:
    """The fields of a conversation request that hold user text, by the names the Python API gives them (the
    stop strings are the config's, checked with it)."""
    return {
        "messages": messages,
        "caption": caption,
        "ocr": ocr,
        "tools": tools,
        "tool_choice": tool_choice,
        "response_format": response_format,
    }
