"""Image URLs the vision model may be given (memci_proxy.vision.urls), and what the describer does with the others."""

from __future__ import annotations

import logging

import pytest

from memci_proxy.vision import ImageDescriber
from memci_proxy.vision.urls import address_refusal, resolve_host, url_refusal
from tests.unit.vision.test_describer import FakeClient, message

REFUSED = {
    "http://127.0.0.1:8080/a.png": "loopback",
    "http://127.1/a.png": "loopback",
    "http://2130706433/a.png": "loopback",
    "http://0x7f.0.0.1/a.png": "loopback",
    "http://[::1]/a.png": "loopback",
    "http://[::ffff:127.0.0.1]/a.png": "loopback",
    "http://localhost:9/a.png": "loopback",
    "HTTPS://LOCALHOST/a.png": "loopback",
    "http://10.1.2.3/a.png": "private",
    "http://192.168.0.1/a.png": "private",
    "http://172.16.0.1/a.png": "private",
    "http://100.64.0.1/a.png": "private",
    "http://[fd00::1]/a.png": "private",
    "http://169.254.169.254/latest/meta-data": "link_local",
    "http://[fe80::1]/a.png": "link_local",
    "http://0.0.0.0/a.png": "unspecified",
    "http://[::]/a.png": "unspecified",
    "http://224.0.0.1/a.png": "multicast",
    "http://[ff02::1]/a.png": "multicast",
    "http://240.0.0.1/a.png": "private|reserved",  # 240/4: private or reserved, by Python version
    "file:///etc/passwd": "scheme",
    "FILE:///etc/passwd": "scheme",
    "ftp://example.org/a.png": "scheme",
    "gopher://127.0.0.1:6379/_INFO": "scheme",
    "javascript:alert(1)": "scheme",
    "http:///a.png": "malformed",
    "http://evil.example\\@127.0.0.1/a.png": "malformed",
    "http://a.example/a.png\n": "malformed",
    "http://[::1/a.png": "malformed",
}


async def no_dns(host: str) -> list[str]:
    return {"public.example": ["93.184.216.34"], "rebind.example": ["93.184.216.34", "10.0.0.7"]}.get(host, [])


@pytest.mark.parametrize("url, reason", sorted(REFUSED.items()))
async def test_non_public_and_non_http_urls_are_refused(url, reason):
    resolve = resolve_host if "localhost" in url.lower() else no_dns  # localhost: the system resolver
    assert await url_refusal(url, resolve=resolve) in reason.split("|")


@pytest.mark.parametrize("url", ["http://93.184.216.34/a.png", "https://public.example/a.png",
                                 "http://[2606:4700::1111]/a.png", "data:image/png;base64,AAAA"])
async def test_public_urls_and_data_uris_pass(url):
    assert await url_refusal(url, resolve=no_dns) is None


async def test_every_resolved_address_must_be_public_and_unresolved_names_are_refused():
    assert await url_refusal("http://rebind.example/a.png", resolve=no_dns) == "private"
    assert await url_refusal("http://nowhere.example/a.png", resolve=no_dns) == "unresolved"


async def test_the_setting_allows_private_hosts_but_never_other_schemes():
    assert await url_refusal("http://127.0.0.1/a.png", allow_private=True) is None
    assert await url_refusal("http://nowhere.example/a.png", allow_private=True, resolve=no_dns) is None
    assert await url_refusal("file:///etc/passwd", allow_private=True) == "scheme"


def test_address_classes():
    assert address_refusal("8.8.8.8") is None
    assert address_refusal("2002:7f00:1::") == "loopback"  # 6to4 around 127.0.0.1
    assert address_refusal("64:ff9b::a00:1") == "private"  # NAT64 around 10.0.0.1


async def test_the_describer_never_gives_a_refused_url_to_the_model(caplog):
    client = FakeClient()
    refused: list[str] = []
    describer = ImageDescriber(client, None, on_refused=refused.append, resolve=no_dns)
    urls = ["http://127.0.0.1:1/x.png", "http://[::1]/y.png", "file:///etc/passwd", "https://public.example/z.png"]
    with caplog.at_level(logging.INFO, logger="memci.vision"):
        for url in urls:
            describer.start(message(url), "tenant-a")
        assert await describer.wait(timeout=5)
    assert client.calls == ["https://public.example/z.png"]
    assert refused == ["loopback", "loopback", "scheme"] and describer.stats.urls_refused == 3
    allowing = ImageDescriber(FakeClient(), None, allow_private_urls=True, resolve=no_dns)
    allowing.start(message("http://127.0.0.1:1/x.png"), "tenant-a")
    assert await allowing.wait(timeout=5)
    assert allowing.client.calls == ["http://127.0.0.1:1/x.png"]
