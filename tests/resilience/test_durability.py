"""The proxy killed (SIGKILL) in the middle of a stream and restarted on the same home: the client resends its
history and no message is lost (every user turn is in the prompt or found again in an archived page, and every
archived page can be recalled)."""

from __future__ import annotations

import json
import re

import httpx

from tests.resilience.conftest import last_chat_prompt, Chat, search_finds


def test_proxy_killed_mid_stream_and_restarted(emulator_8k, home, start_proxy):
    proxy = start_proxy(home)
    port = proxy.port
    chat = Chat(proxy.url, "crash")
    with httpx.Client() as client:
        for i in range(14):
            r = chat.send(client, chat.user_text(i, pad=300))
            assert r.status_code == 200, r.text
        assert int(r.headers["x-memci-pages-archived"]) > 0
        conversation = chat.conversation_id
        killed_text = chat.user_text(14, "[[slow:0.05]]", length=40, pad=300)
        with client.stream("POST", proxy.base_url + "/chat/completions", headers=chat.headers(), timeout=30,
                           json=chat.body(killed_text, stream=True)) as s:
            assert s.status_code == 200
            lines = s.iter_lines()
            for _ in range(4):
                next(lines)
            proxy.kill()
        proxy = start_proxy(home, port=port)
        # The client did not get its answer: it sends the same turn again, then goes on.
        r = chat.send(client, killed_text)
        assert r.status_code == 200, (r.text, proxy.log())
        assert r.headers["x-memci-conversation-id"] == conversation
        for i in range(15, 20):
            r = chat.send(client, chat.user_text(i, pad=300))
            assert r.status_code == 200
        archived = int(r.headers["x-memci-pages-archived"])
        last_prompt = last_chat_prompt(emulator_8k, chat)
        missing = [w for w in chat.words if w not in str(last_prompt) and not search_finds(proxy.url, chat, w)]
        if missing:
            found = httpx.post(proxy.url + "/memci/search", headers=chat.headers(), timeout=30,
                               json={"query": missing[0], "conversation_id": chat.conversation_id, "k": 3}).text
            assert not missing, (missing, chat.words, found[:3000], proxy.log()[-3000:])
        # Every archived page listed in the contents page can be read back with the recall tool.
        # (the contents page is in the proxy's block, leading the first message after the client's system prompt)
        block = next(m["content"] for m in last_prompt
                     if isinstance(m.get("content"), str) and "<memci-context>" in m["content"])
        block = block.split("<memci-context>", 1)[1].split("</memci-context>", 1)[0]
        labels = sorted(set(re.findall(r"^\W*(?:page\s*)?(\d+)\b", block, re.M | re.I)), key=int)
        assert len(labels) >= min(archived, 1)
        for label in labels:
            text = f'Read page {label}. [[call:recall {{"pages": [{label}]}}]]'
            r = client.post(proxy.base_url + "/chat/completions", json=chat.body(text), headers=chat.headers(),
                            timeout=30)
            assert r.status_code == 200, r.text
            answer = r.json()["choices"][0]["message"]["content"]
            assert answer.startswith("Tool result:"), answer
            assert "zq" in answer and "not found" not in answer.lower(), (label, answer)
            json.dumps(answer)
