"""``asymspec-mm chat``: answer a conversation read from a JSON file, its older turns compressed with ``--compression``.

The conversation is OpenAI's format (system/developer, user, assistant with ``tool_calls``, tool), the same as
``pipe.chat`` and the server's ``/v1/chat/completions`` take; images travel as ``data:`` URLs. A text-only pair (a
text drafter, e.g. Qwen3-4B) answers text conversations; a VL pair answers either kind.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base.errors import UnknownOptionError
from ..frontend.options import (
    add_compression_arg,
    add_decode_args,
    add_model_args,
    compression_from_args,
    config_from_args,
    pipeline_from_args,
)
from .output import Progress, config_line, print_result


def add_chat_parser(sub: Any) -> None:
    """The ``chat`` subcommand."""
    c = sub.add_parser("chat", help="answer a conversation (OpenAI-format messages in a JSON file), compressed with --compression")
    c.add_argument(
        "--messages",
        required=True,
        metavar="FILE",
        help='a JSON file: a list of OpenAI-format messages, or {"messages": [...], "tools": [...]} (images as data: URLs)',
    )
    c.add_argument("--tools", default=None, metavar="FILE", help="a JSON file of OpenAI function tools offered to the model")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    c.add_argument("--json", action="store_true", help="print the full result (trace, stats, compressed view) as JSON")
    add_compression_arg(c, "compress the verifier's view of the conversation turn by turn, the last turns verbatim")
    add_model_args(c)
    add_decode_args(c)
    c.set_defaults(func=cmd_chat)


def read_json_file(path: str, option: str) -> Any:
    """The JSON value in ``path``; a missing or malformed file is one line naming ``option``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UnknownOptionError(f"{option} {path}: cannot read it ({exc.strerror or exc}); give an existing JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnknownOptionError(f"{option} {path} is not JSON ({exc}); give a JSON file") from None


def read_conversation(messages_path: str, tools_path: str | None = None) -> tuple[Any, Any]:
    """``(messages, tools)`` from ``--messages`` (a list, or an object with ``messages`` and optional ``tools``) and
    ``--tools`` (which replaces the file's tools); the messages themselves are checked by the request."""
    data = read_json_file(messages_path, "--messages")
    tools = None
    if isinstance(data, Mapping):
        if "messages" not in data:
            raise UnknownOptionError(f'--messages {messages_path}: an object needs "messages" (a list of messages)')
        data, tools = data["messages"], data.get("tools")
    if tools_path is not None:
        tools = read_json_file(tools_path, "--tools")
    return data, tools


def cmd_chat(args: argparse.Namespace) -> int:
    """Read the conversation and the settings (a bad one refused before any model loads), load, answer, print."""
    messages, tools = read_conversation(args.messages, args.tools)
    cfg = config_from_args(args)
    compression = compression_from_args(args)
    progress = Progress(enabled=not args.quiet)
    progress("loading the models")
    pipe = pipeline_from_args(args)
    # set up here (its phases told to the progress lines), decoded on the engine core as the first read asks
    stream = pipe.chat_stream(messages, method=args.method, config=cfg, tools=tools, compression=compression, on_phase=progress)
    progress(f"decoding ({config_line(args.method, cfg)})")
    res = stream.result
    print_result(res, pipe.tokenizer, args.json)
    return 0
