"""What a pushed round shows (memci_proxy.recall.resolver with ``newest_first``): pages newest first, but when they do not
all fit, the lowest-ranked go and the best stays; excerpts sized in tokens whatever the script; the best hit shown
longer; a page's hidden recall rounds are not searched (they quote other pages)."""

from __future__ import annotations

import re

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.feedback import add_hidden
from memci_proxy.engine.state import ACTIVE, ARCHIVED, ConversationState, PageRecord
from memci_proxy.recall.reading.pagetext import excerpt
from memci_proxy.recall.resolver import (CALL_EXCERPT_TOKENS, EXCERPT_CHARS, WHOLE_MESSAGE_TOKENS, RecallContext,
                                   RecallResolver)
from memci_proxy.recall.tool.schema import RecallArgs

FILLER = "We talked about the weather and the news, and the garden was green again that day. "


def conversation(facts: dict[int, str], pages: int = 12) -> tuple[ConversationState, list[dict]]:
    messages: list[dict] = []
    records = []
    for n in range(1, pages + 1):
        start = len(messages)
        messages.append({"role": "user", "content": facts.get(n, FILLER * 3)})
        messages.append({"role": "assistant", "content": FILLER * 4})
        status = ACTIVE if n == pages else ARCHIVED
        records.append(PageRecord(number=n, part=1, start=start, end=start + 2, tokens=200, status=status))
    state = ConversationState(pages=records, first_active_page=pages - 1, next_page=pages + 1)
    state.hash_blob = b"\0" * 16 * len(messages)
    state.tokens = [50] * len(messages)
    return state, messages


def shown(text: str) -> list[str]:
    return re.findall(r"\[Page ([0-9.]+)\]", text)


async def test_the_best_hit_stays_when_not_all_fit_and_they_show_newest_first() -> None:
    facts = {2: "My flight to Oslo is SK4711, the flight number I keep forgetting. " + FILLER,
             6: "The Oslo weather was cold. " + FILLER, 9: "Another flight, to Rome, next spring. " + FILLER}
    state, messages = conversation(facts)
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    ranked = [label for label, _ in await resolver.search(ctx, "flight Oslo", 3)]
    assert ranked[0] == "2"
    roomy = await resolver.resolve(ctx, RecallArgs(query="flight Oslo"), limit=2000, newest_first=True,
                                   excerpt_tokens=60, hits_shown=3)
    assert shown(roomy.text) == sorted(ranked, key=int, reverse=True)  # newest first
    tight = await resolver.resolve(ctx, RecallArgs(query="flight Oslo"), limit=90, newest_first=True,
                                   excerpt_tokens=60, hits_shown=3)
    assert shown(tight.text) == ["2"] and "SK4711" in tight.text  # the oldest page is the best: it stays whole


async def test_excerpts_are_sized_in_tokens_and_the_best_hit_shows_its_message_whole() -> None:
    zh = "我的航班号是SK4711，飞往奥斯陆。" + "今天天气很好，我们聊了很多关于花园和新闻的事情。" * 20
    en = "My flight to Oslo is SK4711. " + FILLER * 6
    counter = EstimateCounter()
    for text in (zh, en):
        state, messages = conversation({3: text, 7: text.replace("SK4711", "SK4712")})
        resolver = RecallResolver(None, counter, 4096)
        ctx = RecallContext("t", "c", state, messages)
        out = await resolver.resolve(ctx, RecallArgs(query="航班 SK4711" if text is zh else "flight SK4711"),
                                     limit=4000, newest_first=True, excerpt_tokens=40, hits_shown=2)
        lines = out.text.splitlines()[1:]
        assert len(lines) == 2
        sizes = {shown(line)[0]: counter.count_text(line.split(": ", 1)[1]) for line in lines}
        best = (await resolver.search(ctx, out.text.split("'")[1], 2))[0][0]
        other = next(label for label in sizes if label != best)
        assert 25 <= sizes[other] <= 60, (text[:10], sizes)
        # the best hit: the message that matched, whole (it is under WHOLE_MESSAGE_TOKENS), then the window
        assert 80 <= sizes[best] <= WHOLE_MESSAGE_TOKENS + 20 and text[-20:] in lines[0] + lines[1], (text[:10], sizes)


async def test_a_models_own_call_shows_as_many_tokens_of_each_hit_in_any_script() -> None:
    """A model's own recall call: about ``EXCERPT_CHARS`` characters of an English hit (75 tokens), as many tokens
    of a Chinese one (about 75 characters, not 300: the same room whatever the script)."""
    zh = "我的航班号是SK4711，飞往奥斯陆。" + "今天天气很好，我们聊了很多关于花园和新闻的事情。" * 20
    en = "My flight to Oslo is SK4711. " + FILLER * 6
    counter = EstimateCounter()
    for text, query in ((zh, "航班 SK4711"), (en, "flight SK4711")):
        state, messages = conversation({3: text})
        resolver = RecallResolver(None, counter, 4096)
        out = await resolver.resolve(RecallContext("t", "c", state, messages), RecallArgs(query=query))
        (line,) = [line for line in out.text.splitlines() if line.startswith("[Page 3]")]
        shown_tokens = counter.count_text(line.split(": ", 1)[1])
        # (the characters per token are read from the page's head, here Chinese and English replies: about)
        assert "SK4711" in line and CALL_EXCERPT_TOKENS - 10 <= shown_tokens <= 1.5 * CALL_EXCERPT_TOKENS, \
            (query, shown_tokens)
    assert CALL_EXCERPT_TOKENS * 4 == EXCERPT_CHARS  # English: the characters a call always showed


async def test_a_best_hit_that_does_not_fit_beside_its_header_is_narrowed_not_cut() -> None:
    state, messages = conversation({3: FILLER * 4 + "My flight to Oslo is SK4711, booked for May."})
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    out = await resolver.resolve(ctx, RecallArgs(query="flight Oslo booked May " + "weather news green " * 3),
                                 limit=70, newest_first=True, excerpt_tokens=80, hits_shown=1)
    assert "SK4711" in out.text and "cut to" not in out.text, out.text


async def test_muted_query_terms_weigh_nothing() -> None:
    facts = {3: "My flight to Oslo is SK4711. " + FILLER, 6: "Earlier I told you a flight story, earlier, told. " + FILLER}
    state, messages = conversation(facts)
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    assert (await resolver.search(ctx, "earlier told flight Oslo", 1))[0][0] == "6"
    assert (await resolver.search(ctx, "earlier told flight Oslo", 1, muted=frozenset({"earlier", "told"})))[0][0] == "3"
    assert (await resolver.search(ctx, "earlier told", 1, muted=frozenset({"earlier", "told"})))[0][0] == "6"


async def test_a_page_is_not_found_by_the_recall_rounds_it_holds() -> None:
    state, messages = conversation({4: "The harbour festival starts on Friday. " + FILLER})
    round_ = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "recall", "arguments": '{"query": "festival"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "[Page 4] user: The harbour festival starts on Friday."}]
    state = add_hidden(state, 16, round_, EstimateCounter())  # after page 9's user message
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    assert [label for label, _ in await resolver.search(ctx, "harbour festival", 5)] == ["4"]
    read = await resolver.resolve(ctx, RecallArgs(pages=["9"]))
    assert "harbour festival" in read.text  # reading the page by number still shows its round


def test_the_excerpt_is_where_most_query_terms_meet() -> None:
    text = "alpha once here. " + "filler words " * 40 + "Then gamma, delta and alpha together. " + "tail " * 40
    piece = excerpt(text, ["alpha", "gamma", "delta"], 90)
    assert "gamma, delta and alpha" in piece
    assert excerpt("nothing matches here", ["zzz"], 40) == "nothing matches here"
    assert excerpt(text, ["alpha"], 60).startswith("alpha once")  # a single term: its first place
    page = "user: The parcel to Oslo left on Monday; " + "it holds books and maps, " * 12 + "end. assistant: " + "ok " * 200
    assert excerpt(page, ["parcel"], 80, whole=400).endswith("end.…")  # the message that matched, whole
    assert not excerpt(page, ["parcel"], 80, whole=100).endswith("end.…")  # too long to show whole


def test_the_excerpt_prefers_the_users_own_words_and_rare_terms() -> None:
    page = ("user: I was told a taxi from the airport to my hotel costs 60 dollars. assistant: " + "Sure. " * 40
            + "Options: the airport bus, a taxi, or the train to your hotel. " + "More. " * 40)
    terms = ["bus", "airport", "hotel", "taxi"]
    # the answer holds all four terms, the user's message three: the user's words win
    assert excerpt(page, terms, 120).startswith("user: I was told a taxi")
    assert "airport bus" in excerpt(page.replace("user: ", "assistant: ", 1), terms, 120)  # by count alone
    # a rare term weighs more than common ones: the place of the rare one wins
    text = "the plan and the plan again. " + "x " * 80 + "the plesiosaur was green. " + "y " * 80
    assert "plesiosaur was green" in excerpt(text, ["plan", "plesiosaur"], 60, weights={"plan": 0.5, "plesiosaur": 5})


async def test_hits_below_the_best_are_shown_only_when_allowed() -> None:
    facts = {2: "My flight to Oslo is SK4711. " + FILLER, 5: "The Oslo flight was late. " + FILLER,
             8: "Flight delays in Oslo again. " + FILLER}
    state, messages = conversation(facts)
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    ranked = [label for label, _ in await resolver.search(ctx, "flight Oslo", 5)]
    everything = await resolver.resolve(ctx, RecallArgs(query="flight Oslo"), newest_first=True, excerpt_tokens=40,
                                        hits_shown=3)
    assert sorted(shown(everything.text)) == sorted(ranked[:3])
    allowed = {ranked[2]}
    some = await resolver.resolve(ctx, RecallArgs(query="flight Oslo"), newest_first=True, excerpt_tokens=40,
                                  hits_shown=3, shown_if=allowed.__contains__)
    assert sorted(shown(some.text)) == sorted([ranked[0], ranked[2]])  # the best always, then the allowed ones


def test_an_excerpt_near_the_end_of_a_long_message_ends_with_it() -> None:
    page = ("user: " + "Some context about my week and my plans. " * 12 + "By the way, I ordered the new remote "
            "shutter release on February 5th. assistant: " + "Great to hear about that. " * 30)
    piece = excerpt(page, ["shutter", "februari"], 240)
    assert piece.endswith("February 5th.…")  # the message's end, not the start of the answer
    assert "Great to hear" not in piece and len(piece) > 200


async def test_every_hit_shows_the_message_that_matched_whole_when_it_is_short() -> None:
    # the user's facts: a few sentences each, longer than a hit's excerpt but within twice its size
    fact = ("I've been thinking about my aquarium setup lately. By the way, my old 10-gallon tank has my betta fish, "
            "Bubbles, and the new 20-gallon one has ten neon tetras and five gouramis in it.")
    longer = fact + " " + FILLER * 4
    state, messages = conversation({3: fact, 6: longer.replace("Bubbles", "Pebbles"), 9: fact.replace("ten", "six")})
    counter = EstimateCounter()
    resolver = RecallResolver(None, counter, 4096)
    ctx = RecallContext("t", "c", state, messages)
    out = await resolver.resolve(ctx, RecallArgs(query="aquarium tank fish"), limit=4000, newest_first=True,
                                 excerpt_tokens=30, hits_shown=3)
    lines = {shown(line)[0]: line for line in out.text.splitlines()[1:]}
    assert set(lines) == {"3", "6", "9"}
    assert 30 < counter.count_text(fact) <= 60  # over the excerpt, within twice it
    for label in ("3", "9"):  # whether the best hit or not: whole
        assert fact.replace("ten", "six" if label == "9" else "ten") in lines[label]
    assert "Pebbles" in lines["6"] and FILLER * 4 not in lines["6"]  # too long to show whole: cut around the match


def test_the_best_hit_shows_the_reply_where_the_rare_terms_its_first_window_lacks_are() -> None:
    page = ("user: Please write a children's book about dinosaurs, with an image for each chapter. assistant: "
            + "Once upon a time there were dinosaurs in a green land. " * 8
            + "Chapter 3: The Swimming Plesiosaur. " + "It swam in the warm seas. " * 6
            + "Plesiosaur image: a long-necked Plesiosaur with a blue scaly body glides through the water. "
            + "The end of the story. " * 10)
    terms = ["children", "book", "dinosaur", "plesiosaur", "scaly", "image"]
    weights = {"children": 2.0, "book": 1.5, "dinosaur": 3.0, "plesiosaur": 5.0, "scaly": 4.0, "image": 1.0}
    one = excerpt(page, terms, 150, weights=weights)
    assert one.startswith("user: Please write a children's book") and "blue scaly" not in one
    two = excerpt(page, terms, 150, weights=weights, second=150)
    assert two.startswith(one[:-1]) and " … " in two  # the same first window, then the second one
    assert "Plesiosaur with a blue scaly body" in two  # where the most terms meet, not their first place
    # nothing the first window lacks weighs enough: no second window
    assert excerpt(page, ["children", "book", "end"], 150, weights={"end": 0.2}, second=150) == \
        excerpt(page, ["children", "book", "end"], 150, weights={"end": 0.2})


async def test_each_hit_of_a_pushed_round_shows_the_passage_of_the_reply_that_holds_the_rare_terms() -> None:
    state, messages = conversation({})
    for page, colour in ((3, "blue"), (8, "green")):
        messages[2 * (page - 1)]["content"] = "Write the chapter about ocean reptiles for my dinosaur book."
        messages[2 * page - 1]["content"] = FILLER * 6 + f"The Plesiosaur had a {colour} scaly body. " + FILLER * 2
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    out = await resolver.resolve(ctx, RecallArgs(query="dinosaur book Plesiosaur scaly"), limit=4000,
                                 newest_first=True, excerpt_tokens=40, hits_shown=2)
    lines = {shown(line)[0]: line for line in out.text.splitlines()[1:]}
    assert set(lines) == {"3", "8"}
    for label, colour in (("3", "blue"), ("8", "green")):  # the best hit and the other: request, then the passage
        assert "ocean reptiles" in lines[label] and f"a {colour} scaly body" in lines[label]
    plain = await resolver.resolve(ctx, RecallArgs(query="dinosaur book Plesiosaur scaly"), limit=4000)
    assert " … " not in plain.text  # a model's own call: one window per hit, as before


async def test_a_question_about_what_the_assistant_said_shows_the_reply_where_the_terms_meet_in_both() -> None:
    state, messages = conversation({})
    messages[4]["content"] = "What eggs and butter do I need for a classic French omelette? " + FILLER * 2
    messages[5]["content"] = FILLER * 6 + "For a classic French omelette: 2-3 eggs, a pinch of salt, butter. " + FILLER
    resolver = RecallResolver(None, EstimateCounter(), 4096)
    ctx = RecallContext("t", "c", state, messages)
    query = RecallArgs(query="classic French omelette eggs")
    mine = await resolver.resolve(ctx, query, limit=4000, newest_first=True, excerpt_tokens=20, hits_shown=1)
    assert "What eggs and butter" in mine.text and "2-3 eggs" not in mine.text  # the user's words first
    said = await resolver.resolve(ctx, query, limit=4000, newest_first=True, excerpt_tokens=20, hits_shown=1,
                                  reply_first=True)
    assert "2-3 eggs" in said.text and "What eggs and butter" not in said.text  # the reply's
