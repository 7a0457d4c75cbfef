"""Loading helpers of the pipeline: device and dtype, the vocabulary check (one vocabulary, or the map of a cross-family
pair), EOS discovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..base.errors import UnknownOptionError, VocabularyMismatchError
from ..base.vocab_map import VocabMap

BACKENDS = ("transformers", "vllm")
DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "auto": None,
}


def resolve_device(device: str | torch.device | None, dtype: torch.dtype | str | None) -> tuple[torch.device, torch.dtype]:
    """Auto: cuda + bf16 when a GPU is there, else cpu + fp32."""
    try:
        dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    except RuntimeError:
        raise UnknownOptionError(f"device={device!r} is not a torch device: use 'cpu', 'cuda' or 'cuda:N'") from None
    check_device_available(dev)
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise UnknownOptionError(f"dtype={dtype!r} is not valid; choose one of {', '.join(DTYPE_NAMES)}")
        dtype = DTYPE_NAMES[dtype]
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, dtype


def check_checkpoint(ref: str | Path, role: str) -> None:
    """Refuse a checkpoint that cannot load here, before any model is read: a local path that does not exist, or
    (with ``HF_HUB_OFFLINE=1``) a hub id that is not in the local cache. ``role`` names it (``drafter``, ...)."""
    import os

    text = str(ref)
    path = Path(text).expanduser()
    if path.exists():
        return
    looks_local = text.startswith(("/", ".", "~")) or text.count("/") > 1 or os.sep != "/" and os.sep in text
    if looks_local:
        raise UnknownOptionError(
            f"the {role} checkpoint {text!r} does not exist: give an existing folder or a hub id such as Qwen/Qwen3-32B"
        )
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        try:
            from huggingface_hub import snapshot_download

            snapshot_download(text, local_files_only=True)
        except Exception:  # noqa: BLE001 - not in the cache, or not a valid id
            raise UnknownOptionError(
                f"the {role} {text!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1: download it first "
                f"(huggingface-cli download {text}) or give a local folder"
            ) from None


def check_device_available(dev: torch.device) -> None:
    """Refuse a device this machine does not have, before any weights are read."""
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise UnknownOptionError(f"device={str(dev)!r} but {why}: use --device cpu, or leave --device unset to pick one")
        if dev.index is not None and dev.index >= count:
            raise UnknownOptionError(f"device={str(dev)!r} but only {count} CUDA GPU(s) are visible: use cuda:0..cuda:{count - 1}")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UnknownOptionError(f"device={str(dev)!r} but MPS is not available here: use --device cpu")


#: A cross-family pair is refused when the tokens both vocabularies have are fewer than this share of either
#: vocabulary (docs/cross-family.md, "When a pair is refused"); ``from_pretrained(..., min_vocab_overlap=)`` moves it.
MIN_VOCAB_OVERLAP = 0.25


def check_vocabularies(
    drafter_tokenizer,
    verifier_tokenizer,
    drafter_logits: int,
    verifier_logits: int,
    drafter_name: str = "drafter",
    *,
    cross_family: bool = False,
    min_overlap: float = MIN_VOCAB_OVERLAP,
) -> VocabMap | None:
    """``None`` when drafter and verifier share one output vocabulary: the same logit width, the same number of
    tokens, the same added tokens (content and whether each is special) and the same token at every id.

    Otherwise, with ``cross_family`` the map between the two vocabularies (:func:`cross_family_map`: logged, refused
    below ``min_overlap``); without it, :class:`VocabularyMismatchError` naming the first difference (what the SD
    drafter, which must share the verifier's vocabulary, gets). ``drafter_name`` is the model the message names.
    """
    if drafter_logits != verifier_logits:
        why = f"the {drafter_name} has {drafter_logits} output logits and the verifier {verifier_logits}"
        fix = ": AsymSpec needs one shared vocabulary (e.g. Qwen3-VL + Qwen3). Pick a pair from the same tokenizer family."
    else:
        why = vocabulary_difference(drafter_tokenizer, verifier_tokenizer, drafter_name)
        why = why and f"the {drafter_name} and verifier tokenizers differ: {why}"
        fix = ". AsymSpec fuses logits id by id, so both models must use the same tokenizer."
    if why is None:
        return None
    if cross_family:
        return cross_family_map(drafter_tokenizer, verifier_tokenizer, min_overlap)
    raise VocabularyMismatchError(why + fix)


def tokenizer_name(tokenizer: Any) -> str:
    """What a log line or an error calls a tokenizer: its folder or hub id, else its class."""
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def cross_family_map(drafter_tokenizer: Any, verifier_tokenizer: Any, min_overlap: float = MIN_VOCAB_OVERLAP) -> VocabMap:
    """The :class:`~asymspec_mm.base.vocab_map.VocabMap` of a pair of two vocabularies, logged as
    ``vocabulary map <drafter tokenizer> -> <verifier tokenizer>: N shared tokens (x% / y%)``.

    Raises :class:`VocabularyMismatchError` (one line naming both tokenizers and the overlap) when the tokens both have
    are fewer than ``min_overlap`` of either vocabulary."""
    import dataclasses
    import logging

    from ..base.vocab_map import vocab_map

    vmap = vocab_map(drafter_tokenizer, verifier_tokenizer)
    if vmap.same_vocabulary:  # the same tokens with logits of different widths: the map still carries them across
        vmap = dataclasses.replace(vmap, same_vocabulary=False)
    cov = vmap.coverage()
    d_name, v_name = tokenizer_name(drafter_tokenizer), tokenizer_name(verifier_tokenizer)
    overlap = (
        f"{cov['shared_tokens']} tokens in common ({cov['drafter_share']:.1%} of the drafter's {cov['drafter_vocabulary']}, "
        f"{cov['verifier_share']:.1%} of the verifier's {cov['verifier_vocabulary']})"
    )
    if min(cov["drafter_share"], cov["verifier_share"]) < min_overlap:
        raise VocabularyMismatchError(
            f"the drafter tokenizer {d_name!r} and the verifier tokenizer {v_name!r} have {overlap}, under the "
            f"{min_overlap:.0%} of each vocabulary a cross-family pair needs to steer: pick a pair whose vocabularies "
            "overlap more, or pass min_vocab_overlap= to load it anyway"
        )
    logging.getLogger("asymspec_mm").info(
        "vocabulary map %s -> %s: %d shared tokens (%.1f%% / %.1f%%)",
        d_name,
        v_name,
        cov["shared_tokens"],
        100 * cov["drafter_share"],
        100 * cov["verifier_share"],
    )
    return vmap


def cross_family_eos(vmap: VocabMap, drafter_eos: set[int], verifier_eos: set[int]) -> set[int]:
    """The ids that end a cross-family pair's answer, in the verifier's ids (the loop's): the verifier's own, and each
    of the drafter's that has a verifier id."""
    mapped = {vmap.to_verifier[d] for d in drafter_eos if 0 <= d < len(vmap.to_verifier)}
    return set(verifier_eos) | {v for v in mapped if v >= 0}


def vocabulary_difference(drafter_tokenizer, verifier_tokenizer, drafter_name: str = "drafter") -> str | None:
    """The first way two tokenizers differ (size, added tokens, then the token at each id), or ``None``."""
    d_added = {i: (t.content, bool(t.special)) for i, t in drafter_tokenizer.added_tokens_decoder.items()}
    v_added = {i: (t.content, bool(t.special)) for i, t in verifier_tokenizer.added_tokens_decoder.items()}
    show = lambda t: "absent" if t is None else f"{t[0]!r} ({'special' if t[1] else 'not special'})"  # noqa: E731
    for i in sorted(set(d_added) | set(v_added)):
        if d_added.get(i) != v_added.get(i):
            return f"added token id {i}: {drafter_name} {show(d_added.get(i))} vs verifier {show(v_added.get(i))}"
    n_d, n_v = len(drafter_tokenizer), len(verifier_tokenizer)
    n = min(n_d, n_v)
    d_tokens = drafter_tokenizer.convert_ids_to_tokens(list(range(n)))
    v_tokens = verifier_tokenizer.convert_ids_to_tokens(list(range(n)))
    bad = [i for i, (x, y) in enumerate(zip(d_tokens, v_tokens)) if x != y]
    if bad:
        shown = ", ".join(f"id {i}: {drafter_name} {d_tokens[i]!r} vs verifier {v_tokens[i]!r}" for i in bad[:5])
        return f"{len(bad)} of {n} shared ids hold different tokens (first: {shown})"
    if n_d != n_v:
        longer, name = (drafter_tokenizer, drafter_name) if n_d > n_v else (verifier_tokenizer, "verifier")
        return f"the {drafter_name} has {n_d} tokens and the verifier {n_v} (id {n}, {longer.convert_ids_to_tokens(n)!r}, only in the {name}'s)"
    return None


def load_sd_drafter(
    name: str | Path, dtype: torch.dtype, device: torch.device, device_map: Any, trust_remote_code: bool, extra: dict
) -> tuple[Any, Any]:
    """The SD baseline's separate text drafter (any causal LM sharing the verifier's vocabulary) and its
    tokenizer, loaded as the drafter is (dtype; ``device_map`` or else ``device``). A checkpoint that is not a
    causal LM, or is missing, is one :class:`UnknownOptionError` line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(name), trust_remote_code=trust_remote_code, **extra)
        model = AutoModelForCausalLM.from_pretrained(str(name), **load_kwargs(dtype, device_map, trust_remote_code), **extra)
    except (OSError, ValueError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UnknownOptionError(
            f"sd_drafter={str(name)!r} could not be loaded as a text causal LM ({first}); give a hub id or local "
            "directory of one that shares the verifier's vocabulary, e.g. Qwen/Qwen3-1.7B"
        ) from None
    if device_map is None:
        model.to(device)
    return model.eval(), tok


def checkpoint_reads_images(ref: str | Path, trust_remote_code: bool, extra: dict) -> bool:
    """Whether the checkpoint at ``ref`` is a vision-language model (its config has a ``vision_config``, as
    Qwen3-VL's does) rather than a text causal LM (Qwen3-4B's has none), read from its config alone."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(ref), trust_remote_code=trust_remote_code, **extra)
    return hasattr(cfg, "vision_config")


def load_kwargs(dtype: torch.dtype, device_map: Any, trust_remote_code: bool) -> dict:
    """Keyword arguments of a transformers ``from_pretrained``."""
    kw: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if device_map is not None:
        kw["device_map"] = device_map
    return kw


def check_backends(
    verifier_backend: str, drafter_backend: str, verifier_device_map: Any, vllm_kwargs: dict | None, drafter_vllm_kwargs: dict | None
) -> None:
    """Refuse backend options that do not fit together, naming the fix."""
    for opt, value in (("verifier_backend", verifier_backend), ("drafter_backend", drafter_backend)):
        if value not in BACKENDS:
            raise UnknownOptionError(f"{opt}={value!r} is not valid; choose one of {', '.join(BACKENDS)}")
    if verifier_backend == "vllm" and verifier_device_map is not None:
        raise UnknownOptionError(
            "verifier_device_map applies to the transformers backend; with "
            "verifier_backend='vllm' use vllm_kwargs={'tensor_parallel_size': N}"
        )
    if vllm_kwargs and verifier_backend != "vllm":
        raise UnknownOptionError("vllm_kwargs is set but verifier_backend is not 'vllm'")
    if drafter_vllm_kwargs and drafter_backend != "vllm":
        raise UnknownOptionError("drafter_vllm_kwargs is set but drafter_backend is not 'vllm'")


def eos_ids(tokenizers, models=()) -> set[int]:
    """Every id that ends an answer: the chat end and end-of-text tokens of each tokenizer, its ``eos_token_id``,
    and each model's ``generation_config.eos_token_id`` (an int or a list)."""
    ids: set[int] = set()
    for tok in tokenizers:
        for t in ("<|im_end|>", "<|endoftext|>"):
            i = tok.convert_tokens_to_ids(t)
            if isinstance(i, int) and i >= 0 and i != tok.unk_token_id:
                ids.add(i)
        if tok.eos_token_id is not None:
            ids.add(tok.eos_token_id)
    for model in models:
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids


def load_models(
    drafter: str | Path,
    verifier: str | Path,
    device: str | torch.device | None,
    dtype: torch.dtype | str | None,
    *,
    device_map: Any,
    verifier_device_map: Any,
    trust_remote_code: bool,
    local_files_only: bool | None,
    verifier_backend: str,
    vllm_kwargs: dict | None,
    drafter_backend: str,
    drafter_vllm_kwargs: dict | None,
    sd_drafter: str | Path | None,
) -> dict[str, Any]:
    """Load a pair with ``from_pretrained`` (see :meth:`AsymSpecPipeline.from_pretrained` for the options): the
    keyword arguments of :class:`AsymSpecPipeline` for its models, tokenizers, device and name."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    dev, dt = resolve_device(device, dtype)
    extra = {} if local_files_only is None else {"local_files_only": local_files_only}
    text_only = not checkpoint_reads_images(drafter, trust_remote_code, extra)
    if text_only:  # a text drafter (Qwen3-4B, ...): its tokenizer behind the processor's calls
        from .text_processor import TextProcessor

        processor = TextProcessor(AutoTokenizer.from_pretrained(str(drafter), trust_remote_code=trust_remote_code, **extra), str(drafter))
        d_model = AutoModelForCausalLM.from_pretrained(str(drafter), **load_kwargs(dt, device_map, trust_remote_code), **extra)
    else:
        processor = AutoProcessor.from_pretrained(str(drafter), trust_remote_code=trust_remote_code, **extra)
        d_model = AutoModelForImageTextToText.from_pretrained(str(drafter), **load_kwargs(dt, device_map, trust_remote_code), **extra)
    if device_map is None:
        d_model.to(dev)
    v_tok = AutoTokenizer.from_pretrained(str(verifier), trust_remote_code=trust_remote_code, **extra)
    if verifier_backend == "vllm":
        from .vllm import VLLMModel

        v_kw = {"dtype": dt, **(vllm_kwargs or {})}  # a dtype in vllm_kwargs wins over the pipeline's
        v_model = VLLMModel.from_pretrained(verifier, trust_remote_code=trust_remote_code, **extra, **v_kw)
    else:
        v_model = AutoModelForCausalLM.from_pretrained(str(verifier), **load_kwargs(dt, verifier_device_map, trust_remote_code), **extra)
        if verifier_device_map is None:
            v_model.to(dev)
    comp = None
    if drafter_backend == "vllm":
        from .vllm import VLLMModel

        images = {} if text_only else {"limit_mm_per_prompt": {"image": 1, "video": 0}}
        comp_kw = {"dtype": dt, **images, **(drafter_vllm_kwargs or {})}
        comp = VLLMModel.from_pretrained(drafter, trust_remote_code=trust_remote_code, **extra, **comp_kw)
    full = comp if comp is not None and getattr(comp, "accepts_images", False) else None
    sd_model, sd_tok = (None, None)
    if sd_drafter is not None:
        sd_model, sd_tok = load_sd_drafter(sd_drafter, dt, dev, device_map, trust_remote_code, extra)
    return dict(
        drafter=d_model,
        processor=processor,
        verifier=v_model,
        verifier_tokenizer=v_tok,
        device=dev,
        name=f"{drafter} + {verifier}",
        drafter_comp=comp,
        drafter_full=full,
        sd_drafter=sd_model,
        sd_drafter_tokenizer=sd_tok,
    )
