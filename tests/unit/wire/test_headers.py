from memci_proxy.metrics import Metrics
from memci_proxy.settings import Settings
from memci_proxy.upstream.client import UpstreamClient, response_headers


def test_forwarded_headers_keep_what_matters():
    c = UpstreamClient(Settings())
    out = c.forward_headers(
        {"Authorization": "Bearer sk-1", "OpenAI-Organization": "org", "X-Request-Id": "r1", "Host": "p",
         "Content-Length": "9", "Connection": "keep-alive", "Accept-Encoding": "gzip", "X-Custom": "y"}
    )
    assert out == {"Authorization": "Bearer sk-1", "OpenAI-Organization": "org", "X-Request-Id": "r1", "X-Custom": "y"}


def test_configured_upstream_key_replaces_the_clients():
    c = UpstreamClient(Settings(upstream_api_key="up-key"))
    out = c.forward_headers({"authorization": "Bearer client", "X-Request-Id": "r"})
    assert out == {"X-Request-Id": "r", "Authorization": "Bearer up-key"}


def test_response_headers_drop_hop_by_hop():
    out = response_headers({"Content-Type": "a", "Transfer-Encoding": "chunked", "x-request-id": "1", "Content-Length": "3"})
    assert out == {"Content-Type": "a", "x-request-id": "1"}


def test_urls_follow_the_base_url():
    c = UpstreamClient(Settings(upstream_url="http://h:1/v1/"))
    assert c.url("/chat/completions") == "http://h:1/v1/chat/completions"
    assert c.url("/models", "a=1") == "http://h:1/v1/models?a=1"


def test_usage_counters():
    m = Metrics()
    m.observe_usage({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 60}})
    m.observe_usage({"prompt_tokens": 10})
    m.observe_usage({"prompt_tokens": 10, "prompt_tokens_details": None})
    text = m.render()[0].decode()
    assert "memci_upstream_prompt_tokens_total 120.0" in text
    assert "memci_upstream_cached_tokens_total 60.0" in text
