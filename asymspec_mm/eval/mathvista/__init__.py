"""MathVista (testmini) harness: data loading, the official query, the compressed view, the runner.

Data (:mod:`.problems`, :mod:`.texts`, :mod:`.tasks`)
    Problems come from the Hugging Face dataset ``AI4Math/MathVista`` (split ``testmini``; needs
    network and ``pip install datasets``) or from a local folder: a problems JSON keyed by pid
    (MathVista's ``data/testmini.json``) plus the images it references (``"image": "images/1.jpg"``).
    The text parts - official queries, Bard captions, EasyOCR output - come from MathVista's own
    JSON files (``query.json``, ``captions_bard.json``, ``ocrs_easyocr.json``) and testmini's problems
    (``testmini.json``): by default the copy shipped with the package (:mod:`.shipped`, CC BY-SA 4.0, see
    ``data/NOTICE.md``), else ``--text-dir`` / ``--data-dir`` / ``$ASYMSPEC_MATHVISTA_DIR``.

Query (:mod:`.query`)
    :func:`build_query` reproduces MathVista's ``query.json`` exactly (zero-shot, shot type
    ``solution``, no caption/OCR in the query: hint line, ``Question: ...`` with ``(Unit: u)``,
    then ``Choices:`` with ``(A) ...`` lines, stripped). The pipeline gets this query as the
    question and the compressed view separately.

Compressed view (:mod:`.texts`)
    ``official``: Bard caption (with MathVista's boilerplate phrases removed) and EasyOCR text in
    MathVista's plain form ``[([x, y], 'text'), ...]``; the pipeline renders them as
    ``Image description: ...`` / ``Image detected text: ...``. ``auto``: the pipeline makes its own
    (``caption=None, ocr=None``). ``none``: no view at all (``caption="", ocr=False``).

Paper protocol (:mod:`.paper_prompts`, :mod:`.dump`)
    ``--protocol paper`` reproduces the authors' released harness behind Table 3: the raw Bard caption
    (1,600 characters) and the EasyOCR texts joined by spaces (800) as ``Image caption:`` / ``OCR text
    from image:``, the query plus a step-by-step suffix, laid out by :data:`PAPER_STYLE` (a
    :class:`~asymspec_mm.request.prompts.PromptStyle` the pipeline is built with), and the regex extraction and
    scoring of :mod:`asymspec_mm.eval.paper_extraction`. :func:`prompt_rows` gives each problem's texts
    with no model (``--dump-prompts``).

Runner (:mod:`.run`, :mod:`.records`, :mod:`.outputs`)
    :func:`run_mathvista` runs method variants (:func:`build_variants`, the grammar of
    :mod:`asymspec_mm.frontend.variants`) over problems, appending one JSON line per finished (variant, pid)
    to a records file (flush + fsync), so an interrupt loses nothing; ``resume=True`` skips finished
    pairs and never writes a pair twice. :func:`finalize_run` writes the official output/scores JSON
    per variant plus a report.

Identity (:mod:`.identity`)
    ``run.json`` next to the records names the run (models and their file hashes, dataset, view,
    extraction, every variant's effective config, version, selection); a resume or a merge of records
    of another run is refused, naming the differing keys.
"""

from __future__ import annotations

from ...base.config import METHODS
from ...frontend.variants import ALIASES, Variant, build_variants, parse_list, parse_variant, parse_variants
from ...request.mathvista_query import HINTS, build_query, choices_text, hint_text, question_text
from .dump import load_verifier_tokenizer, problem_view, prompt_rows, style_for, write_prompt_rows
from .outputs import finalize_run, group_by_variant, official_output, safe_name
from .paper_prompts import PAPER_STYLE, PROTOCOLS, PaperPromptStyle, check_protocol, in_paper_subset, paper_user_texts, paper_view
from .problems import (
    HF_DATASET,
    _find_problems_file,
    _problems_from_obj,
    check_images,
    load_hf_problems,
    load_image,
    load_local_problems,
    load_minivista_problems,
    load_problems,
    parse_shard,
    pid_key,
    select_problems,
    sort_problems,
    write_problem_images,
)
from .records import (
    PROBLEM_FIELDS,
    STATS_KEYS,
    RecordStore,
    _iter_record_files,
    _json_default,
    _jsonable,
    merge_records,
    problem_fields,
    read_records,
    record_key,
    record_line,
    records_filename,
    stats_subset,
)
from .run import RunSummary, _check_config_consistency, _Progress, run_mathvista
from .shipped import SHA256, SHIPPED_DIR, check_shipped
from .tasks import DEFAULT_TASKS, TASK_ALIASES, TASK_SHORT, resolve_tasks
from .texts import (
    CAPTION_BOILERPLATE,
    COMPRESSED_MODES,
    ENV_TEXT_DIR,
    TEXT_FILES,
    WHERE,
    TextData,
    _read_json,
    _texts,
    default_text_dir,
    has_bard_caption,
    official_query,
    problem_caption,
    problem_ocr,
    refine_caption,
    refine_ocr,
    text_base,
    text_dir_for,
    view_for,
)

__all__ = [
    "ALIASES",
    "CAPTION_BOILERPLATE",
    "COMPRESSED_MODES",
    "DEFAULT_TASKS",
    "ENV_TEXT_DIR",
    "HF_DATASET",
    "HINTS",
    "METHODS",
    "PAPER_STYLE",
    "PROTOCOLS",
    "PaperPromptStyle",
    "PROBLEM_FIELDS",
    "STATS_KEYS",
    "TASK_ALIASES",
    "TASK_SHORT",
    "RecordStore",
    "SHA256",
    "SHIPPED_DIR",
    "TEXT_FILES",
    "RunSummary",
    "TextData",
    "Variant",
    "WHERE",
    "build_query",
    "build_variants",
    "check_protocol",
    "check_images",
    "check_shipped",
    "choices_text",
    "default_text_dir",
    "finalize_run",
    "group_by_variant",
    "has_bard_caption",
    "hint_text",
    "in_paper_subset",
    "load_hf_problems",
    "load_image",
    "load_local_problems",
    "load_minivista_problems",
    "load_problems",
    "load_verifier_tokenizer",
    "merge_records",
    "official_output",
    "official_query",
    "paper_user_texts",
    "paper_view",
    "parse_list",
    "parse_shard",
    "parse_variant",
    "parse_variants",
    "pid_key",
    "problem_caption",
    "problem_fields",
    "problem_ocr",
    "problem_view",
    "prompt_rows",
    "question_text",
    "read_records",
    "record_key",
    "record_line",
    "records_filename",
    "refine_caption",
    "refine_ocr",
    "resolve_tasks",
    "run_mathvista",
    "safe_name",
    "select_problems",
    "sort_problems",
    "write_problem_images",
    "stats_subset",
    "style_for",
    "text_base",
    "text_dir_for",
    "view_for",
    "write_problem_images",
    "write_prompt_rows",
]
