"""Proactive recall end to end (openai SDK -> proxy -> emulator whose model never calls tools on its own): a fact
from turn 3, asked in plain words at turn 100, reaches the upstream prompt of that turn, streaming and not; the next
turn keeps at least 0.96 of its prompt cached, since the pushed round stays in the history byte for byte; twenty
everyday questions (ten English, ten Chinese, no "remind me") about facts said about a hundred turns earlier."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

FACTS = {
    3: "My sister's wedding will be in Porto, at the Quinta da Aveleda estate.",
    4: "Our new puppy is a border collie named Pistachio.",
}


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(8192, env={"MEMCI_ADMIN_KEY": "admin-push"})


def ask(client, messages, text, stream=False):
    messages.append({"role": "user", "content": text})
    if stream:
        chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=200, stream=True,
                                                     stream_options={"include_usage": True}))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        messages.append({"role": "assistant", "content": content})
        return None
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=200)
    r = raw.parse()
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    return raw.headers


def chat_until_the_next_epoch(client, messages, headers, turn: int) -> None:
    """Chit-chat up to the turn on which more pages leave the prompt: the turns after it have room for a round."""
    archived = int(headers["x-memci-pages-archived"])
    while int(headers["x-memci-pages-archived"]) == archived:
        headers = ask(client, messages, f"Chit-chat number {turn} about the weather and the news. [[len:80]]")
        turn += 1
        assert turn < 200, "no epoch"


def cached_share(emu) -> float:
    (last,) = emu.requests(1)
    return last["cached_tokens"] / last["prompt_tokens"]


def test_a_fact_from_turn_3_reaches_turn_100_and_the_next_turn_stays_cached(pair):
    emu, proxy = pair.emulator, pair.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-push", max_retries=0, timeout=30)
    messages: list[dict] = []
    for turn in range(1, 100):
        text = FACTS.get(turn, f"Chit-chat number {turn} about the weather and the news.")
        headers = ask(client, messages, text + " [[len:80]]")
    assert int(headers["x-memci-pages-archived"]) >= 4  # turns 3 and 4 have left the prompt
    conversation = headers["x-memci-conversation-id"]

    # turn 100: plain words, no recall marker; the model would not call the tool
    ask(client, messages, "What did I tell you about my sister's wedding?")
    (sent,) = emu.requests(1)
    roles = [m["role"] for m in sent["body"]["messages"][-3:]]
    assert roles == ["user", "assistant", "tool"]
    assert sent["body"]["messages"][-2]["tool_calls"][0]["function"]["name"] == "recall"
    assert "Aveleda" in sent["body"]["messages"][-1]["content"]
    pushed_prompt = sent["body"]["messages"]

    headers = ask(client, messages, "Thanks! Chit-chat about the news again. [[len:80]]")
    assert headers["x-memci-epoch"] == "false"
    (nxt,) = emu.requests(1)
    assert nxt["body"]["messages"][: len(pushed_prompt)] == pushed_prompt
    assert cached_share(emu) >= 0.96

    # streaming, a few turns later
    ask(client, messages, "Remind me, what was the name of our new puppy?", stream=True)
    (sent,) = emu.requests(1)
    assert [m["role"] for m in sent["body"]["messages"][-2:]] == ["assistant", "tool"]
    assert "Pistachio" in sent["body"]["messages"][-1]["content"]
    ask(client, messages, "Lovely. More chit-chat about the weather. [[len:80]]", stream=True)
    assert cached_share(emu) >= 0.96

    # an ordinary question gets no round; a look-up the archive cannot answer neither
    ask(client, messages, "What should I cook tonight? [[len:40]]")
    assert emu.turn_requests(1)[0]["body"]["messages"][-1]["role"] == "user"
    ask(client, messages, "What did I tell you about my trip to Zanzibar?")
    assert emu.turn_requests(1)[0]["body"]["messages"][-1]["role"] == "user"

    view = httpx.get(f"{proxy.url}/memci/conversations/{conversation}/prompt",
                     headers={"Authorization": "Bearer admin-push"}, timeout=10).json()
    assert {"tokens_shed", "tokens_prefilled", "tokens_pushed"} <= set(view["accounting"])
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert 'memci_recall_pushes_total{outcome="pushed"} 2.0' in text
    assert 'memci_recall_pushes_total{outcome="no_match"}' in text  # every user turn is weighed
    client.close()


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_the_push_with_n_2_and_with_client_tools(pair):
    """n > 1: every choice is an ordinary answer. Client tools: a call of the client's own tool that the model makes
    after the pushed round goes back to the client untouched, and the client's result follows the round upstream.
    (The emulator's model reads its script from the pushed result: the stated fact carries a get_weather marker,
    inert while no request lists that tool.)"""
    emu, proxy = pair.emulator, pair.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-push-tools", max_retries=0, timeout=30)
    messages: list[dict] = []
    for turn in range(1, 60):
        text = {3: 'Our wedding venue is the Quinta da Aveleda. [[call:get_weather {"city": "Porto"}]]',
                4: FACTS[4]}.get(turn, f"Chit-chat number {turn} about the weather and the news.")
        headers = ask(client, messages, text + " [[len:80]]")
    assert int(headers["x-memci-pages-archived"]) >= 4

    messages.append({"role": "user", "content": "Remind me, what was the name of our new puppy?"})
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=100, n=2)
    assert len(r.choices) == 2 and all(c.message.tool_calls is None for c in r.choices)
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    (sent,) = emu.requests(1)
    assert "Pistachio" in sent["body"]["messages"][-1]["content"] and sent["body"].get("n") == 2

    messages.append({"role": "user", "content": "What did I tell you about the wedding venue?"})
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=100, tools=[WEATHER])
    (sent,) = emu.requests(1)
    assert [m["role"] for m in sent["body"]["messages"][-3:]] == ["user", "assistant", "tool"], [l for l in httpx.get(f"{proxy.url}/metrics").text.splitlines() if ("push" in l or "conversations_total" in l) and not l.startswith("#")]
    assert r.choices[0].message.tool_calls, sent["body"]["messages"][-1]
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C."})
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=100, tools=[WEATHER])
    assert r.choices[0].message.tool_calls is None
    (sent,) = emu.requests(1)
    tail = sent["body"]["messages"][-5:]
    assert [m["role"] for m in tail] == ["user", "assistant", "tool", "assistant", "tool"]
    assert tail[1]["tool_calls"][0]["function"]["name"] == "recall" and "Aveleda" in tail[2]["content"]
    assert tail[3]["tool_calls"][0]["id"] == call.id and tail[4]["content"] == "Sunny, 24 C."
    client.close()


# (fact said early, everyday question asked ~100 turns later, what must reach that question's prompt)
EVERYDAY = [
    ("My gym locker code is PELICAN-8823.", "What's my gym locker code?", "PELICAN-8823"),
    ("I graduated with a degree in marine biology from Dalhousie.", "What degree did I graduate with?",
     "marine biology"),
    ("My daily commute to work takes about 45 minutes by tram.", "How long is my daily commute to work?",
     "45 minutes"),
    ("At the moment I'm reading The Left Hand of Darkness.", "Which book was I reading?", "Left Hand of Darkness"),
    ("My dentist appointment is on March 14th at 9:30.", "When is my dentist appointment?", "March 14th"),
    ("My sister's wedding will be in Porto, at the Quinta da Aveleda estate.",
     "Where is my sister getting married?", "Aveleda"),
    ("Our new puppy is a border collie named Pistachio.", "What's our puppy called again?", "Pistachio"),
    ("My passport number is X4471920.", "Can you tell me my passport number?", "X4471920"),
    ("I left the car at the airport, level 3, spot C-17.", "Where's the car parked?", "C-17"),
    ("My landlord is Mr. Okonkwo; he lives downstairs.", "Who is my landlord?", "Okonkwo"),
    ("我的健身房储物柜密码是鹈鹕5531。", "我的健身房储物柜密码是多少？", "鹈鹕5531"),
    ("我女儿的钢琴老师姓欧阳，每周六上课。", "我女儿的钢琴老师姓什么？", "欧阳"),
    ("我的车牌号是沪A7K392。", "我的车牌号是多少？", "沪A7K392"),
    ("我妈妈的生日是十月十七号。", "我妈妈生日是哪天？", "十月十七号"),
    ("我们的结婚纪念日打算去杭州西湖过。", "结婚纪念日我们打算去哪儿？", "杭州西湖"),
    ("我对花生过敏，吃了会起荨麻疹。", "我对什么东西过敏？", "花生"),
    ("公司年会定在外滩的半岛酒店。", "公司年会在哪个酒店办？", "半岛酒店"),
    ("我养的橘猫叫年糕。", "我家橘猫叫什么名字？", "年糕"),
    ("我的医保卡号是310115198802。", "我的医保卡号是多少？", "310115198802"),
    ("我弟弟在深圳的腾讯做前端工程师。", "我弟弟在哪家公司上班？", "腾讯"),
]


def test_everyday_questions_about_facts_said_a_hundred_turns_earlier_reach_the_prompt(pair):
    emu, proxy = pair.emulator, pair.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-push-everyday", max_retries=0, timeout=30)
    messages: list[dict] = []
    for fact, _, _ in EVERYDAY:
        ask(client, messages, fact + " [[len:30]]")
    for turn in range(100):
        headers = ask(client, messages, f"Chit-chat number {turn} about the weather and the news. [[len:80]]")
    assert int(headers["x-memci-pages-archived"]) > len(EVERYDAY)  # every fact has left the prompt
    reached = []
    for n, (_, question, value) in enumerate(EVERYDAY):
        ask(client, messages, question, stream=n % 2 == 1)
        (sent,) = emu.requests(1)
        reached.append(value in json.dumps(sent["body"]["messages"], ensure_ascii=False))
    assert sum(reached) >= 18, [q for (_, q, _), ok in zip(EVERYDAY, reached) if not ok]
    client.close()


# one page with its request (a sixth of the budget at most), the name past the request's window
ZOMBIE_REPLY = ("Here are some thoughts on your story. " + "A horror story lives on its pacing and its quiet moments. " * 18
                + "For the radiation zombie, I suggest the name Glowfang: the name says it glows, and it bites. "
                + "Keep the dialogue short and the scenes dark. " * 6)


def test_a_count_and_a_question_about_what_the_assistant_said_get_what_they_need(pair):
    """A count ("how many times…") is pushed although the active pages name what it counts, and shows the archived
    sessions; a question about what the assistant said shows the passage of the reply, not the user's request."""
    emu, proxy = pair.emulator, pair.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-push-count", max_retries=0, timeout=30)
    messages: list[dict] = []
    ask(client, messages, "I went on a kayaking trip on the lake with Mira today. [[len:30]]")
    ask(client, messages, "Please suggest a name for the radiation zombie of my horror story. [[len:30]]")
    messages[-1] = {"role": "assistant", "content": ZOMBIE_REPLY}  # what the model said, as the client resends it
    for turn in range(90):
        text = ("Another kayaking trip today, down the river with Jo." if turn == 40
                else f"Chit-chat number {turn} about the weather and the news.")
        headers = ask(client, messages, text + " [[len:80]]")
    assert int(headers["x-memci-pages-archived"]) > 40  # the first two trips and the reply have left the prompt
    chat_until_the_next_epoch(client, messages, headers, 90)  # the rounds have room
    ask(client, messages, "A third kayaking trip this morning, windy but fun. [[len:30]]")

    ask(client, messages, "How many kayaking trips did I take?")
    (sent,) = emu.requests(1)
    assert sent["body"]["messages"][-1]["role"] == "tool"
    pushed = sent["body"]["messages"][-1]["content"]
    assert "Mira" in pushed and "down the river" in pushed

    ask(client, messages, "What name did you suggest for the radiation zombie?", stream=True)
    (sent,) = emu.requests(1)
    assert sent["body"]["messages"][-1]["role"] == "tool"
    assert "Glowfang" in sent["body"]["messages"][-1]["content"]
    client.close()


DECOYS = [
    "Where could I get rare figurines and rare records appraised around here?",
    "Do you think rare figurines or rare records keep their value better?",
    "How should I clean rare figurines and rare records without damaging them?",
    "Is it worth insuring rare figurines and rare records separately?",
    "Which fairs sell rare figurines and rare records at decent prices?",
]


def test_a_count_shows_the_sittings_where_the_user_gave_a_count(pair):
    """A count ("how many rare … do I have?") shows the archived sittings where the user gave a count of what it
    counts ("I have 12 rare figurines"), above the more numerous ones that only name it."""
    emu, proxy = pair.emulator, pair.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-push-counted", max_retries=0, timeout=30)
    messages: list[dict] = []
    said = {5: "By the way, I have 12 rare figurines in my collection.",
            65: "Also, I keep 57 rare records on a shelf in the study."}
    for turn in range(100):
        text = said.get(turn) or (DECOYS[turn - 40] if 40 <= turn < 40 + len(DECOYS)  # one sitting about them
                                  else f"Chit-chat about the weather and the news, turn {turn}.")
        headers = ask(client, messages, text + " [[len:80]]")
    assert int(headers["x-memci-pages-archived"]) > 40  # the counts and the decoys have left the prompt
    chat_until_the_next_epoch(client, messages, headers, 100)  # the round has room

    ask(client, messages, "How many rare figurines and records do I have?")
    (sent,) = emu.requests(1)
    assert sent["body"]["messages"][-1]["role"] == "tool"
    pushed = sent["body"]["messages"][-1]["content"]
    assert "12 rare figurines" in pushed and "57 rare records" in pushed
    client.close()
