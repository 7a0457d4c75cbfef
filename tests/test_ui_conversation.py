"""Follow-up questions in the steering inspector: a session's conversation about its image, each turn with its
provenance and its cached tokens; a new image or Clear starts a new conversation. Real forwards on the tiny random
pair, through DemoApp directly and through gradio_client."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import make_case, saved_case  # noqa: E402
from test_ui import RUN_DEFAULTS, check_spans_match, demo_args, reference, run_args  # noqa: E402

from ui.app import outputs_as_dict  # noqa: E402
from ui.conversation import CONVERSATION_NOTE, Conversations, Turn, cached_line, render_conversation_html  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*")  # inside gradio

#: The config fields the demo passes to the pipeline, from its settings.
CONFIG_FIELDS = ("k", "beta", "gamma", "gate", "delta", "bonus", "max_new_tokens", "drafter_view")
FOLLOW_UP = "Which bar is the largest?"


def user(question: str, image=None) -> dict:
    content = ([{"type": "image", "image": image}] if image is not None else []) + [{"type": "text", "text": question}]
    return {"role": "user", "content": content}


def chat_reference(pipe, messages, case, method="asymspec", **kw):
    """``pipe.chat`` of ``messages`` with the caption, OCR text and settings the demo sends for ``case``."""
    o = {**RUN_DEFAULTS, **kw}
    return pipe.chat(messages, caption=case["caption"], ocr=case["ocr"] or False, method=method, **{f: o[f] for f in CONFIG_FIELDS})


def last(outputs) -> dict:
    return outputs_as_dict(list(outputs)[-1])


def turns_of(html_text: str) -> list[str]:
    """The conversation's turns, each as its HTML."""
    return re.split(r'(?=<div class="asym-turn" )', html_text)[1:]


def turn_count(html_text: str) -> int:
    return int(re.search(r'class="asym-conversation" data-turns="(\d+)"', html_text).group(1))


@pytest.fixture
def image_case(tmp_path):
    return saved_case(tmp_path, 70, "conversation.png")


def test_a_follow_up_answers_the_conversation_with_its_cached_tokens(tiny_pipe, state, image_case):
    path, case = image_case
    first = last(state.run(*demo_args(path, case), session="a"))
    assert 'data-status="ok"' in first["status"]
    opening = reference(tiny_pipe, path, case["question"], case["caption"], case["ocr"])
    assert first["result_json"]["main"]["token_ids"] == opening.token_ids
    assert turn_count(first["conversation_html"]) == 1 and case["question"] in first["conversation_html"]

    outs = [outputs_as_dict(o) for o in state.run(*demo_args(path, {**case, "question": FOLLOW_UP}), True, session="a")]
    second = outs[-1]
    assert 'data-status="ok"' in second["status"], second["status"]
    # the first update shows the conversation the run follows; streamed updates leave it alone
    assert turn_count(outs[0]["conversation_html"]) == 1
    assert all(not isinstance(o["conversation_html"], str) for o in outs[1:-1])

    messages = [user(case["question"], case["pil"]), {"role": "assistant", "content": first["answer_text"]}, user(FOLLOW_UP)]
    want = chat_reference(tiny_pipe, messages, case)
    main = second["result_json"]["main"]
    assert main["token_ids"] == want.token_ids and second["answer_text"] == want.text
    check_spans_match(second["answer_html"], want.trace)
    cached = main["stats"]["cached_tokens"]
    assert cached["verifier"] > 0, cached
    floor = chat_reference(tiny_pipe, messages, case, method="floor")
    assert second["result_json"]["floor"]["token_ids"] == floor.token_ids
    check_spans_match(second["floor_html"], floor.trace)
    drafter = chat_reference(tiny_pipe, messages, case, method="drafter")
    assert second["result_json"]["drafter"]["token_ids"] == drafter.token_ids

    # the conversation: both questions, each answer with its provenance, and the tokens each turn reused
    html_text = second["conversation_html"]
    assert turn_count(html_text) == 2 and CONVERSATION_NOTE in html_text
    one, two = turns_of(html_text)
    assert case["question"] in one and FOLLOW_UP in two
    check_spans_match(one, opening.trace)
    check_spans_match(two, want.trace)
    verifier_len = len(want.prompts.verifier_ids[0])
    assert f"reused {cached['verifier']} of {verifier_len} verifier prompt tokens" in two
    full_len = len(want.prompts.drafter_full_ids[0])
    assert f"drafter full view {cached['drafter_full']} of {full_len}" in two
    # a third turn follows both
    third = last(state.run(*demo_args(path, {**case, "question": "Why?"}), True, session="a"))
    messages += [{"role": "assistant", "content": second["answer_text"]}, user("Why?")]
    assert third["result_json"]["main"]["token_ids"] == chat_reference(tiny_pipe, messages, case).token_ids
    assert turn_count(third["conversation_html"]) == 3


def test_without_follow_up_a_run_answers_as_today_and_starts_a_new_conversation(tiny_pipe, state, image_case):
    path, case = image_case
    last(state.run(*demo_args(path, case), session="b"))
    out = last(state.run(*demo_args(path, {**case, "question": FOLLOW_UP}), False, session="b"))
    want = reference(tiny_pipe, path, FOLLOW_UP, case["caption"], case["ocr"])
    assert out["result_json"]["main"]["token_ids"] == want.token_ids
    assert (
        out["result_json"]["floor"]["token_ids"] == reference(tiny_pipe, path, FOLLOW_UP, case["caption"], case["ocr"], "floor").token_ids
    )
    assert turn_count(out["conversation_html"]) == 1 and FOLLOW_UP in out["conversation_html"]
    assert case["question"] not in out["conversation_html"]
    assert [t.question for t in state.conversations.turns("b")] == [FOLLOW_UP]


def test_a_new_image_or_clear_starts_a_new_conversation(tiny_pipe, state, image_case, tmp_path):
    path, case = image_case
    as_first_turn = reference(tiny_pipe, path, FOLLOW_UP, case["caption"], case["ocr"]).token_ids
    follow_up = {**case, "question": FOLLOW_UP}
    last(state.run(*demo_args(path, case), session="c"))
    state.image_changed(case["caption"], case["ocr"], "c")  # the page's image.change (the same file again, here)
    assert state.conversations.turns("c") == ()
    out = last(state.run(*demo_args(path, follow_up), True, session="c"))
    assert out["result_json"]["main"]["token_ids"] == as_first_turn and turn_count(out["conversation_html"]) == 1

    html_text = state.clear_conversation("c")
    assert turn_count(html_text) == 0 and "No conversation yet" in html_text and CONVERSATION_NOTE in html_text
    out = last(state.run(*demo_args(path, follow_up), True, session="c"))
    assert out["result_json"]["main"]["token_ids"] == as_first_turn and turn_count(out["conversation_html"]) == 1

    # another image, sent without the page's image.change (an API caller): a first turn about it
    other = make_case(71)
    other_path = tmp_path / "other.png"
    other["image"].save(other_path)
    out = last(state.run(*demo_args(other_path, {**other, "question": FOLLOW_UP}), True, session="c"))
    want = reference(tiny_pipe, other_path, FOLLOW_UP, other["caption"], other["ocr"])
    assert out["result_json"]["main"]["token_ids"] == want.token_ids and turn_count(out["conversation_html"]) == 1

    state.forget("c")  # the page went away
    assert state.conversations.turns("c") == ()


@pytest.mark.parametrize("event", ["upload", "example"])
def test_an_event_that_arrives_after_the_run_began_on_its_picture_keeps_the_runs_turn(tiny_pipe, state, image_case, event, tmp_path):
    """Run pressed right after an upload (or an example's click): the run can begin on the picture before the page's
    image.change (or the click's example_loaded) reaches the server. That late event leaves the run's turn, its
    panels and the fields alone, and the follow-up answers the conversation. Once no run goes, the upload of that
    picture still changes nothing (the tiny pair's run can end before the event arrives), while a click on the
    example starts a new conversation; another picture ends it."""
    from PIL import Image

    path, case = image_case

    def late_event(session: str) -> list:
        """The event's updates: the image box's and the run outputs' (an upload), or the fields' and the
        conversation's (an example)."""
        if event == "upload":
            return list(state.new_image({"path": str(path)}, case["caption"], case["ocr"], session))
        return list(state.example_chosen({"path": str(path)}, case["caption"], case["ocr"], session))

    run = state.run(*demo_args(path, case), session="late")
    outs = [outputs_as_dict(next(run))]  # the run has begun (its conversation is about this picture)
    assert state.busy("late")
    updates = late_event("late")
    left_alone = updates if event == "upload" else updates[-1:]  # an example's own text is still marked as its
    assert all(u == {"__type__": "update"} for u in left_alone), left_alone  # gr.skip(): left as the run shows it
    outs += [outputs_as_dict(o) for o in run]
    first = outs[-1]
    assert [t.question for t in state.conversations.turns("late")] == [case["question"]]
    out = last(state.run(*demo_args(path, {**case, "question": FOLLOW_UP}), True, session="late"))
    messages = [user(case["question"], case["pil"]), {"role": "assistant", "content": first["answer_text"]}, user(FOLLOW_UP)]
    assert out["result_json"]["main"]["token_ids"] == chat_reference(tiny_pipe, messages, case).token_ids
    assert turn_count(out["conversation_html"]) == 2

    assert not state.busy("late")
    updates = late_event("late")
    if event == "upload":  # the conversation's own picture: nothing changes; another one ends it
        assert all(u == {"__type__": "update"} for u in updates) and len(state.conversations.turns("late")) == 2
        other = tmp_path / "other.png"
        Image.open(path).convert("RGB").rotate(90).save(other)
        updates = [None, *state.new_image({"path": str(other)}, case["caption"], case["ocr"], "late")[1:]]
    shown = outputs_as_dict(updates[1:])["conversation_html"] if event == "upload" else updates[-1]
    assert state.conversations.turns("late") == () and turn_count(shown["value"] if isinstance(shown, dict) else shown) == 0


def test_two_sessions_keep_their_own_conversations(tiny_pipe, state, image_case):
    path, case = image_case
    first = last(state.run(*demo_args(path, case), session="one"))
    follow_up = {**case, "question": FOLLOW_UP}
    other = last(state.run(*demo_args(path, follow_up), True, session="two"))  # nothing to follow in its own session
    assert other["result_json"]["main"]["token_ids"] == reference(tiny_pipe, path, FOLLOW_UP, case["caption"], case["ocr"]).token_ids
    assert turn_count(other["conversation_html"]) == 1 and case["question"] not in other["conversation_html"]
    state.clear_conversation("two")
    assert [t.question for t in state.conversations.turns("one")] == [case["question"]]
    out = last(state.run(*demo_args(path, follow_up), True, session="one"))
    messages = [user(case["question"], case["pil"]), {"role": "assistant", "content": first["answer_text"]}, user(FOLLOW_UP)]
    assert out["result_json"]["main"]["token_ids"] == chat_reference(tiny_pipe, messages, case).token_ids
    assert turn_count(out["conversation_html"]) == 2 and state.conversations.turns("two") == ()


def test_a_turn_is_recorded_only_into_the_conversation_it_followed():
    from PIL import Image

    image = Image.new("RGB", (8, 8), (1, 2, 3))
    store = Conversations()
    turn = Turn("q?", "a", (), "asymspec", {"verifier": 3, "drafter_full": 1}, {"verifier": 9, "drafter_full": 20})
    assert cached_line(turn) == "reused 3 of 9 verifier prompt tokens; drafter full view 1 of 20"
    assert cached_line(Turn("q?", "a", (), "drafter", {"drafter_full": 4}, {})) == "reused 4 drafter full view prompt tokens"
    start = store.begin("s", image, followup=True)  # nothing to follow: a new conversation
    assert start.turns == () and start.messages(image, "q?") is None
    assert store.record(start, turn) and store.turns("s") == (turn,)
    a, b = store.begin("s", image, followup=True), store.begin("s", image, followup=True)  # two follow-ups at once
    assert a.messages(image, "next?")[-1] == user("next?") and len(a.messages(image, "next?")) == 3
    assert store.record(a, turn) and not store.record(b, turn)  # b did not see a's turn
    cleared = store.begin("s", image, followup=True)
    store.clear("s")
    assert not store.record(cleared, turn) and store.turns("s") == ()
    assert store.begin(None, image, followup=True).turns == () and not store.record(store.begin(None, image, True), turn)
    html_text = render_conversation_html([turn, turn])
    assert turn_count(html_text) == 2 and len(turns_of(html_text)) == 2 and "Question 2" in html_text
    assert "<script>" not in render_conversation_html([Turn("<script>x</script>", "", (), "floor")])


# ------------------------------------------------------------------------------------------ through gradio_client


def test_api_follow_up_is_the_last_input(served_demo, tiny_pipe, image_case):
    from gradio_client import Client

    demo, client = served_demo
    path, case = image_case
    first = outputs_as_dict(client.predict(*run_args(path, case["question"], case["caption"], case["ocr"]), api_name="/run"))
    assert turn_count(first["conversation_html"]) == 1  # a caller that does not send follow-up: a first turn
    second = outputs_as_dict(client.predict(*run_args(path, FOLLOW_UP, case["caption"], case["ocr"]), True, api_name="/run"))
    messages = [user(case["question"], case["pil"]), {"role": "assistant", "content": first["answer_text"]}, user(FOLLOW_UP)]
    assert second["result_json"]["main"]["token_ids"] == chat_reference(tiny_pipe, messages, case).token_ids
    assert turn_count(second["conversation_html"]) == 2 and "verifier prompt tokens" in second["conversation_html"]
    # another client is another session: nothing to follow
    alone = outputs_as_dict(
        Client(demo.local_url, verbose=False).predict(*run_args(path, FOLLOW_UP, case["caption"], case["ocr"]), True, api_name="/run")
    )
    assert alone["result_json"]["main"]["token_ids"] == reference(tiny_pipe, path, FOLLOW_UP, case["caption"], case["ocr"]).token_ids
