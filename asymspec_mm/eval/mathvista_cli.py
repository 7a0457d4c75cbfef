"""``asymspec-mm eval mathvista``: run method variants over MathVista testmini (or MiniVista), appending records as
they finish, then write official output/scores JSON per variant and a report (:mod:`.mathvista`). MiniVista's agent
families run through :mod:`.agent_eval` and :mod:`.log_eval`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base.config import CHOICES, RANGES, AsymSpecConfig
from ..base.errors import AsymSpecError, UnknownOptionError
from ..frontend.options import add_model_args, check_option_ranges, finite_float, pipeline_from_args
from ..frontend.variants import parse_list
from .agent_eval import add_agent_arguments, minivista_families
from .samples import sample_variants

DEFAULT_OUT = "runs/mathvista"


def add_mathvista_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``eval mathvista`` on ``eval``'s subparsers."""
    m = sub.add_parser("mathvista", help="run method variants on MathVista testmini (or MiniVista)")
    g = m.add_argument_group("methods")
    g.add_argument(
        "--methods",
        default="asymspec,floor,drafter,sd",
        help="comma list of asymspec, floor, drafter, sd and ablations fixed (gate fixed), tuned (gate tuned: the paper "
        "text's lambda gate, --lam), tuned_kl (the released code's lambda*KL gate, --lam), kl (Table 14's KL gate), "
        "raw / scd (delta source), beta0 (beta=0); NAME@field=value,... sets config fields, e.g. "
        "'floor,asymspec@gate=fixed,beta=0,sd' is three variants [default: %(default)s]",
    )
    g.add_argument("--k", default=None, help=f"draft length(s), {RANGES['k'].text()}; a comma list sweeps (asymspec variants and sd)")
    g.add_argument("--beta", default=None, help=f"beta value(s), {RANGES['beta'].text()}; a comma list sweeps (asymspec variants)")
    g.add_argument("--gamma", default=None, help=f"gamma value(s), {RANGES['gamma'].text()}; a comma list sweeps (asymspec variants)")
    g.add_argument(
        "--lam",
        default=None,
        help=f"lambda of the tuned gates, {RANGES['lam'].text()}; a comma list sweeps (variants with gate tuned or tuned_kl)",
    )
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"{RANGES['max_new_tokens'].text()} [default: 1024 with --protocol paper, else 512]",
    )
    g.add_argument("--drafter-view", choices=CHOICES["drafter_view"], default=None, help="drafter full-stream view [pipeline default]")
    g.add_argument("--bonus", choices=CHOICES["bonus"], default=None, help="bonus-token rule [pipeline default]")
    g.add_argument(
        "--temperature",
        type=finite_float,
        default=None,
        help=f"sampling temperature, {RANGES['temperature'].text()} [default: 0, greedy]; each request's seed derives from "
        "the sample and the problem, so a rerun draws the same tokens",
    )
    g.add_argument("--top-p", type=finite_float, default=None, help="sampling: top-p (0, 1] [default: 1, off]")
    g.add_argument("--top-k", type=int, default=None, help="sampling: top-k, 0 = off [default: 0]")
    g.add_argument(
        "--samples",
        type=int,
        default=1,
        help="samples per problem and variant (with --temperature > 0): run as variants NAME#s0.., reported as the mean "
        "accuracy over samples with its CI [default: %(default)s]",
    )

    d = m.add_argument_group("data")
    d.add_argument(
        "--protocol",
        choices=["mathvista", "paper"],
        default="mathvista",
        help="mathvista: MathVista's own (official query, 'Image description:' view, its extraction and scores); "
        "paper: the paper's released harness behind Table 3 (raw caption + OCR, step-by-step suffix, regex "
        "extraction and scoring, 1024 new tokens) [default: %(default)s]",
    )
    d.add_argument("--dataset", choices=["mathvista", "minivista"], default="mathvista")
    d.add_argument(
        "--source",
        choices=["auto", "hf", "local"],
        default="auto",
        help="MathVista problems: Hugging Face AI4Math/MathVista (hf), a local copy (local), or local when "
        "--data-dir/--images-dir is given else hf (auto) [default: %(default)s]",
    )
    d.add_argument(
        "--data-dir",
        default=None,
        help="MathVista problems JSON (testmini.json) or the folder holding it; without --text-dir, that folder's "
        "query.json, captions_bard.json, ocrs_easyocr.json too, when it holds them [default: the text folder's testmini.json]",
    )
    d.add_argument("--images-dir", default=None, help="folder holding the images/ referenced by the problems")
    d.add_argument(
        "--text-dir",
        default=None,
        help="folder holding query.json, captions_bard.json, ocrs_easyocr.json (or its texts/) [default: --data-dir's "
        "folder when it holds them, else $ASYMSPEC_MATHVISTA_DIR, else the testmini copy shipped with the package]",
    )
    d.add_argument("--split", default="testmini")
    d.add_argument(
        "--tasks",
        default=None,
        help="comma list of GPS, VQA, FQA, MWP, TQA or 'all' [default: GPS,VQA,FQA for MathVista, all for MiniVista]",
    )
    d.add_argument("--require-caption", action="store_true", help="only problems with a Bard caption (the paper's 587-problem subset)")
    d.add_argument("--limit", type=int, default=None, help="first N problems (by pid) after filtering")
    d.add_argument("--shard", default=None, help="i/n: this process runs every n-th problem starting at i (0-based)")
    d.add_argument("--minivista-n", type=int, default=200, help="MiniVista problems to generate [default: %(default)s]")
    d.add_argument("--seed", type=int, default=0, help="MiniVista seed [default: %(default)s]")
    add_agent_arguments(d)
    d.add_argument(
        "--compressed",
        choices=["official", "auto", "none"],
        default="official",
        help="verifier's view: MathVista's Bard caption + EasyOCR text (official), made by the pipeline (auto), "
        "or nothing (none) [default: %(default)s]",
    )

    r = m.add_argument_group("run")
    r.add_argument("--out", default=DEFAULT_OUT, help="output folder [default: %(default)s]")
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue the records in --out, skipping finished (variant, pid) pairs; refused when the run differs "
        "from the one in --out/run.json (new variants and a changed selection are allowed)",
    )
    r.add_argument("--overwrite", action="store_true", help="discard existing records in --out")
    r.add_argument(
        "--extract",
        choices=["paper", "rules", "rule", "llm", "auto"],
        default=None,
        help="answer extraction: the paper harness' regular expressions and scoring (paper), MathVista's rules "
        "(rules), MathVista's LLM prompt on the pipeline's verifier (llm), or rules then LLM when no anchored answer "
        "(auto); rules/llm/auto score by MathVista's rules [default: paper with --protocol paper, else rules]",
    )
    r.add_argument(
        "--on-error",
        choices=["skip", "raise"],
        default="skip",
        help="a failed generation: log to errors.jsonl and go on (retried by --resume), or stop [default: %(default)s]",
    )
    r.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="problems of one variant decoded together (records identical to --batch-size 1) [default: %(default)s]",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--no-chart", action="store_true", help="skip accuracy.png")
    r.add_argument("--dry-run", action="store_true", help="print the selection and variants; load no model")
    r.add_argument(
        "--dump-prompts",
        default=None,
        metavar="FILE",
        help="write each selected problem's prompt texts under --protocol as JSON lines and exit; loads no model "
        "(only the verifier's tokenizer, for its chat template)",
    )

    add_model_args(m)
    return m


def _sweep_list(option: str, spec: str | None, cast: Callable[[str], Any]) -> list[Any] | None:
    """The values of a sweep option (``--k 2,4``); a bad item, NaN and inf included, or one out of the option's
    range (:data:`~asymspec_mm.base.config.RANGES`) is a one-line error."""
    try:
        values = parse_list(spec, cast)
    except argparse.ArgumentTypeError as exc:  # finite_float's refusal
        raise UnknownOptionError(f"--{option} {spec!r}: {exc}") from None
    except UnknownOptionError as exc:
        raise UnknownOptionError(f"--{option}: {exc}") from None
    for value in values or ():
        check_option_ranges({option: value})
    return values


def _sampling_options(args: argparse.Namespace, common: dict[str, Any]) -> bool:
    """Put ``--temperature`` / ``--top-p`` / ``--top-k`` into ``common`` (checked); whether the run samples."""
    for name in ("temperature", "top_p", "top_k"):
        if getattr(args, name) is not None:
            check_option_ranges({name: getattr(args, name)})
            common[name] = getattr(args, name)
    AsymSpecConfig(**common).validated()
    sampling = bool(common.get("temperature"))
    if isinstance(args.samples, bool) or args.samples < 1:
        raise AsymSpecError(f"--samples {args.samples} must be 1 or more")
    if args.samples > 1 and not sampling:
        raise AsymSpecError(f"--samples {args.samples} needs --temperature > 0: greedy decoding answers the same every time")
    return sampling


def pipeline_llm(pipe: Any) -> Any:
    """A text-completion callable of the pipeline (its verifier) for LLM answer extraction."""
    for name in ("complete", "verifier_complete", "complete_text"):
        fn = getattr(pipe, name, None)
        if callable(fn):
            return fn
    raise UnknownOptionError("this pipeline offers no text completion (complete(prompt) -> str); use --extract rules")


def _identity_and_pipeline(args: argparse.Namespace, records_path: Path, **run: Any) -> tuple[dict[str, Any], Any]:
    """The run's identity (:mod:`.mathvista.identity`) and its pipeline; a ``--resume`` of other records is
    refused before any model loads (models named by hub id alone, not yet downloaded, are checked after)."""
    from ..frontend.identity import checkpoint_identity, models_identity
    from . import mathvista as mv
    from .mathvista.identity import check_resume, eval_identity

    started = records_path.is_file() and records_path.stat().st_size > 0
    if started and not (args.resume or args.overwrite):
        raise FileExistsError(f"{records_path} already holds results: pass --resume to continue it or --overwrite to start over")
    models, preset_name = models_identity(args.preset, args.drafter, args.verifier, args.device, args.dtype)
    if getattr(args, "sd_drafter", None) and any(v.method == "sd" for v in run["variants"]):  # other SD tokens
        models["sd_drafter"] = checkpoint_identity(args.sd_drafter)
    identity = eval_identity(args, models=models, **run)
    pending = any(isinstance(m, dict) and "files" not in m for m in models.values())
    if args.resume and started:
        check_resume(records_path, identity, ignore=("models",) if pending else ())
    pipe = pipeline_from_args(
        argparse.Namespace(**{**vars(args), "preset": preset_name or args.preset}), prompt_style=mv.style_for(args.protocol)
    )
    if not pipe.models.reads_images:  # every MathVista / MiniVista problem (the agent family's too) has an image
        from ..engines.text_processor import image_refusal

        raise AsymSpecError(
            f"eval mathvista asks about images: {image_refusal(str(getattr(pipe.drafter, 'name_or_path', '') or 'a text model'))}"
        )
    if pending:  # downloaded by the load: now named by revision and file hashes
        sd = {"sd_drafter": checkpoint_identity(args.sd_drafter)} if "sd_drafter" in models else {}
        identity["models"] = models_identity(preset_name, args.drafter, args.verifier, args.device, args.dtype)[0] | sd
    return identity, pipe


def cmd_mathvista(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise AsymSpecError(f"--batch-size {args.batch_size}: give 1 (one problem at a time) or more")
    from . import mathvista as mv

    families = minivista_families(args.families, args.dataset, shard=args.shard, dump_prompts=args.dump_prompts)
    tasks_spec = args.tasks
    if tasks_spec is None and args.dataset == "mathvista":
        tasks_spec = ",".join(mv.DEFAULT_TASKS)
    tasks = mv.resolve_tasks(tasks_spec)
    shard = mv.parse_shard(args.shard)
    text_dir = mv.text_dir_for(args.text_dir, args.data_dir)
    text = mv.TextData.load(text_dir) if args.dataset == "mathvista" else None
    source = args.source
    if args.dump_prompts and source == "auto" and args.data_dir is None and args.images_dir is None:
        source = "local"  # prompts need no images: the problems of the text folder
    if args.dataset == "mathvista":
        problems = mv.load_problems(source, data_dir=args.data_dir, images_dir=args.images_dir, text_dir=text_dir, split=args.split)
    else:
        problems = mv.load_minivista_problems(args.minivista_n, args.seed, families)
    if args.require_caption and text is not None and not text.captions:
        raise AsymSpecError(f"--require-caption needs captions_bard.json, which {text.source} (nor its texts/) does not hold: {mv.WHERE}")
    selected = mv.select_problems(problems, tasks=tasks, require_caption=args.require_caption, text=text, limit=args.limit, shard=shard)
    if args.extract is None:
        args.extract = "paper" if args.protocol == "paper" else "rules"
    args.extract = "rules" if args.extract == "rule" else args.extract
    if args.max_new_tokens is None:
        args.max_new_tokens = 1024 if args.protocol == "paper" else 512
    check_option_ranges({"max_new_tokens": args.max_new_tokens})
    if args.dump_prompts:
        return _dump_prompts(args, selected, text)
    common: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.drafter_view:
        common["drafter_view"] = args.drafter_view
    if args.bonus:
        common["bonus"] = args.bonus
    sampling = _sampling_options(args, common)
    variants = mv.build_variants(
        args.methods,
        k=_sweep_list("k", args.k, int),
        beta=_sweep_list("beta", args.beta, finite_float),
        gamma=_sweep_list("gamma", args.gamma, finite_float),
        lam=_sweep_list("lam", args.lam, finite_float),
        common=common,
    )
    variants = sample_variants(variants, args.samples, sampling)
    if families == ["agent-log"]:
        from .log_eval import log_command

        return log_command(args, problems, selected, variants, _identity_and_pipeline)
    if families == ["agent"]:
        from .agent_eval import agent_command

        return agent_command(args, problems, selected, variants, _identity_and_pipeline)
    out_dir = Path(args.out)
    records_path = out_dir / mv.records_filename(shard)
    print(
        f"{len(selected)} problems ({args.dataset}, tasks={tasks_spec or 'all'}, require_caption={args.require_caption}"
        f"{', shard ' + args.shard if shard else ''}) x {len(variants)} variants: {', '.join(v.name for v in variants)}"
    )
    if args.dry_run:
        return 0
    if not selected:
        raise AsymSpecError("no problems selected: check --tasks/--require-caption/--limit/--shard")
    mv.check_images(selected)
    if args.dataset == "minivista":  # generated in memory: the output JSON's images/<pid>.png are written here
        mv.write_problem_images(selected, out_dir)
    identity, pipe = _identity_and_pipeline(args, records_path, problems=problems, variants=variants, text=text, tasks=tasks)
    llm = pipeline_llm(pipe) if args.extract in ("llm", "auto") else None
    summary = mv.run_mathvista(
        pipe,
        selected,
        variants,
        records_path,
        text=text,
        compressed=args.compressed,
        resume=args.resume,
        overwrite=args.overwrite,
        llm=llm,
        extract_mode=args.extract,
        on_error=args.on_error,
        progress=not args.no_progress,
        batch_size=args.batch_size,
        dataset=args.dataset,
        identity=identity,
        protocol=args.protocol,
    )
    print(f"{summary.new} new records, {summary.skipped} already done, {len(summary.errors)} failed -> {records_path}")
    if shard is not None:
        # a shard writes only its records; `eval merge` combines the shards and writes outputs
        print(f"shard {args.shard} done; when all shards are done: asymspec-mm eval merge {out_dir} --out {out_dir}")
        return 0
    result = mv.finalize_run(summary.records, out_dir, variant_order=[v.name for v in variants], chart=not args.no_chart)
    print((out_dir / "report.md").read_text(encoding="utf-8"))
    if summary.errors:
        print(
            f"warning: {len(summary.errors)} generations failed (see {records_path.with_name('errors.jsonl')}); "
            "rerun with --resume to retry them",
            file=sys.stderr,
        )
    return 0 if result else 1


def _dump_prompts(args: argparse.Namespace, selected: list, text: Any) -> int:
    """``--dump-prompts FILE``: the selected problems' prompt texts and token lengths, no model loaded (with
    ``--drafter DIR``, its processor files count the full view's tokens, the image's from its recorded size)."""
    from . import mathvista as mv

    tokenizer = mv.load_verifier_tokenizer(args.preset, args.verifier)
    rows = mv.prompt_rows(
        selected,
        tokenizer,
        protocol=args.protocol,
        compressed=args.compressed,
        text=text,
        drafter_view=args.drafter_view or "image+text",
        dataset=args.dataset,
    )
    from .mathvista.prompt_lengths import DrafterCounter, add_lengths, length_summary

    rows = list(rows)
    counter = None
    if args.drafter:
        try:
            counter = DrafterCounter(args.drafter)
        except (OSError, ValueError) as exc:  # a hub id not in the cache, a missing folder: the texts still dump
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"note: drafter full-view lengths not counted: cannot read {args.drafter}'s processor files ({why})", file=sys.stderr)
    add_lengths(rows, selected, tokenizer, counter)
    n = mv.write_prompt_rows(rows, args.dump_prompts)
    print(f"{n} prompts ({args.protocol} protocol) -> {args.dump_prompts}")
    print(length_summary(rows))
    return 0
