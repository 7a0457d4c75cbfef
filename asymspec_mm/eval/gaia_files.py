"""A GAIA attachment's text, for the file-QA prompt: the drafter reads it whole, the verifier its compressed form.

GAIA attaches spreadsheets, PDFs, Word documents and plain text files to some of its tasks (the paper's
file-attachment subset, Appendix B). :func:`attachment_text` turns one into text with the usual readers:

* text-like files (:data:`TEXT_SUFFIXES`: ``.txt``, ``.csv``, ``.json``, ``.py``, ``.md``, ...): the file as UTF-8;
* ``.xlsx`` / ``.xlsm`` (``openpyxl``): every sheet, in workbook order, as a ``|``-separated table of its cell values
  (formulas as their last computed value, empty trailing cells dropped);
* ``.pdf`` (``pypdf``): each page's text under a ``Page N:`` line;
* ``.docx`` (``python-docx``): the body's paragraphs and tables in document order, a table a row per line.

The readers are the ``attachments`` extra (``pip install 'asymspec-mm[attachments]'``). A file the harness cannot
read (a reader not installed, a file encrypted, broken or over the size limit, a format it does not know) raises
:class:`AttachmentError`, one line naming the file and the fix; the harness scores that task as failed and goes on.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..base.errors import AsymSpecError

TEXT_SUFFIXES = (".txt", ".csv", ".tsv", ".json", ".jsonl", ".jsonld", ".md", ".py", ".xml", ".html", ".log", ".pdb")
SHEET_SUFFIXES = (".xlsx", ".xlsm")
#: the default size limit of an attachment the harness reads, in MiB (GAIA's largest files are a few MiB)
MAX_ATTACHMENT_MB = 20.0
#: suffix -> (the module that reads it, its pip name)
READERS = {
    ".xlsx": ("openpyxl", "openpyxl"),
    ".xlsm": ("openpyxl", "openpyxl"),
    ".pdf": ("pypdf", "pypdf"),
    ".docx": ("docx", "python-docx"),
}
INSTALL = "pip install 'asymspec-mm[attachments]'"


class AttachmentError(AsymSpecError):
    """An attachment the harness cannot turn into text: the message names the file and the fix."""


def cell_text(value: Any) -> str:
    """A spreadsheet cell's value as text: empty for none, a whole float without its ``.0``, a date in ISO form."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    return str(value)


def table_lines(rows: Iterable[Sequence[Any]]) -> list[str]:
    """Rows of cell values as ``a | b | c`` lines: trailing empty cells dropped, empty rows skipped."""
    lines = []
    for row in rows:
        cells = [cell_text(v).replace("\n", " ") for v in row]
        while cells and not cells[-1].strip():
            cells.pop()
        if cells:
            lines.append(" | ".join(cells))
    return lines


def _reader(path: Path) -> Any:
    """The module that reads ``path``'s format; an :class:`AttachmentError` naming how to install it when absent."""
    import importlib

    module, package = READERS[path.suffix.lower()]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise AttachmentError(f"reading the attachment {path.name} needs the {package} package: {INSTALL}") from None


def sheet_text(path: Path) -> str:
    """Every sheet of a workbook as a table: ``Sheet NAME:`` then one ``|``-separated line per non-empty row."""
    openpyxl = _reader(path)
    book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    try:
        blocks = []
        for sheet in book.worksheets:
            lines = table_lines(sheet.iter_rows(values_only=True))
            blocks.append("\n".join([f"Sheet {sheet.title}:", *(lines or ["(empty)"])]))
        return "\n\n".join(blocks)
    finally:
        book.close()


def pdf_text(path: Path) -> str:
    """Each page's text under ``Page N:`` (pages counted from 1); an encrypted file that opens without a password
    is read, one that needs a password is refused."""
    pypdf = _reader(path)
    reader = pypdf.PdfReader(path)
    if reader.is_encrypted and not reader.decrypt(""):
        raise AttachmentError(f"the attachment {path.name} is an encrypted PDF: give a decrypted copy (e.g. qpdf --decrypt) in its place")
    return "\n\n".join(f"Page {n}:\n{(page.extract_text() or '').strip()}" for n, page in enumerate(reader.pages, start=1))


def docx_text(path: Path) -> str:
    """A Word document's body in order: each non-empty paragraph a line, each table a ``|``-separated line per row
    (a blank line around a table)."""
    docx = _reader(path)
    from docx.table import Table

    blocks: list[str] = []
    for item in docx.Document(str(path)).iter_inner_content():
        if isinstance(item, Table):
            blocks.append("\n" + "\n".join(table_lines([cell.text for cell in row.cells] for row in item.rows)) + "\n")
        elif item.text.strip():
            blocks.append(item.text)
    return "\n".join(blocks).strip()


def _unreadable(path: Path, exc: Exception) -> AttachmentError:
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return AttachmentError(
        f"the attachment {path.name} cannot be read as {path.suffix} ({why}): check the file or replace it with a readable copy"
    )


def extract_text(path: str | Path, max_mb: float = MAX_ATTACHMENT_MB) -> str:
    """``path``'s text by its suffix (see the module); an :class:`AttachmentError` when it cannot be read."""
    path = Path(path)
    suffix = path.suffix.lower()
    size_mb = path.stat().st_size / 2**20
    if size_mb > max_mb:
        raise AttachmentError(
            f"the attachment {path.name} is {size_mb:.3g} MiB, over the {max_mb:g} MiB limit: raise --max-attachment-mb to read it"
        )
    if suffix in TEXT_SUFFIXES:
        return path.read_text(encoding="utf-8", errors="replace")
    readers = {".pdf": pdf_text, ".docx": docx_text, **dict.fromkeys(SHEET_SUFFIXES, sheet_text)}
    if suffix not in readers:
        known = ", ".join((*TEXT_SUFFIXES, *SHEET_SUFFIXES, ".pdf", ".docx"))
        raise AttachmentError(
            f"the attachment {path.name}: {suffix or 'a file without a suffix'} is not read by this harness (it reads {known} and images)"
        )
    try:
        return readers[suffix](path)
    except AttachmentError:
        raise
    except Exception as exc:  # each reader has its own errors for a broken file (zip, XML, PDF syntax)
        raise _unreadable(path, exc) from None


def attachment_text(task: Any, max_mb: float = MAX_ATTACHMENT_MB) -> str | None:
    """The text of ``task``'s attached file (:func:`extract_text`); None without a file or for an image (an image
    reaches the drafter as pixels and the verifier as its caption)."""
    if task.file is None or task.has_image:
        return None
    return extract_text(task.file, max_mb)
