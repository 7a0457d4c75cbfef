"""Conversations: OpenAI-format messages rendered as the drafter's full view and the compressed view.

Pure functions from a message list to the two views' chat messages, which the real Qwen templates then render
(``pipe.chat``, the scheduler's ``submit_chat`` and the server's chat completions all go through them).

Layout (stable: a message renders the same way in every later turn, so each turn's prompt is a token prefix of
the next turn's apart from the generation prompt):

- ``system`` / ``developer`` and ``assistant`` messages: their text, the same in both views.
- A ``user`` message's **compressed text** is its images, each as its compressed view (caption + OCR,
  :meth:`captioning.view.CompressedView.render`) labelled ``[Image k]`` on a line of its own for the conversation's
  k-th image from the second on, then its text parts as written (through the optional ``text_compressor``: long
  documents and tool outputs, compressed once as they arrive; the full view reads them whole), all joined by a
  blank line. Images come first in
  both views, wherever the message puts them (as the full view reads pixels before text), so one user message with
  one image and a question is exactly the single-request prompt, the question before or after the image.
- The **compressed view** (verifier, drafter's compressed stream) reads each user message as its compressed text.
- The **full view** (drafter with pixels) reads each user message as its images (in order, each through the
  vision tower), then its compressed text (``drafter_view="image+text"``, the released harness) or its text parts
  alone (``drafter_view="image"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..base.config import DRAFTER_VIEWS
from ..base.errors import UnknownOptionError

#: A compressor of long text parts, applied once per part as it arrives: ``text -> shorter text``.
TextCompressor = Callable[[str], str]

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
#: Roles whose messages may hold images: the user's, and a tool's result (a screenshot, a chart it drew).
IMAGE_ROLES = ("user", "tool")


class ConversationError(UnknownOptionError):
    """A message list the toolkit cannot read (unknown role, an image outside a user message, no question);
    ``param``: the field it is about, as a path (``messages[1].tool_calls[0].function.arguments``), where one is."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ImagePart:
    """The conversation's ``index``-th image (1-based, in order of appearance) and its source as given."""

    index: int
    source: Any


@dataclass(frozen=True)
class Turn:
    """One message: its role (``system``, ``user``, ``assistant`` or ``tool``) and its parts (text, or
    :class:`ImagePart`); an assistant's ``tool_calls`` (OpenAI's shape, arguments parsed to objects) and a tool
    result's ``tool_call_id``."""

    role: str
    parts: tuple[str | ImagePart, ...]
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None

    @property
    def images(self) -> list[ImagePart]:
        return [p for p in self.parts if isinstance(p, ImagePart)]

    @property
    def texts(self) -> list[str]:
        return [p for p in self.parts if isinstance(p, str)]


def _image_source(part: Mapping[str, Any], where: str) -> Any:
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str) or not url:
            raise ConversationError(f"{where}: an image_url part needs image_url.url (a data: URL)")
        return url
    if "image" not in part:
        raise ConversationError(f"{where}: an image part needs 'image' (a PIL image, bytes or a data: URL)")
    return part["image"]


def parse_messages(messages: Sequence[Mapping[str, Any]]) -> list[Turn]:
    """OpenAI-format ``messages`` as :class:`Turn` objects (images numbered in order of appearance).

    Content is a string or a list of parts: ``{"type": "text", "text": ...}``, ``{"type": "image_url",
    "image_url": {"url": ...}}`` or ``{"type": "image", "image": ...}`` (a PIL image or bytes in a part too). Images
    in user and tool messages; an assistant message may hold ``tool_calls``, each answered later by a ``tool``
    message with its ``tool_call_id``. The last message must be the user's or a tool's (the turn to answer).
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ConversationError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    turns: list[Turn] = []
    n_images = 0
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise ConversationError(f"{where} is not a dict with 'role' and 'content'")
        role = ROLES.get(m.get("role"))
        if role is None:
            raise ConversationError(f"{where}: role {m.get('role')!r} is not one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None and role in ("assistant", "tool"):
            content = ""
        if isinstance(content, str):
            items: Sequence[Any] = [content]
        elif isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
            items = content
        else:
            raise ConversationError(f"{where}: content must be a string or a list of parts")
        parts: list[str | ImagePart] = []
        for j, part in enumerate(items):
            at = f"{where}.content[{j}]"
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ConversationError(f"{at}: a text part needs 'text' (a string)")
                parts.append(text)
            elif isinstance(part, Mapping) and part.get("type") in ("image_url", "image"):
                if role not in IMAGE_ROLES:
                    raise ConversationError(f"{at}: images go in user and tool messages only (this is a {m.get('role')} message)")
                n_images += 1
                parts.append(ImagePart(n_images, _image_source(part, at)))
            else:
                raise ConversationError(f"{at}: parts are {{'type': 'text'}}, {{'type': 'image_url'}} or {{'type': 'image'}}")
        calls = tuple(tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m.get("tool_calls") or ()))
        if calls and role != "assistant":
            raise ConversationError(f"{where}: tool_calls belong in assistant messages")
        call_id = m.get("tool_call_id")
        if role == "tool":
            known = {c["id"] for t in turns for c in t.tool_calls}
            if not isinstance(call_id, str) or call_id not in known:
                raise ConversationError(
                    f"{where}: a tool message needs the tool_call_id of an earlier assistant tool call "
                    f"(got {call_id!r}; earlier calls: {', '.join(sorted(known)) or 'none'})"
                )
        turns.append(Turn(role, tuple(parts), calls, call_id if role == "tool" else None))
    if turns[-1].role not in ("user", "tool"):
        raise ConversationError("the last message must be the user's or a tool's result (the turn to answer)")
    return turns


def task_text(turns: Sequence[Turn]) -> str:
    """The conversation's task: the text of its first user message that has any (later turns follow it up), the
    parts joined by a blank line; empty when no user message has text."""
    for turn in turns:
        text = "\n\n".join(t for t in turn.texts if t.strip())
        if turn.role == "user" and text:
            return text
    return ""


def tool_call(call: Any, where: str) -> dict[str, Any]:
    """An assistant message's tool call in OpenAI's shape (``{"id", "type": "function", "function": {"name",
    "arguments"}}``, arguments a JSON string or an object), its arguments checked: JSON text stays the text the
    client sent (an empty one is ``{}``), so a template that writes it as it is (Qwen3's) puts the call in the prompt
    as the model wrote it, numbers included (``-2.5e3``, where parsing and ``tojson`` would write ``-2500.0``);
    :func:`~asymspec_mm.request.tool_support.template_messages` parses it for a template that does not. An object
    stays an object."""
    import json

    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not isinstance(call.get("id"), str):
        raise ConversationError(
            f'{where}: a tool call is {{"id": ..., "type": "function", "function": {{"name": ..., "arguments": ...}}}}', where
        )
    args = fn.get("arguments", {})
    if isinstance(args, str):
        args = args.strip() or "{}"
        try:
            json.loads(args)
        except json.JSONDecodeError as exc:
            raise ConversationError(f"{where}.function.arguments is not valid JSON ({exc.msg})", f"{where}.function.arguments") from None
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": fn["name"], "arguments": dict(args) if isinstance(args, Mapping) else args},
    }


def truncate(limit: int = 2000, head: int = 1000, tail: int = 500) -> TextCompressor:
    """The built-in text compressor: a text over ``limit`` characters keeps its first ``head`` and last ``tail``
    (the released harness' 2,000 / 1,000 / 500), with a line saying how many characters were cut."""
    if not 0 <= head + tail <= limit:
        raise UnknownOptionError(f"truncate: head + tail ({head} + {tail}) must be within limit ({limit})")

    def compress(text: str) -> str:
        if len(text) <= limit:
            return text
        return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[len(text) - tail :]}"

    return compress


def image_label(index: int) -> str:
    """The label before the conversation's ``index``-th image's compressed view (none for the first)."""
    return "" if index == 1 else f"[Image {index}]\n"


def compressed_text(turn: Turn, views: Mapping[int, str], text_compressor: TextCompressor | None = None) -> str:
    """A user message's compressed text: its images' labelled compressed views (``views[index]``: the rendered
    caption + OCR; empty views leave the label alone), in order, then its text parts, each through
    ``text_compressor``; all joined by a blank line."""
    out = [(image_label(part.index) + views[part.index].strip()).strip() for part in turn.images]
    out += [(text_compressor(part) if text_compressor is not None else part).strip() for part in turn.texts]
    return "\n\n".join(text for text in out if text)


@dataclass(frozen=True)
class ViewMessages:
    """The two views' chat messages: ``compressed`` for the Qwen3 template (string contents), ``compressed_vl``
    the same for the VL template (text parts), ``full`` for the VL template with ``{"type": "image"}`` parts."""

    compressed: list[dict[str, Any]]
    compressed_vl: list[dict[str, Any]]
    full: list[dict[str, Any]]


def view_messages(
    turns: Sequence[Turn],
    views: Mapping[int, str],
    *,
    drafter_view: str = "image+text",
    text_compressor: TextCompressor | None = None,
    verifier_turns: Sequence[Turn] | None = None,
) -> ViewMessages:
    """The chat messages of both views of ``turns`` (see the module docstring); ``views[k]`` the k-th image's
    rendered compressed view. ``verifier_turns``: the same messages as the compressed view reads them (older turns
    compressed, :func:`~asymspec_mm.request.compression.compress_turns`); the full view reads ``turns``."""
    if drafter_view not in DRAFTER_VIEWS:
        raise UnknownOptionError(f"drafter_view={drafter_view!r} is not one of {DRAFTER_VIEWS}")
    compressed, compressed_vl, full = [], [], []
    for turn, seen in zip(turns, verifier_turns if verifier_turns is not None else turns):
        extra: dict[str, Any] = {}
        if turn.tool_calls:
            extra["tool_calls"] = [dict(c) for c in turn.tool_calls]
        if turn.tool_call_id is not None:
            extra["tool_call_id"] = turn.tool_call_id
        if turn.role not in IMAGE_ROLES:
            text = "\n\n".join(t.strip() for t in seen.texts if t.strip())
            compressed.append({"role": turn.role, "content": text, **extra})
            compressed_vl.append({"role": turn.role, "content": [{"type": "text", "text": text}], **extra})
            text = "\n\n".join(t.strip() for t in turn.texts if t.strip())
            full.append({"role": turn.role, "content": [{"type": "text", "text": text}], **extra})
            continue
        text = compressed_text(seen, views, text_compressor)
        compressed.append({"role": turn.role, "content": text, **extra})
        compressed_vl.append({"role": turn.role, "content": [{"type": "text", "text": text}], **extra})
        # the drafter's full view reads long texts whole: compressing them is the other context asymmetry
        if drafter_view == "image":
            text = "\n\n".join(t.strip() for t in turn.texts if t.strip())
        else:
            text = compressed_text(turn, views)
        full.append({"role": turn.role, "content": [{"type": "image"} for _ in turn.images] + [{"type": "text", "text": text}], **extra})
    return ViewMessages(compressed, compressed_vl, full)


def view_texts(
    processor,
    verifier_tokenizer,
    vm: ViewMessages,
    *,
    enable_thinking: bool = False,
    tools: Sequence[Mapping] | None = None,
    compressed_tools: Sequence[Mapping] | None = None,
) -> tuple[str, str, str]:
    """``(verifier, drafter_comp, drafter_full)`` prompt strings of ``vm`` through the real chat templates, each with
    the generation prompt (the verifier's with thinking disabled unless ``enable_thinking``, as a single request's)
    and, given ``tools`` (OpenAI function tools), the templates' own tools block (the compressed view's:
    ``compressed_tools`` where given)."""
    from .tool_support import template_messages

    kw: dict[str, Any] = {"tools": list(tools)} if tools else {}
    ckw: dict[str, Any] = {"tools": list(compressed_tools)} if compressed_tools else kw
    v_text = verifier_tokenizer.apply_chat_template(
        template_messages(verifier_tokenizer, vm.compressed),
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
        **ckw,
    )
    c_text = processor.apply_chat_template(
        template_messages(processor, vm.compressed_vl), tokenize=False, add_generation_prompt=True, **ckw
    )
    f_text = processor.apply_chat_template(template_messages(processor, vm.full), tokenize=False, add_generation_prompt=True, **kw)
    return v_text, c_text, f_text


def per_image(value: Any, n: int, name: str) -> list[Any]:
    """A conversation's ``caption`` / ``ocr`` argument as one value per image: ``None`` (produce it) or ``False``
    (OCR off) for every image, a string for the only image, or a list with one entry per image."""
    if value is None or value is False:
        return [value] * n
    if isinstance(value, str):
        if n != 1:
            raise ConversationError(f"{name}: the conversation has {n} images; give a list with one {name} per image", name)
        return [value]
    if isinstance(value, Sequence) and len(value) == n:
        return list(value)
    raise ConversationError(f"{name}: give None, a string (one image) or a list of {n} (one per image, in order)", name)
