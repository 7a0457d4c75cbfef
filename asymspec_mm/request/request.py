"""The one request object: :class:`Request`, built and checked once at the edge and passed unchanged to the row.

Every edge (the Python API, the CLI, a batch file, the server, the demo, the evaluation) builds a :class:`Request`;
:meth:`Request.checked` validates it once and returns the checked copy, which every later layer (the scheduler's
line, set-up, the decoder's row through :attr:`~asymspec_mm.request.session.Session.request`) reads as it is. A
checked request is never checked again, so no layer re-spells or re-validates its fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..base.checks import is_int
from ..base.config import AsymSpecConfig, check_method
from ..base.errors import UnknownOptionError
from ..base.frozen import frozen
from ..base.unicode_check import chat_text_fields, check_text_fields
from .compression import Compression
from .questions import check_question
from .tools import answer_stop_strings, check_response_format, check_tool_choice, check_tools

DEFAULT_METHOD = "asymspec"


@dataclass(frozen=True)
class Request:
    """One question about one image, or a conversation, with everything that decides its answer.

    ``image`` and ``question``: the single-question form (``image``: a PIL image, path, bytes or array); or
    ``messages``: a conversation in OpenAI's format (``image`` and ``question`` unused). ``caption`` / ``ocr``:
    ``None`` produces them, a string is used as is, ``ocr=False`` skips OCR (a conversation: one per image, or a
    string for its only image). ``seed`` replaces the config's seed for this request alone.

    ``method`` (asymspec | floor | drafter | sd) and ``config`` (:class:`AsymSpecConfig`: K, gate, beta, sampling,
    budgets, stop strings): ``None`` takes the defaults, or a batch's (:func:`~asymspec_mm.core.generate_batch`).
    ``tools``, ``tool_choice``, ``response_format``: OpenAI's shapes (a conversation only). ``enable_thinking`` goes to
    the verifier's template; ``text_compressor`` shortens long text parts of the compressed view; ``compression``
    compresses the verifier's view turn by turn, the last turns verbatim (a conversation only:
    :class:`~asymspec_mm.request.compression.Compression`, a compressor's name, a callable or a dict). ``ignore_eos``
    decodes to the token budget; ``max_caption_chars`` replaces the caption budget; ``prompt_style`` the pipeline's
    layout of the prompt texts. ``priority``: lower is preempted last and resumed first (vLLM's convention).
    ``return_trace``: the server's answer carries the per-token trace. ``domain_advice``: what the tiny pair's
    out-of-domain warning tells the user to do, in the words of the front end that built the request (the CLI
    names its flags, the server the request's fields; ``None``: the Python API's,
    :data:`~asymspec_mm.request.domain.HOW_TO`).
    """

    image: Any = None
    question: Any = ""
    caption: Any = None
    ocr: Any = None
    messages: Any = None
    seed: int | None = None
    method: str | None = None
    config: AsymSpecConfig | None = None
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None
    enable_thinking: bool = False
    text_compressor: Callable[..., Any] | None = None
    compression: Any = None
    ignore_eos: bool = False
    max_caption_chars: int | None = None
    prompt_style: Any = None
    priority: int = 0
    return_trace: bool = False
    domain_advice: str | None = None
    #: The images an edge decoded after the check (decoding costs: it comes after the cheap checks), by index: an
    #: image part ``{"type": "image", "image": i}`` of ``messages`` with an integer ``i`` is ``images[i]``
    #: (:meth:`with_images`, :meth:`image_of`). ``None``: the parts hold their images themselves.
    images: tuple[Any, ...] | None = None
    #: set by :meth:`checked` on the copy it returns: a checked request is taken as it is
    is_checked: bool = field(default=False, repr=False, compare=False)
    #: The xgrammar grammar its forced tool call or ``response_format`` asks for, built by the submission's check
    #: (:meth:`~asymspec_mm.request.preparing.RequestPreparer.check_tools`) on the copy it returns, so that set-up
    #: compiles it rather than building it again. ``None``: free output, or not built yet.
    grammar: Any = field(default=None, repr=False, compare=False)

    @property
    def is_chat(self) -> bool:
        """Whether it is a conversation (``messages``) rather than one question about one image."""
        return self.messages is not None

    def image_of(self, source: Any) -> Any:
        """An image part's source as set-up reads it: the decoded image it names by index in :attr:`images`, else
        the source itself (a PIL image, bytes, a path, a data: URL)."""
        if self.images is not None and is_int(source):
            return self.images[source]
        return source

    def with_images(self, images: Any) -> Request:
        """A copy of this checked request with the images its edge decoded (:attr:`images`); the request itself is
        left as it is (a checked request is never changed)."""
        return dataclasses.replace(self, images=tuple(images))

    @property
    def reads_tool_calls(self) -> bool:
        """Whether its answer is read for tool calls: tools are offered and ``tool_choice`` is not ``none``."""
        return bool(self.tools) and self.tool_choice != "none"

    def checked(self, where: str = "") -> Request:
        """This request validated, with its defaults and derived settings filled in (the method, the config with the
        request's seed and the stop strings its tools need, the tools and ``tool_choice`` normalized); itself when it
        is already checked. ``where`` prefixes the field paths of errors (``requests[3]``). Raises one-line
        :class:`~asymspec_mm.base.errors.AsymSpecError` subclasses (their ``param`` the field, where there is one)."""
        if self.is_checked:
            return self
        method = check_method(DEFAULT_METHOD if self.method is None else self.method)
        cfg = self.config or AsymSpecConfig()
        cfg = (cfg.with_(seed=self.seed) if self.seed is not None else cfg).validated()
        if not is_int(self.priority):
            raise UnknownOptionError(f"priority={self.priority!r} must be an integer (lower is served first)")
        if self.max_caption_chars is not None and not is_int(self.max_caption_chars, minimum=1):
            raise UnknownOptionError(f"max_caption_chars={self.max_caption_chars!r} must be an integer >= 1")
        if not self.is_chat:
            if self.tools or self.tool_choice is not None or self.response_format is not None:
                raise UnknownOptionError("tools, tool_choice and response_format need a conversation: pass messages, e.g. pipe.chat(...)")
            check_text_fields({"question": self.question, "caption": self.caption, "ocr": self.ocr}, prefix=where)
            if self.image is None:
                return self.as_conversation(where).checked(where)
            if self.compression is not None:
                raise UnknownOptionError("compression needs a conversation: pass messages, e.g. pipe.chat(...)")
            return dataclasses.replace(
                self, **_frozen_data(self), question=check_question(self.question), method=method, config=cfg, is_checked=True
            )
        fields = chat_text_fields(self.messages, self.caption, self.ocr, self.tools, self.tool_choice, self.response_format)
        check_text_fields(fields, prefix=where)
        offered = check_tools(self.tools)
        choice = check_tool_choice(self.tool_choice, offered)
        check_response_format(self.response_format)
        cfg = cfg.with_(stop_strings=answer_stop_strings(cfg.stop_strings, offered, choice))
        compression = Compression.of(self.compression, f"{where}.compression" if where else "compression")
        checked = dataclasses.replace(self, tools=offered, tool_choice=choice)
        return dataclasses.replace(checked, **_frozen_data(checked), method=method, config=cfg, compression=compression, is_checked=True)

    def as_conversation(self, where: str = "") -> Request:
        """A question without an image as the one-turn conversation it is: ``[{"role": "user", "content":
        question}]`` (what a text-only pair answers; a VL pair answers it too, its full view the text alone). A
        caption or OCR text describes an image, so either without one is refused, naming the field."""
        for name in ("caption", "ocr"):
            if getattr(self, name) not in (None, False):
                raise UnknownOptionError(
                    f"{where + '.' if where else ''}{name} describes an image but the request has none: give the image, "
                    f"or leave {name} out",
                    param=f"{where + '.' if where else ''}{name}",
                )
        question = check_question(self.question)
        return dataclasses.replace(self, image=None, question="", messages=[{"role": "user", "content": question}], ocr=None)


#: The fields that hold JSON-shaped data a caller may keep a reference to (lists and dicts): a checked request holds
#: read-only copies of them (:func:`~asymspec_mm.base.frozen.frozen`), so neither the edge that built it nor any later
#: layer can change it. The other fields are immutable already (strings, numbers, frozen dataclasses), or objects
#: that are not data (an image, a callable, a prompt style).
DATA_FIELDS = ("messages", "caption", "ocr", "tools", "tool_choice", "response_format")


def _frozen_data(request: Request) -> dict[str, Any]:
    """Read-only copies of ``request``'s :data:`DATA_FIELDS`: the edge's lists and the request no longer share parts."""
    images = None if request.images is None else tuple(request.images)  # images are kept, not copied
    return {name: frozen(getattr(request, name)) for name in DATA_FIELDS} | {"images": images}


REQUEST_FIELDS = frozenset(f.name for f in dataclasses.fields(Request)) - {"is_checked", "images", "grammar"}


def request_of(config: AsymSpecConfig | None = None, **fields: Any) -> Request:
    """A :class:`Request` from keyword fields, as the convenience calls take them (``pipe.prepare``,
    ``sched.submit``, ...): names of :class:`Request` fields set those, any other name sets a field of ``config``
    (``k=2``, ``max_new_tokens=64``; an unknown name is refused naming it). Not checked yet."""
    overrides = {k: v for k, v in fields.items() if k not in REQUEST_FIELDS}
    own = {k: v for k, v in fields.items() if k in REQUEST_FIELDS}
    return Request(**own, config=(config or AsymSpecConfig()).with_(**overrides) if overrides else config)
