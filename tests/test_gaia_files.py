"""GAIA attachments as text (asymspec_mm.eval.gaia_files): real workbooks, Word documents and PDFs written by their
own libraries, each read back to an exact text; an unreadable file (a reader missing, encrypted, broken, too large,
an unknown format) is one line naming the file and the fix, and fails its task while the run goes on; the file-QA
request puts the text in the user turn, where the file compression cuts it for the verifier (the real compressor,
the tiny pair's tokenizer) and the drafter reads it whole."""

from __future__ import annotations

import datetime as dt
import json
import sys

import pytest

from asymspec_mm.eval.gaia import FILE_COMPRESSION, HarnessSettings, file_qa_messages, run_gaia
from asymspec_mm.eval.gaia_data import GaiaTask, ToolCache
from asymspec_mm.eval.gaia_files import AttachmentError, attachment_text, extract_text

openpyxl = pytest.importorskip("openpyxl")
docx = pytest.importorskip("docx")
pypdf = pytest.importorskip("pypdf")


def write_workbook(path):
    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Sales"
    for row in (["item", "count", "price"], ["apple", 3, 1.5], ["pear", None, 2.0], [], ["sold on", dt.date(2026, 12, 5)]):
        sales.append(row)
    sales["E2"] = "=B2*C2"  # a formula no spreadsheet program has computed: no cached value, an empty cell
    book.create_sheet("Notes")["A1"] = "checked\nby Ada"
    book.create_sheet("Empty")
    book.save(path)
    return path


def test_a_workbook_reads_as_one_table_per_sheet(tmp_path):
    text = extract_text(write_workbook(tmp_path / "sales.xlsx"))
    assert text == (
        "Sheet Sales:\nitem | count | price\napple | 3 | 1.5\npear |  | 2\nsold on | 2026-12-05T00:00:00"
        "\n\nSheet Notes:\nchecked by Ada\n\nSheet Empty:\n(empty)"
    )


def test_a_word_document_reads_its_paragraphs_and_tables_in_order(tmp_path):
    doc = docx.Document()
    doc.add_paragraph("Inventory report")
    doc.add_paragraph("")
    table = doc.add_table(rows=2, cols=2)
    for r, cells in enumerate((("crate", "count"), ("crate 17", "21"))):
        for c, value in enumerate(cells):
            table.cell(r, c).text = value
    doc.add_paragraph("End of report.")
    doc.save(tmp_path / "report.docx")
    assert extract_text(tmp_path / "report.docx") == "Inventory report\n\ncrate | count\ncrate 17 | 21\n\nEnd of report."


def write_pdf(path, pages):
    """A text PDF, one page per entry (matplotlib's PDF backend with the standard fonts: the text stays text)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with matplotlib.rc_context({"pdf.use14corefonts": True}), PdfPages(path) as pdf:
        for text in pages:
            fig = plt.figure(figsize=(4, 2))
            fig.text(0.1, 0.5, text)
            pdf.savefig(fig)
            plt.close(fig)
    return path


def test_a_pdf_reads_page_by_page(tmp_path):
    path = write_pdf(tmp_path / "log.pdf", ["Crate 17 holds 21 items", "Checked on 5 December"])
    assert extract_text(path) == "Page 1:\nCrate 17 holds 21 items\n\nPage 2:\nChecked on 5 December"


def test_an_encrypted_pdf_is_refused_unless_it_opens_without_a_password(tmp_path):
    plain = write_pdf(tmp_path / "plain.pdf", ["Crate 17 holds 21 items"])
    for name, user in (("locked.pdf", "secret"), ("owner-only.pdf", "")):
        writer = pypdf.PdfWriter(clone_from=plain)
        writer.encrypt(user_password=user, owner_password="owner", algorithm="RC4-128")
        writer.write(tmp_path / name)
    with pytest.raises(AttachmentError) as err:
        extract_text(tmp_path / "locked.pdf")
    assert str(err.value) == "the attachment locked.pdf is an encrypted PDF: give a decrypted copy (e.g. qpdf --decrypt) in its place"
    assert extract_text(tmp_path / "owner-only.pdf") == "Page 1:\nCrate 17 holds 21 items"


@pytest.mark.parametrize("name", ["broken.xlsx", "broken.pdf", "broken.docx"])
def test_a_broken_file_is_one_line_naming_it(tmp_path, name):
    (tmp_path / name).write_bytes(b"this is not what its suffix says\n" * 4)
    with pytest.raises(AttachmentError) as err:
        extract_text(tmp_path / name)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"the attachment {name} cannot be read as .{name.split('.')[1]} (")
    assert message.endswith("): check the file or replace it with a readable copy")


def test_a_missing_reader_an_oversize_file_and_an_unknown_format_say_the_fix(tmp_path, monkeypatch):
    book = write_workbook(tmp_path / "sales.xlsx")
    with pytest.raises(AttachmentError) as err:
        extract_text(book, max_mb=0.001)
    assert str(err.value) == (
        f"the attachment sales.xlsx is {book.stat().st_size / 2**20:.3g} MiB, over the 0.001 MiB limit: raise --max-attachment-mb to read it"
    )
    (tmp_path / "song.mp3").write_bytes(b"ID3")
    with pytest.raises(AttachmentError, match=r"^the attachment song.mp3: \.mp3 is not read by this harness \(it reads \.txt, "):
        extract_text(tmp_path / "song.mp3")
    monkeypatch.setitem(sys.modules, "openpyxl", None)  # what an environment without the package imports
    with pytest.raises(AttachmentError) as err:
        extract_text(book)
    assert str(err.value) == "reading the attachment sales.xlsx needs the openpyxl package: pip install 'asymspec-mm[attachments]'"


def test_text_files_read_as_they_are_and_images_give_no_text(tmp_path):
    (tmp_path / "notes.md").write_text("# Notes\ncrate 17: 21\n", encoding="utf-8")
    (tmp_path / "chart.png").write_bytes(b"")
    assert attachment_text(GaiaTask("t", "q", 1, "a", tmp_path / "notes.md")) == "# Notes\ncrate 17: 21\n"
    assert attachment_text(GaiaTask("t", "q", 1, "a", tmp_path / "chart.png")) is None
    assert attachment_text(GaiaTask("t", "q", 1, "a")) is None


def test_the_file_text_is_a_user_document_the_verifier_reads_truncated_and_the_drafter_whole(tiny_pipe, tmp_path):
    """The file-QA request through the pipeline's real compression path (the paper's file compression: truncation
    of each user text part, here to the question's length in tokens): the verifier's prompt holds the question whole
    and the workbook's first tokens, the drafter's full prompt the whole workbook."""
    from asymspec_mm.request.compression import Compression

    task = GaiaTask("t", "How many apples were sold?", 1, "3", write_workbook(tmp_path / "sales.xlsx"))
    messages = file_qa_messages(task, None)
    document = messages[1]["content"][1]["text"]
    assert document == "Attached file sales.xlsx:\n" + extract_text(task.file)
    tok = tiny_pipe.verifier_tokenizer
    limit = len(tok(task.question, add_special_tokens=False)["input_ids"])  # the question fits: it stays whole
    session = tiny_pipe.prepare_chat(messages, compression=Compression.of({**FILE_COMPRESSION, "limit": limit}), prefill=False)
    ids = tok(document, add_special_tokens=False)["input_ids"]
    cut = "".join(tok.decode([i]) for i in ids[:limit]) + f"\n[... {len(ids) - limit} tokens cut ...]"
    verifier = tok.decode(session.prompts.verifier_ids[0])
    assert task.question in verifier and cut in verifier and document not in verifier
    drafter = tiny_pipe.processor.tokenizer.decode(session.prompts.drafter_full_ids[0])
    assert document in drafter and "tokens cut" not in drafter


def test_an_unreadable_attachment_fails_its_task_and_the_run_goes_on(server, tmp_path):
    """Three file tasks: a broken workbook and a PDF that needs a password fail with their one-line errors (no
    request made); the CSV after them is answered."""
    (tmp_path / "broken.xlsx").write_bytes(b"not a workbook")
    plain = write_pdf(tmp_path / "plain.pdf", ["Crate 17 holds 21 items"])
    writer = pypdf.PdfWriter(clone_from=plain)
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    writer.write(tmp_path / "locked.pdf")
    (tmp_path / "counts.csv").write_text("crate,count\n17,21\n", encoding="utf-8")
    tasks = [GaiaTask(n, "How many items does crate 17 hold?", 1, "21", tmp_path / n) for n in ("broken.xlsx", "locked.pdf", "counts.csv")]
    settings = HarnessSettings(compression="truncate,limit=40", max_tokens=2, model_id="tiny")  # no LLMLingua-2 model here
    lines: list[str] = []
    records = run_gaia(server.url, tasks, ["floor"], settings, ToolCache(), out=tmp_path / "run", log=lines.append)
    assert [(r.task_id, len(r.requests)) for r in records] == [("broken.xlsx", 0), ("locked.pdf", 0), ("counts.csv", 1)]
    assert not records[0].correct and not records[1].correct
    assert records[0].error.startswith("AttachmentError: the attachment broken.xlsx cannot be read as .xlsx (")
    assert (
        records[1].error
        == "AttachmentError: the attachment locked.pdf is an encrypted PDF: give a decrypted copy (e.g. qpdf --decrypt) in its place"
    )
    assert records[2].error is None and records[2].requests[0]["prompt_tokens"] > 0
    assert lines[0] == f"floor broken.xlsx (file): wrong, 0 requests, {records[0].error}"
    stored = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert [r["error"] for r in stored] == [r.error for r in records]
