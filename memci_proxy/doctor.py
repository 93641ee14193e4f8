"""`memci-proxy doctor`: checks what the proxy depends on (the upstream, the database, Redis) and says what the
proxy will do with these settings, and why. Each check prints one line: ok, warn (works, but something is
lost) or FAIL (the proxy cannot work); the exit status is 1 when any check failed.

The upstream check first sends the probe of the route chat uses (memci_proxy.upstream.route_check, the check `/ready`
runs too: an upstream URL without its `/v1` fails here, with a hint), then asks `/models` (names,
`max_model_len`) and sends two tiny identical chat requests, to see
whether the upstream reports `usage.prompt_tokens_details.cached_tokens` (the proxy's cold-cache check and the
hit-rate metrics read it; SGLang reports it with `--enable-cache-report`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from memci_proxy.engine.config import EngineConfig
from memci_proxy.settings import Settings
from memci_proxy.upstream import route_check, tokenize
from memci_proxy.upstream.engine_id import PROBES, Engine, engine_of, root_of

FALLBACK_WINDOW = 32768  # as memci_proxy.turn.window
# Long enough to fill a few cache blocks (vLLM caches whole 16-token blocks), short enough to cost nothing.
PROBE_TEXT = "memci-proxy doctor: is the prefix cache reported? " * 12


@dataclass
class Report:
    lines: list[tuple[str, str]] = field(default_factory=list)
    say: Callable[[str], None] = print

    def add(self, level: str, text: str) -> None:
        self.lines.append((level, text))
        self.say(f"{level:<5} {text}")

    @property
    def failed(self) -> bool:
        return any(level == "FAIL" for level, _ in self.lines)


@dataclass
class UpstreamFacts:
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    engine: Engine | None = None
    tokenizer: bool = False  # the upstream counts text at /tokenize (the proxy's counts are then exact)


def check_upstream(settings: Settings, report: Report, api_key: str = "", model: str = "",
                   timeout: float = 10.0, transport: httpx.BaseTransport | None = None) -> UpstreamFacts | None:
    urls = settings.upstream_urls
    if not urls:
        report.add("FAIL", "upstream: no upstream_url set (MEMCI_UPSTREAM_URL or --upstream)")
        return None
    key = settings.upstream_api_key or api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    facts: UpstreamFacts | None = None
    with httpx.Client(timeout=timeout, headers=headers, transport=transport) as client:
        for url in urls:
            found = _check_one_upstream(client, url, report, model)
            facts = facts or found
    return facts


def _call(client: httpx.Client, report: Report, method: str, url: str, **kwargs: Any) -> dict[str, Any] | None:
    """The JSON answer of one upstream request, or None after a FAIL line saying what went wrong."""
    try:
        response = client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        report.add("FAIL", f"upstream {url}: unreachable ({type(exc).__name__}: {exc})")
        return None
    if response.status_code != 200:
        report.add("FAIL", f"upstream {url}: HTTP {response.status_code} {response.text[:200]}")
        return None
    return _json(response)


def _check_one_upstream(client: httpx.Client, url: str, report: Report, model: str) -> UpstreamFacts | None:
    try:
        probe = client.post(url + route_check.PATH, content=route_check.BODY, headers=route_check.HEADERS)
    except httpx.HTTPError as exc:
        verdict = route_check.unreachable(url, f"{type(exc).__name__}: {exc}")
    else:
        verdict = route_check.judge(url, probe.status_code, probe.content)
    if not verdict.ok:
        report.add("FAIL", f"upstream {url}: {verdict.message}")
        return None
    listed = _call(client, report, "GET", url + "/models")
    if listed is None:
        return None
    data = [m for m in listed.get("data") or [] if isinstance(m, dict)]
    facts = UpstreamFacts(models=[str(m.get("id")) for m in data])
    for m in data:
        value = m.get("max_model_len") or m.get("context_length") or m.get("max_context_length")
        if isinstance(value, int) and value > 0:
            facts.max_model_len = value
            break
    length = f"max_model_len {facts.max_model_len}" if facts.max_model_len else "no max_model_len reported"
    report.add("ok", f"upstream {url}: models {', '.join(facts.models) or '(none listed)'}; {length}")
    facts.engine = _identify(client, url, report)

    chosen = model or (facts.models[0] if facts.models else "")
    if not chosen:
        report.add("FAIL", f"upstream {url}: no model to probe (pass --model)")
        return facts
    facts.tokenizer = _counts_exactly(client, url, chosen, report)
    body = {"model": chosen, "messages": [{"role": "user", "content": PROBE_TEXT}], "max_tokens": 1}
    usages = []
    for _ in range(2):  # the second request repeats the first: its prefix is cached if caching works
        answer = _call(client, report, "POST", url + "/chat/completions", json=body)
        if answer is None:
            return facts
        usages.append(answer.get("usage") or {})
    prompt_tokens = usages[-1].get("prompt_tokens")
    details = usages[-1].get("prompt_tokens_details") or {}
    if "cached_tokens" in details and details["cached_tokens"] is not None:
        report.add("ok", f"upstream {url}: model {chosen} answers; reports cached_tokens "
                         f"({details['cached_tokens']} of {prompt_tokens} prompt tokens on a repeated request)")
    else:
        report.add("warn", f"upstream {url}: model {chosen} answers but reports no usage.prompt_tokens_details."
                           "cached_tokens: hit-rate metrics stay empty and cold caches go unnoticed (SGLang: "
                           "--enable-cache-report)")
    return facts


def _identify(client: httpx.Client, url: str, report: Report) -> Engine | None:
    """The engine's name, version and prefix cache (memci_proxy.upstream.engine_id), with its warnings."""
    root = root_of(url)
    for path in PROBES:
        try:
            response = client.get(root + path)
        except httpx.HTTPError:
            continue
        engine = engine_of(path, response.status_code, response.content)
        if engine is not None:
            report.add("ok", f"upstream {url}: engine {engine.describe()}")
            for warning in engine.warnings:
                report.add("warn", f"upstream {url}: {warning}")
            return engine
    report.add("ok", f"upstream {url}: engine not known by name (taken for one with a radix prefix cache; set "
                     "upstream_cache=single_slot for a llama.cpp-like server keeping one prompt per slot)")
    return None


def _counts_exactly(client: httpx.Client, url: str, model: str, report: Report) -> bool:
    """Whether the upstream counts text at `/tokenize` (SGLang, vLLM) or llama-cpp-python's `/extras/tokenize/count`,
    as the proxy's counts then ask it (memci_proxy.upstream.tokenize)."""
    root = root_of(url)
    for path, body in (("/tokenize", {"model": model, "prompt": PROBE_TEXT}),
                       (tokenize.EXTRAS, {"input": PROBE_TEXT})):
        try:
            response = client.post(root + path, json=body)
        except httpx.HTTPError:
            continue
        count = tokenize.count_of(_json(response)) if response.status_code == 200 else None
        if count:
            report.add("ok", f"upstream {url}: counts tokens at {path} ({count} tokens in the probe): the proxy's "
                             "counts are the engine's own")
            return True
    report.add("ok", f"upstream {url}: no tokenizer endpoint; the proxy estimates counts and corrects them with "
                     "the usage each answer reports")
    return False


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def check_database(settings: Settings, report: Report) -> None:
    if settings.database_url:
        _check_schema(settings.database_url, redact(settings.database_url), report)
        return
    path = settings.home_path / "pg"
    try:
        from memci_proxy.store.sql.embedded import start_embedded_postgres
    except ImportError as exc:
        report.add("FAIL", f"database: embedded PostgreSQL unavailable ({exc}); set DATABASE_URL")
        return
    if not path.exists():
        report.add("ok", f"database: embedded PostgreSQL under {path}, created and migrated by serve at its first start")
        return
    try:  # joins the server a running proxy shares, or starts it; released (stopped if nobody else holds it) below
        embedded = start_embedded_postgres(path)
    except Exception as exc:
        report.add("FAIL", f"database: embedded PostgreSQL under {path} does not start: {type(exc).__name__}: {exc}")
        return
    try:
        _check_schema(embedded.sync_url, f"embedded PostgreSQL under {path}", report)
    finally:
        embedded.stop()


def _check_schema(url: str, name: str, report: Report) -> None:
    from memci_proxy.store.sql.migrate import current_revision, head_revision

    try:
        current = current_revision(url)
    except Exception as exc:  # any driver error is a failed check
        report.add("FAIL", f"database {name}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    head = head_revision()
    if current == head:
        report.add("ok", f"database {name}: reachable, schema at {head}")
    else:
        report.add("warn", f"database {name}: reachable, schema at {current or 'nothing'}, code expects {head} "
                           "(run `memci-proxy migrate`; serve migrates at start)")


def check_redis(settings: Settings, report: Report) -> None:
    if not settings.redis_url:
        report.add("ok", "redis: none; hot state and locks in this process (one replica only)")
        return
    import redis

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
        report.add("ok", f"redis {redact(settings.redis_url)}: reachable (replicas share hot state and locks)")
    except Exception as exc:
        report.add("FAIL", f"redis {redact(settings.redis_url)}: {type(exc).__name__}: {exc}")
    finally:
        client.close()


def explain(settings: Settings, facts: UpstreamFacts | None, report: Report) -> None:
    """What the proxy will do, and why (each line says which setting or fact decided it)."""
    if not settings.manage_context:
        report.add("plan", "pass-through: manage_context is off; requests go upstream unchanged")
        return
    if settings.context_window:
        window, why = settings.context_window, "setting context_window"
    elif facts and facts.max_model_len:
        window, why = facts.max_model_len, "the upstream's max_model_len"
    else:
        window, why = FALLBACK_WINDOW, "fallback: context_window is 0 and the upstream reports no max_model_len"
    config = EngineConfig.from_settings(settings, window)
    budget = config.budget(None)
    report.add("plan", f"context window {window:,} tokens ({why})")
    report.add("plan", f"prompt budget {budget:,} tokens = window - answer reserve "
                       f"{config.reserve(None):,} - safety margin {config.margin():,} (a request's max_tokens replaces "
                       f"the reserve, up to {config.reserve(1 << 40):,} = output_reserve_share "
                       f"{config.output_reserve_share} of the window; a larger one is lowered upstream to fit)")
    report.add("plan", f"compaction epoch when the prompt passes the client's fixed part (system message and tools) "
                       f"plus {config.high_watermark} of the room above it (active_high_watermark; "
                       f"{int(config.high_watermark * budget):,} tokens with no fixed part), down to "
                       f"{int(config.low_watermark * budget):,} (active_low_watermark {config.low_watermark}); "
                       "between epochs prompts only grow at their end")
    if settings.recall_enabled:
        report.add("plan", f"pull: the model may call the `{settings.recall_tool_name}` tool (answered by the proxy, "
                           f"at most {settings.recall_max_rounds} rounds a request)")
    else:
        report.add("plan", "pull: off (recall_enabled false): archived pages are reachable only through the admin API")
    mode = "injection" if settings.memory_injection_enabled else settings.memory_push
    why = {"proactive": "the proxy runs one recall round itself when archived pages match what the user's message "
                        "names and the prompt lacks, kept in the history so later turns keep their cache",
           "injection": "a B5 memory block next to the latest user message (a cache miss on the next turn)",
           "off": "only the model's own recall calls"}[mode]
    source = "memory_injection_enabled" if settings.memory_injection_enabled else "memory_push"
    report.add("plan", f"push: {mode} ({source}): {why}; the rewritten intent goes in the prompt: "
                       f"{settings.intent_in_prompt}")
    report.add("plan", f"tenants: auth_mode {settings.auth_mode}; admin API {'on' if settings.admin_key else 'off (MEMCI_ADMIN_KEY unset)'}")


def redact(url: str) -> str:
    """A URL with its password hidden (any scheme)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{netloc}"))


def run(settings: Settings, api_key: str = "", model: str = "", say: Callable[[str], None] = print) -> int:
    report = Report(say=say)
    facts = check_upstream(settings, report, api_key=api_key, model=model)
    check_database(settings, report)
    check_redis(settings, report)
    explain(settings, facts, report)
    say("doctor: " + ("FAILED" if report.failed else "all checks passed"))
    return 1 if report.failed else 0
