"""Per-turn compression of the verifier's view (issue #52): the compressors by name and as callables, the settings'
one-line errors naming their field, LLMLingua-2 on a token classifier built here, and online compression through
the tiny pair: the verifier's prompt of turn n+1 starts with turn n's up to the message that has just aged out,
while the drafter's full view reads every message as written."""

from __future__ import annotations

import json

import pytest
import torch

from asymspec_mm.base.errors import UnknownOptionError
from asymspec_mm.request.compression import CompressedTurns, Compression, CompressionError, compress_turns
from asymspec_mm.request.compressors import last_paragraph, signature_of
from asymspec_mm.request.conversation import parse_messages
from asymspec_mm.request.request import Request

LOG = "\n".join(f"row {i}: sensor {i % 7} reading {i * 13 % 97} units status ok" for i in range(30))


def agent_messages(steps: int, rows: int = 30) -> list[dict]:
    """A system prompt, the task, then ``steps`` (tool call, long tool output: the log's first ``rows`` rows)
    pairs: an agent's history."""
    log = "\n".join(LOG.splitlines()[:rows])
    msgs = [
        {"role": "system", "content": "You are an agent. Use the tools to answer."},
        {"role": "user", "content": "Which sensor read 42?"},
    ]
    for s in range(steps):
        call = {"id": f"c{s}", "type": "function", "function": {"name": "read_log", "arguments": {"page": s}}}
        msgs += [{"role": "assistant", "content": f"Reading page {s}.", "tool_calls": [call]}]
        msgs += [{"role": "tool", "tool_call_id": f"c{s}", "content": f"{log}\npage {s}"}]
    return msgs


# ---------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"method": "gzip"}, "compression.method", "is not a compressor"),
        ({"method": "truncate", "rate": 0}, "compression.rate", "(0, 1]"),
        ({"method": "truncate", "rate": 1.5}, "compression.rate", "(0, 1]"),
        ({"method": "truncate", "keep_last_turns": -1}, "compression.keep_last_turns", ">= 0"),
        ({"method": "truncate", "limit": 0}, "compression.limit", ">= 1"),
        ({"method": "truncate", "roles": ["narrator"]}, "compression.roles", "system, user"),
        ({"method": "truncate", "speed": 2}, "compression.speed", "not a compression setting"),
        ({"method": "summary", "summarizer": "critic"}, "compression.summarizer", "a model the pipeline holds (verifier, drafter)"),
        (
            {"method": "llmlingua2", "model": "nobody/no-such-classifier"},
            "compression.model",
            "huggingface-cli download nobody/no-such-classifier",
        ),
        ("truncate,limit", "compression.limit", "key=value"),
        ({"method": ["truncate"]}, "compression.method", "is not a compressor"),
        ({"method": "truncate", "model": ["x"]}, "compression.model", "must be a string"),
        ({"method": "truncate", "summarizer": "abc"}, "compression.summarizer", "or a callable text -> summary"),
        ({"method": "truncate", "unit": ["tokens"]}, "compression.unit", "tokens, chars"),
    ],
)
def test_a_bad_setting_is_a_one_line_error_naming_its_field(value, field, words):
    with pytest.raises(CompressionError) as err:
        Request(messages=[{"role": "user", "content": "hi"}], compression=value).checked()
    assert err.value.param == field and str(err.value).startswith(field) and words in str(err.value)
    assert "\n" not in str(err.value)


def test_the_default_llmlingua2_model_missing_names_it_and_how_to_get_it():
    with pytest.raises(CompressionError) as err:
        Compression.of({"method": "llmlingua2", "rate": 0.3})
    assert "microsoft/llmlingua-2-xlm-roberta-large-meetingbank" in str(err.value)
    assert "huggingface-cli download" in str(err.value) and err.value.param == "compression.model"


def test_compression_needs_a_conversation():
    with pytest.raises(UnknownOptionError, match="needs a conversation"):
        Request(image=object(), question="q", compression="truncate").checked()


def test_the_cli_spec_and_the_json_object_read_the_same():
    a = Compression.of("truncate,limit=200,unit=chars,keep=tail,keep_last_turns=3,roles=tool+user")
    b = Compression.of(
        json.dumps({"method": "truncate", "limit": 200, "unit": "chars", "keep": "tail", "keep_last_turns": 3, "roles": ["tool", "user"]})
    )
    assert a == b == Compression("truncate", limit=200, unit="chars", keep="tail", keep_last_turns=3, roles=("tool", "user"))


# ---------------------------------------------------------------------------------------------- compressors
def _built(method, **kw):
    from asymspec_mm.request.compression import compressor_of

    return compressor_of(Compression(method, **kw).checked(), kw.pop("tokenizer", None))


def test_truncate_by_characters_keeps_the_head_the_tail_or_both():
    text = "abcdefghij" * 3
    assert _built("truncate", limit=4, unit="chars")(text, "tool") == "abcd\n[... 26 characters cut ...]"
    assert _built("truncate", limit=4, unit="chars", keep="tail")(text, "tool") == "[... 26 characters cut ...]\nghij"
    assert _built("truncate", limit=4, unit="chars", keep="both")(text, "tool") == "ab\n[... 26 characters cut ...]\nij"
    assert _built("truncate", limit=40, unit="chars")(text, "tool") == text


def test_truncate_by_tokens_counts_the_verifiers_tokens(tiny):
    from asymspec_mm.request.compression import compressor_of

    tok = tiny.verifier_tokenizer
    ids = tok(LOG, add_special_tokens=False)["input_ids"]
    out = compressor_of(Compression("truncate", limit=25).checked(), tok)(LOG, "tool")
    assert out == tok.decode(ids[:25]) + f"\n[... {len(ids) - 25} tokens cut ...]"


def test_question_only_keeps_the_users_last_paragraph_and_drops_the_rest():
    doc = "A long passage.\n\nAnother one.\n\nWhich year was it?"
    assert _built("question-only")(doc, "user") == "Which year was it?" == last_paragraph(doc)
    assert _built("question-only")(doc, "tool") == ""


def test_signature_reduces_documentation_to_its_signature():
    openai_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
        },
    }
    api_bank = {
        "name": "RecordHealthData",
        "description": "Records data.",
        "input_parameters": {"user_id": {"type": "str"}, "time": {"type": "str"}},
    }
    assert (
        signature_of(json.dumps([openai_tool, api_bank]))
        == "get_weather(city: string, days: integer)\nRecordHealthData(user_id: str, time: str)"
    )
    doc = "Search the web.\n\ndef search(query: str, k: int = 5) -> list:\n    Returns the top k results."
    assert signature_of(doc) == "search(query: str, k: int = 5) -> list"


def test_any_callable_and_summary_are_compressors():
    assert _built(lambda t: t[:3])("abcdef", "tool") == "abc"
    assert _built("summary", summarizer=lambda t: f"{len(t)} chars")("abcdef", "user") == "6 chars"


def test_an_older_message_is_compressed_once_and_the_cache_is_bounded():
    calls = []
    comp = Compression(lambda t: calls.append(t) or t[:5], keep_last_turns=2).checked()
    turns = parse_messages(agent_messages(2))  # 6 messages: the first 4 compressed, the last 2 verbatim
    roomy = CompressedTurns(size=4)
    first, again = compress_turns(turns, comp, cache=roomy), compress_turns(turns, comp, cache=roomy)
    assert first.turns == again.turns and first.compressed_messages == 4
    assert (len(calls), roomy.misses, roomy.hits) == (4, 4, 4)  # each message compressed once
    assert [t.texts for t in first.turns[4:]] == [t.texts for t in turns[4:]]
    assert [t.texts for t in first.turns[:4]] == [[t.texts[0][:5]] for t in turns[:4]]
    tight = CompressedTurns(size=3)  # least recently used out: a scan of 4 through 3 slots never hits
    compress_turns(turns, comp, cache=tight), compress_turns(turns, comp, cache=tight)
    assert (len(tight._items), tight.misses, tight.hits) == (3, 8, 0)


# ---------------------------------------------------------------------------------------------- LLMLingua-2
@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """A small BERT token classifier (random weights, seeded) with a word-piece tokenizer, saved as a checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForTokenClassification, PreTrainedTokenizerFast

    pieces = [
        "row",
        "sensor",
        "reading",
        "units",
        "status",
        "ok",
        "page",
        "read",
        "##ing",
        "##s",
        ":",
        *map(str, range(10)),
        "##0",
        "##1",
        "##2",
        "##3",
    ]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *pieces])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")
    out = tmp_path_factory.mktemp("llmlingua2-tiny")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=2)
    BertForTokenClassification(cfg).eval().save_pretrained(out)
    return str(out)


def _reference_keep(directory: str, words: list[str], rate: float) -> set[int]:
    """The words LLMLingua-2 keeps, computed independently: each word's pieces tokenized alone, one forward over
    [CLS] + pieces + [SEP], label 1's probability averaged per word, the top ``rate`` (ties: earlier first)."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForTokenClassification.from_pretrained(directory).eval()
    spans, ids = [], [tok.cls_token_id]
    for w in words:
        piece_ids = tok.convert_tokens_to_ids(tok.tokenize(w))
        spans.append((len(ids), len(ids) + len(piece_ids)))
        ids += piece_ids
    with torch.no_grad():
        keep = torch.softmax(model(input_ids=torch.tensor([ids + [tok.sep_token_id]])).logits[0], -1)[:, 1]
    probs = [float(keep[a:b].mean()) for a, b in spans]
    order = sorted(range(len(words)), key=lambda i: (-probs[i], i))
    return set(order[: max(1, round(rate * len(words)))])


def test_llmlingua2_keeps_the_top_rate_of_words_as_the_reference_does(classifier_dir):
    from asymspec_mm.request.compression import compressor_of

    text = "\n".join(LOG.splitlines()[:6])
    comp = Compression("llmlingua2", rate=0.3, model=classifier_dir).checked()
    out = compressor_of(comp)(text, "tool")
    lines = [line.split() for line in text.split("\n")]
    words = [w for line in lines for w in line]
    kept = _reference_keep(classifier_dir, words, 0.3)
    expected, i = [], 0
    for line in lines:
        chosen = [w for j, w in enumerate(line, start=i) if j in kept]
        i += len(line)
        if chosen:
            expected.append(" ".join(chosen))
    assert out == "\n".join(expected)
    assert sum(len(line.split()) for line in out.split("\n")) == round(0.3 * len(words))


def test_llmlingua2_reads_a_text_longer_than_its_window(classifier_dir):
    from asymspec_mm.request.llmlingua2 import token_classifier

    words = ("reading sensors " * 400).split()  # 800 words, 1,200 tokens: three windows
    assert len(token_classifier(classifier_dir).word_probs(words)) == 800


# ---------------------------------------------------------------------------------------------- the tiny pair
@pytest.fixture(scope="module")
def tiny():
    from asymspec_mm import AsymSpecPipeline

    return AsymSpecPipeline.from_preset("tiny", ocr="none")


def _ids(pipe, msgs, compression):
    session = pipe.prepare_chat(msgs, compression=compression, max_new_tokens=2, prefill=False)
    return session.prompts.verifier_ids[0].tolist(), session.prompts.drafter_full_ids[0].tolist()


def message_start(ids: list[int], tokenizer, k: int) -> int:
    """Where the ``k``-th message (0-based) starts in a Qwen-template prompt: its ``<|im_start|>`` token."""
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    return [i for i, t in enumerate(ids) if t == start][k]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_turn_n_plus_1_starts_with_turn_n_up_to_the_message_that_aged_out(tiny):
    comp = Compression("truncate", limit=20, keep_last_turns=2)
    tok = tiny.verifier_tokenizer
    for steps in range(1, 4):
        before, after = agent_messages(steps), agent_messages(steps + 1)
        v_n, f_n = _ids(tiny, before, comp)
        v_next, f_next = _ids(tiny, after, comp)
        aged = len(before) - 2  # turn n's first verbatim message: compressed in turn n+1
        boundary = message_start(v_n, tok, aged)
        shared = common_prefix(v_n, v_next)
        print(f"turn {steps}: verifier {len(v_n)} -> {len(v_next)} tokens, shared {shared}, aged-out message at {boundary}")
        assert boundary <= shared < len(v_n)  # the same tokens up to the aged-out message, and it changed
        assert v_next[:boundary] == v_n[:boundary]
        # the drafter's full view reads every message as written: turn n's prompt (less its generation prompt) leads
        gen = len(f_n) - message_start(f_n, tiny.processor.tokenizer, len(before))
        assert f_next[: len(f_n) - gen] == f_n[: len(f_n) - gen]
    full_text = tiny.processor.tokenizer.decode(f_next)
    verifier_text = tok.decode(v_next)
    assert full_text.count(LOG) == len(after) // 2 - 1  # every tool output whole for the drafter
    assert verifier_text.count(LOG) == 1  # the verifier: only the last one (the last two messages) verbatim


def test_without_compression_each_turn_extends_the_last(tiny):
    tok = tiny.verifier_tokenizer
    v_n, _ = _ids(tiny, agent_messages(2), None)
    v_next, _ = _ids(tiny, agent_messages(3), None)
    assert common_prefix(v_n, v_next) >= message_start(v_n, tok, len(agent_messages(2)))


def test_chat_reports_the_compression_ratio_in_verifier_tokens(tiny):
    msgs = agent_messages(3)
    res = tiny.chat(msgs, compression=Compression("truncate", limit=20, keep_last_turns=2), max_new_tokens=2)
    plain, _ = _ids(tiny, msgs, None)
    assert res.stats["prompt_tokens_full"] == len(plain)
    assert res.stats["compression_ratio"] == pytest.approx(len(plain) / res.prompts.verifier_ids.shape[-1])
    assert res.stats["compression_ratio"] > 2 and res.stats["compressed_messages"] == 6 and res.stats["compression_s"] >= 0
    from asymspec_mm.request.compression import compressor_of

    cut = compressor_of(Compression("truncate", limit=20).checked(), tiny.verifier_tokenizer)
    view = res.stats["compressed_view"]
    assert [(v["index"], v["role"]) for v in view] == [(i, m["role"]) for i, m in enumerate(msgs[:6])]
    assert [v["text"] for v in view] == [cut(m["content"], m["role"]) for m in msgs[:6]]
    assert view[3]["text"].endswith("tokens cut ...]") and view[3]["text"] in tiny.verifier_tokenizer.decode(res.prompts.verifier_ids[0])
    print("compression_ratio", res.stats["compression_ratio"])


def test_the_scheduler_takes_compression_too(tiny):
    msgs = agent_messages(2)
    comp = Compression("truncate", limit=20, keep_last_turns=2)
    with tiny.scheduler() as sched:
        res = sched.submit_chat(msgs, compression=comp, max_new_tokens=3).result()
    alone = tiny.chat(msgs, compression=comp, max_new_tokens=3)
    assert res.token_ids == alone.token_ids
    assert res.prompts.verifier_ids.tolist() == alone.prompts.verifier_ids.tolist()


def test_a_batch_takes_compression_per_request_and_names_the_request_in_errors(tiny):
    comp = {"method": "truncate", "limit": 20, "keep_last_turns": 2}
    msgs = agent_messages(2)
    batch = tiny.generate_batch([{"messages": msgs, "compression": comp}, {"messages": msgs}], max_new_tokens=3)
    alone = tiny.chat(msgs, compression=comp, max_new_tokens=3)
    assert batch[0].token_ids == alone.token_ids and batch[0].stats["compression_ratio"] == alone.stats["compression_ratio"] > 1
    assert "compression_ratio" not in batch[1].stats
    with pytest.raises(CompressionError, match=r"^requests\[1\]\.compression\.rate=2 must be"):
        tiny.generate_batch([{"messages": msgs}, {"messages": msgs, "compression": {"method": "truncate", "rate": 2}}])


def test_a_compressor_that_answers_differently_each_call_still_renders_each_message_once(tiny):
    """A summary written by a sampled model differs call by call: the cache makes each message's compressed text the
    one written the first time, so later turns still extend earlier ones."""
    import itertools

    calls = itertools.count()
    comp = Compression(lambda text: f"{text[:12]} (summary {next(calls)})", keep_last_turns=2)
    tok = tiny.verifier_tokenizer
    v_n, _ = _ids(tiny, agent_messages(2), comp)
    v_next, _ = _ids(tiny, agent_messages(3), comp)
    assert common_prefix(v_n, v_next) >= message_start(v_n, tok, len(agent_messages(2)) - 2)
    assert next(calls) == 6  # 4 messages compressed for turn 2, the 2 that aged out for turn 3


READ_LOG = {
    "type": "function",
    "function": {
        "name": "read_log",
        "description": "Reads one page of the plant's sensor log, thirty rows a page, oldest first.",
        "parameters": {
            "type": "object",
            "properties": {"page": {"type": "integer", "description": "the page, from 0"}},
            "required": ["page"],
        },
    },
}


def test_signature_reduces_the_offered_tools_for_the_verifier_only(tiny):
    msgs = agent_messages(1)
    comp = Compression("signature", roles=("tools",))
    session = tiny.prepare_chat(msgs, tools=[READ_LOG], compression=comp, max_new_tokens=2, prefill=False)
    bare = {
        "type": "function",
        "function": {
            "name": "read_log",
            "parameters": {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        },
    }
    expected = tiny.verifier_tokenizer.apply_chat_template(
        msgs, tools=[bare], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert session.prompts.verifier_ids[0].tolist() == tiny.verifier_tokenizer(expected, add_special_tokens=False)["input_ids"]
    full = tiny.processor.tokenizer.decode(session.prompts.drafter_full_ids[0])
    assert "Reads one page of the plant's sensor log" in full and "the page, from 0" in full
    assert session.stats["compression_ratio"] > 1 and session.stats["compressed_messages"] == 0
