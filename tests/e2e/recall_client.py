"""What the recall e2e modules do through the public interface: a chat with one fact early on (openai SDK), a
`/memci/search`, and a labelled metric read from `/metrics`."""

from __future__ import annotations

import re

import httpx
import openai


def chat_with_fact(proxy, api_key: str, fact: str, turns: int, length: int, max_tokens: int,
                   timeout: float = 60) -> dict[str, str]:
    """``turns`` turns of chit-chat with ``fact`` as turn 3 (each answer ``length`` emulator words); every answer a
    200. The last answer's headers."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key=api_key, max_retries=0, timeout=timeout)
    messages: list[dict] = []
    headers: dict[str, str] = {}
    try:
        for turn in range(1, turns + 1):
            text = fact if turn == 3 else f"Chit-chat number {turn} about the weather and the news."
            messages.append({"role": "user", "content": f"{text} [[len:{length}]]"})
            raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=max_tokens)
            assert raw.http_response.status_code == 200
            messages.append(raw.parse().choices[0].message.model_dump(exclude_none=True))
            headers = dict(raw.headers)
    finally:
        client.close()
    return headers


def search(proxy, api_key: str, conversation: str, query: str, k: int = 3) -> list[dict]:
    r = httpx.post(proxy.url + "/memci/search", json={"conversation_id": conversation, "query": query, "k": k},
                   headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["hits"]


def metric_sample(proxy, name: str, labels: str) -> float:
    """One sample of a metric with several labels (``labels`` as scraped: 'api="chat",status="200"'); 0 if absent."""
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    found = re.search(re.escape(name + "{" + labels + "}") + r" ([0-9.e+]+)", text)
    return float(found.group(1)) if found else 0.0


def labelled_metric(proxy, name: str) -> dict[str, float]:
    """A metric with one label: label value -> sample."""
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(name + r'\{[a-z]+="([^"]+)"\} ([0-9.e+]+)', text)}
