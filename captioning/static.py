"""Precomputed captions served by problem id (MathVista's ``captions_bard.json`` and the like).

MathVista ships, for every problem, a caption written by Bard and an EasyOCR result. Serving
them verbatim (after the same clean-up the official evaluation applies) lets the text-only
verifier be evaluated on exactly the compressed view the MathVista paper used, without running
any captioning model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from captioning.errors import AsymSpecError, DatasetUnavailableError

__all__ = [
    "BARD_NONSENSE_PHRASES",
    "MissingStaticTextError",
    "MissingCaptionError",
    "StaticCaptioner",
    "load_text_table",
    "refine_bard_caption",
]

TextSource = Mapping[str, Any] | str | os.PathLike

# The phrases the official MathVista query builder (evaluation/build_query.py, refine_caption)
# removes from Bard captions: chat-style prefaces and sign-offs that describe nothing in the
# image. Order matters for faithfulness: they are removed one after the other, each removal
# followed by a strip, exactly as the official pipeline does.
BARD_NONSENSE_PHRASES: tuple[str, ...] = (
    "Sure. ",
    "Sure, I can do that.",
    "Sorry, I can't help with images of people yet.",
    "I can't process this file.",
    "I'm unable to help you with that, as I'm only a language model and don't have the necessary information or abilities.",
    "I'm not programmed to assist with that.",
    "Please let me know if you have any other questions.",
    "I hope this is helpful!",
    "I hope this helps!",
)


class MissingStaticTextError(AsymSpecError, KeyError):
    """A problem id has no entry in a precomputed caption/OCR table.

    Derives from ``KeyError`` too, so code that treats the table like a mapping keeps working.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would print the repr of the message (quoted, escaped newlines);
        # the plain message reads better in logs and in the UI.
        return str(self.args[0]) if self.args else ""


class MissingCaptionError(MissingStaticTextError):
    """No precomputed caption exists for a problem id."""


def refine_bard_caption(caption: Any) -> str:
    """Clean a Bard caption the way MathVista's official query builder does.

    Every phrase of :data:`BARD_NONSENSE_PHRASES` is removed wherever it occurs (not only at
    the start: the official code uses a plain replace), the text is stripped after each
    removal, and finally double spaces are collapsed once. A non-string caption (a missing
    value in the JSON) becomes ``""``. Mirroring these exact rules keeps prompts identical to
    the official MathVista "caption + OCR" setting.
    """
    if not isinstance(caption, str):
        return ""
    for phrase in BARD_NONSENSE_PHRASES:
        caption = caption.replace(phrase, "").strip()
    return caption.replace("  ", " ").strip()


def load_text_table(source: TextSource, kind: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Read a ``{pid: text}`` table from a dict or a JSON file.

    Accepts MathVista's layout ``{"model", ..., "texts": {pid: text}}`` as well as a bare
    ``{pid: text}`` mapping. Returns ``(texts, metadata, origin)`` where ``origin`` names the
    file (or ``"<dict>"``) for error messages. Keys are turned into strings, because MathVista
    pids are strings and callers often hold them as ints.

    Raises:
        DatasetUnavailableError: the file is missing or is not a JSON object of the above form.
    """
    if isinstance(source, Mapping):
        data: Any = source
        origin = "<dict>"
    else:
        path = Path(source).expanduser()
        origin = str(path)
        if not path.is_file():
            raise DatasetUnavailableError(
                f"{kind} file not found: {path}. For MathVista, download data/texts/ from the "
                "lupantech/MathVista repository and pass its path."
            )
        try:
            with path.open(encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DatasetUnavailableError(f"{kind} file {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise DatasetUnavailableError(f"{kind} source {origin} must be a JSON object, got {type(data).__name__}.")
    if "texts" in data and isinstance(data["texts"], Mapping):
        texts = data["texts"]
        metadata = {k: v for k, v in data.items() if k != "texts"}
    else:
        texts = data
        metadata = {}
    return {str(k): v for k, v in texts.items()}, metadata, origin


class PidTable:
    """Stored texts keyed by problem id (``self._texts``), in file order: ``pid in table``, ``len``, iteration."""

    _texts: Mapping[str, Any]

    @property
    def pids(self) -> list[str]:
        """Problem ids that have a stored text, in file order."""
        return list(self._texts)

    def __contains__(self, pid: object) -> bool:
        return str(pid) in self._texts

    def __len__(self) -> int:
        return len(self._texts)

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)


class StaticCaptioner(PidTable):
    """Serves precomputed captions (MathVista ``captions_bard.json``) by problem id.

    Args:
        source: the parsed JSON (``{"texts": {pid: caption}}`` or ``{pid: caption}``) or a path
            to such a file.
        fallback: returned for pids without a caption; ``None`` (default) raises
            :class:`MissingCaptionError` instead, so a silently empty view is never mistaken
            for a real one.
        refine: apply :func:`refine_bard_caption` (default ``True``, as MathVista does).
    """

    def __init__(self, source: TextSource, fallback: str | None = None, refine: bool = True) -> None:
        self._texts, self.metadata, self.origin = load_text_table(source, "caption")
        self.fallback = fallback
        self.refine = refine

    def raw(self, pid: str | int) -> str:
        """The caption exactly as stored (no clean-up).

        Raises:
            MissingCaptionError: ``pid`` has no caption (the fallback does not apply here).
        """
        key = str(pid)
        if key not in self._texts:
            raise self._missing(key)
        value = self._texts[key]
        return value if isinstance(value, str) else ""

    def caption_for(self, pid: str | int) -> str:
        """The (cleaned) caption of ``pid``, or the fallback when there is none.

        Raises:
            MissingCaptionError: ``pid`` has no caption and no fallback was configured.
        """
        key = str(pid)
        if key not in self._texts:
            if self.fallback is not None:
                return self.fallback
            raise self._missing(key)
        value = self._texts[key]
        return refine_bard_caption(value) if self.refine else (value if isinstance(value, str) else "")

    def _missing(self, pid: str) -> MissingCaptionError:
        return MissingCaptionError(
            f"No caption for pid {pid!r} in {self.origin} ({len(self._texts)} captions). "
            "Pass fallback='' to StaticCaptioner to continue without a caption, or caption the "
            "image with a model instead."
        )
