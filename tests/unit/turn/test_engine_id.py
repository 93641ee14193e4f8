"""Which engine the upstream is (memci_proxy.upstream.engine_id), from answers seen from the real servers."""

from __future__ import annotations

import json

from memci_proxy.upstream.engine_id import NO_CACHE, RADIX, SINGLE_SLOT, engine_of, root_of

# GET /server_info of SGLang 0.5.23 (the fields read, among its ~300 server arguments)
SGLANG = {"model_path": "/models/smollm2", "tokenizer_path": "/models/smollm2", "version": "0.5.23",
          "disable_radix_cache": False, "enable_cache_report": True, "context_length": 4096}


def test_sglang_is_recognised_with_its_version_and_radix_cache() -> None:
    engine = engine_of("/server_info", 200, json.dumps(SGLANG).encode())
    assert engine is not None and engine.name == "SGLang" and engine.version == "0.5.23"
    assert engine.cache == RADIX and engine.warnings == ()
    assert engine.describe() == "SGLang 0.5.23, a radix prefix cache (many prefixes kept at once)"


def test_sglang_without_its_cache_or_its_cache_report_is_warned_about() -> None:
    engine = engine_of("/server_info", 200, json.dumps({**SGLANG, "enable_cache_report": False}).encode())
    assert engine is not None and any("--enable-cache-report" in w for w in engine.warnings)
    engine = engine_of("/server_info", 200, json.dumps({**SGLANG, "disable_radix_cache": True}).encode())
    assert engine is not None and engine.cache == NO_CACHE and any("--disable-radix-cache" in w for w in engine.warnings)


def test_the_other_engines() -> None:
    llama = engine_of("/props", 200, b'{"default_generation_settings": {"n_ctx": 4096}, "build_info": "b4000"}')
    assert llama is not None and llama.name == "llama.cpp server" and llama.cache == SINGLE_SLOT
    python = engine_of("/openapi.json", 200, json.dumps({"info": {"title": "🦙 llama.cpp Python API",
                                                                   "version": "0.3.9"}}).encode())
    assert python is not None and python.cache == SINGLE_SLOT and python.version == "0.3.9"
    vllm = engine_of("/version", 200, b'{"version": "0.11.0"}')
    assert vllm is not None and vllm.name == "vLLM" and vllm.cache == RADIX


def test_answers_that_do_not_tell() -> None:
    assert engine_of("/server_info", 404, b"") is None
    assert engine_of("/server_info", 200, b"not json") is None
    assert engine_of("/server_info", 200, b'{"model_path": "x"}') is None  # not SGLang's argument list
    assert engine_of("/openapi.json", 200, b'{"info": {"title": "vLLM API"}}') is None
    assert engine_of("/version", 200, b'{"version": 3}') is None
    assert engine_of("/props", 200, b"[1, 2]") is None


def test_the_root_is_the_base_url_without_v1() -> None:
    assert root_of("http://h:30000/v1") == root_of("http://h:30000/v1/") == "http://h:30000"
    assert root_of("http://h:30000") == "http://h:30000"
