"""The proxy's Prometheus metrics (one registry per process), served at GET /metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from memci_proxy import usage_meter
from memci_proxy.caches import CacheCollector

disable_created_metrics()

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[Any, ...], Any] = {}  # labelled children, see `child`
        # memci_cache_*: every bounded per-process cache (memci_proxy.caches)
        r.register(CacheCollector())
        self.requests = Counter(
            "memci_requests", "Requests on /v1, each counted once, by route (`chat`, `responses`, `messages`, "
            "`other`) and final status: the HTTP status (errors of the proxy, the limits and the upstream included), "
            "or `stream_cut` for a stream that started (200) and ended with an upstream failure (the client got an "
            "error event, not a whole answer).", ["route", "status"], registry=r,
        )
        self.request_duration = Histogram(
            "memci_request_duration_seconds", "Time from request to the last byte answered.", ["route"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        # memci_api_*: the same turns by the client's API (chat completions, Responses, Anthropic Messages)
        self.api_requests = Counter(
            "memci_api_requests", "Requests of each client API (chat, responses, messages), by final status "
            "(as `memci_requests_total`: `stream_cut` for a stream cut by the upstream).",
            ["api", "status"], registry=r,
        )
        self.api_request_duration = Histogram(
            "memci_api_request_duration_seconds", "Time from request to the last byte answered, by client API.",
            ["api"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.api_prompt_tokens = Counter(
            "memci_api_prompt_tokens", "Prompt tokens the upstream reported, by client API.", ["api"], registry=r,
        )
        self.api_cached_tokens = Counter(
            "memci_api_cached_tokens", "Cached prompt tokens the upstream reported, by client API (hit rate: "
            "over memci_api_prompt_tokens).", ["api"], registry=r,
        )
        self.upstream_ttft = Histogram(
            "memci_upstream_ttft_seconds", "Time from sending upstream to the upstream's first byte.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.proxy_overhead = Histogram(
            "memci_proxy_overhead_seconds", "Time spent in the proxy itself, excluding waiting on the upstream.",
            ["route"], buckets=_OVERHEAD_BUCKETS, registry=r,
        )
        self.prompt_tokens = Counter("memci_upstream_prompt_tokens", "Prompt tokens the upstream reported.", registry=r)
        self.cached_tokens = Counter(
            "memci_upstream_cached_tokens", "Cached prompt tokens the upstream reported (missing details count 0).",
            registry=r,
        )
        self.completion_tokens = Counter("memci_upstream_completion_tokens", "Completion tokens the upstream reported.", registry=r)
        self.inflight_streams = Gauge("memci_inflight_streams", "Streams being relayed now.", registry=r)
        self.upstream_errors = Counter(
            "memci_upstream_errors", "Upstream failures, by kind: `unreachable` (no connection: a 502), "
            "`connect_timeout`, `timeout` (504), `http_4xx` and `http_5xx` (an error status from the upstream, "
            "passed on), `stream_cut` (a stream or body ended early), `stream_error` (an error event inside a stream). "
            "Each is also a WARNING line with its status and conversation id.", ["kind"], registry=r
        )
        self.client_disconnects = Counter(
            "memci_client_disconnects", "Streams cut short by the client (upstream request cancelled).", registry=r
        )
        # context engine
        self.prefix_reuse_tokens = Counter(
            "memci_prefix_reuse_tokens",
            "The proxy's own estimate of prompt tokens shared with the conversation's previous upstream prompt.",
            registry=r,
        )
        self.estimated_prompt_tokens = Counter(
            "memci_estimated_prompt_tokens", "The proxy's own estimate of prompt tokens sent upstream.", registry=r
        )
        self.estimate_error = Histogram(
            "memci_token_estimate_error_ratio",
            "(estimated - reported) / reported prompt tokens of managed requests: above 0 is the safe side.",
            buckets=(-0.5, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=r,
        )
        self.tokenize_requests = Counter(
            "memci_tokenize_requests", "Calls of the upstream's /tokenize, by outcome.", ["outcome"], registry=r
        )
        self.turn_resends = Counter(
            "memci_turn_resends", "Managed turns the upstream refused and the proxy sent once more, by why: window (the "
            "prompt was too long: the window was read again and the turn planned for it), estimate (prompt + max_tokens "
            "passed the window because the prompt's estimate fell short: sent with max_tokens fitted to the upstream's "
            "own count of the prompt), rounds (the proxy's recall rounds were refused: sent in another shape, "
            "remembered for that upstream).", ["why"], registry=r,
        )
        self.epochs = Counter("memci_compaction_epochs", "Compaction epochs, by reason.", ["reason"], registry=r)
        self.pages_archived = Counter("memci_pages_archived", "Pages moved from the prompt to the archive.", registry=r)
        self.summary_calls = Counter(
            "memci_summary_calls", "Summariser calls of the memory workers, by kind: prefix (the conversation's "
            "pre-epoch prompt plus one instruction, cached upstream) or plain (the pages' text alone: no kept prompt "
            "held them, e.g. after a restart).", ["kind"], registry=r,
        )
        self.summary_waits = Counter(
            "memci_summary_waits", "Epochs planned while the previous epoch's summary and profile jobs were not done, "
            "by outcome: ready (they finished within summary_wait_s, the epoch took their result), behind (still "
            "running at the deadline), failed (backing off): then the epoch kept the summary it had.", ["outcome"],
            registry=r,
        )
        self.job_prompt_tokens = Counter(
            "memci_memory_job_prompt_tokens", "Prompt tokens the upstream reported for the memory workers' summary and "
            "profile jobs.", registry=r,
        )
        self.job_cached_tokens = Counter(
            "memci_memory_job_cached_tokens", "Cached prompt tokens the upstream reported for the memory workers' jobs "
            "(a prefix job reuses the conversation's cached prompt: over memci_memory_job_prompt_tokens).", registry=r,
        )
        self.evictions = Counter("memci_evictions", "Contents entries evicted, by rule.", ["rule"], registry=r)
        self.tokens_saved = Counter(
            "memci_tokens_saved", "Estimated prompt tokens not sent compared with pass-through.", registry=r
        )
        self.over_budget = Counter(
            "memci_over_budget", "Turns refused with a 400 because even after an epoch their prompt (system prompt, "
            "tools and the newest turn) leaves no room in the window for a small answer; never sent upstream.",
            registry=r
        )
        self.max_tokens_lowered = Counter(
            "memci_max_tokens_lowered", "Managed requests whose max_tokens was lowered upstream so that prompt plus "
            "answer fit the window (header X-Memci-Max-Tokens-Lowered).", registry=r
        )
        self.engine_errors = Counter(
            "memci_engine_errors", "Engine or store failures; the request went upstream unchanged.", ["stage"], registry=r
        )
        self.turn_stage = Histogram(
            "memci_turn_stage_seconds", "Wall time of each step of a managed turn, by stage: `edge` (the body read, "
            "parsed and checked), `lookup`, `lock`, "
            "`weigh` (what the message needs from the archive), `plan`, `store` (the write before the upstream call), "
            "`push` (the proxy's own recall round), `upstream` (the exchange, the rounds of the model's recall calls "
            "included; a stream: until its first response), `recall` (the proxy answering those calls between the "
            "rounds: their searches, counts and write), `kept` (the answer waiting for the pushed round's write). A "
            "step the turn did not take is not observed.", ["stage"], buckets=_OVERHEAD_BUCKETS + (2.5, 10, 60),
            registry=r,
        )
        self.lock_wait = Histogram(
            "memci_lock_wait_seconds", "Time a managed request waited for its conversation's session lock.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.lock_timeouts = Counter(
            "memci_lock_timeouts", "Managed requests refused because the session lock stayed taken.", registry=r
        )
        self.hot_state_degraded = Gauge(
            "memci_hot_state_degraded", "1 while Redis is unreachable and hot state and locks are in-process.",
            registry=r,
        )
        self.store_write_failures = Counter(
            "memci_store_write_failures",
            "Turns PostgreSQL could not store, by stage; the client resends them and the next turn stores them.",
            ["stage"], registry=r,
        )
        self.trimmed_requests = Counter(
            "memci_trimmed_requests",
            "Requests sent without context management and trimmed to the prompt budget (store or engine failure).",
            registry=r,
        )
        self.writes_pending = Gauge(
            "memci_write_behind_pending",
            "Conversations whose latest turns are answered but not yet stored in PostgreSQL.", registry=r,
        )
        self.write_lag = Histogram(
            "memci_write_behind_lag_seconds", "Time from a turn's answer to its rows being stored.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.write_batches = Histogram(
            "memci_write_behind_batch_size", "Conversations written per PostgreSQL transaction.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r,
        )
        self.write_waits = Counter(
            "memci_write_behind_waits",
            "Turns that waited for room in the write-behind queue (PostgreSQL slower than the answers).", registry=r,
        )
        self.conversations = Counter(
            "memci_conversations", "Conversations seen, by how they were identified.", ["how"], registry=r
        )
        self.recall_calls = Counter("memci_recall_calls", "Recall tool calls answered by the proxy, by kind.", ["kind"], registry=r)
        self.recall_rounds = Histogram(
            "memci_recall_rounds", "Recall rounds resolved per managed request.", buckets=(0, 1, 2, 3, 4, 6, 8, 16),
            registry=r,
        )
        self.recall_pages = Counter("memci_recall_pages", "Archived pages returned in full by recall.", registry=r)
        self.offloaded_outputs = Counter(
            "memci_offloaded_outputs", "Tool outputs and pasted documents offloaded on arrival (each its own page, "
            "shown by a preview), by kind (tool, document).", ["kind"], registry=r,
        )
        self.offload_tokens_saved = Counter(
            "memci_offload_tokens_saved", "Estimated tokens offloaded outputs would have added to the prompt beyond "
            "their previews, counted once, when they arrive.", registry=r,
        )
        self.offload_reads = Counter(
            "memci_offload_reads", "Reads of offloaded outputs through recall, by how (lines, chars: a character "
            "range, search, start: the first lines, when none is given).", ["how"], registry=r,
        )
        self.recall_search_seconds = Histogram(
            "memci_recall_search_seconds", "Time to search a conversation's archived pages.",
            buckets=_OVERHEAD_BUCKETS, registry=r,
        )
        self.intent_rewrites = Counter(
            "memci_intent_rewrite", "Intent rewrites, by the level that served and why the model did not.",
            ["level", "reason"], registry=r,
        )
        self.intent_rewrite_seconds = Histogram(
            "memci_intent_rewrite_seconds", "Time to rewrite the latest user message.", buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.memory_injections = Counter(
            "memci_memory_injections", "Turns whose latest user message carried retrieved memory (B5).", registry=r
        )
        self.recall_fallbacks = Counter(
            "memci_recall_fallbacks", "Recall searches that fell back to lexical only, by reason (model_absent, "
            "model_error, loading: the packaged model; deadline: the query's vector came too late "
            "(embeddings_query_deadline_ms); timeout, unreachable, http_*, bad_answer: an embeddings "
            "endpoint; store; not_configured).", ["reason"], registry=r
        )
        self.embedded_texts = Counter(
            "memci_embedded_texts", "Texts (pages and queries) given to the packaged embedding model, by outcome: "
            "embedded, chunked (longer than one model input: embedded in pieces), empty (no text: a zero vector), "
            "failed.", ["outcome"], registry=r
        )
        self.search_pages_embedded = Counter(
            "memci_search_pages_embedded", "Page views embedded in the background (embeddings_pages=candidates: the "
            "pages a turn archived, and first a search's candidates that had no vector; each once, kept by digest).",
            registry=r
        )

        self.embedding_backlog_pages = Gauge(
            "memci_embedding_backlog_pages", "Archived pages (page views with embeddings_pages=candidates) waiting for "
            "their vector (background embedding).",
            registry=r,
        )
        self.embedding_backlog_age = Gauge(
            "memci_embedding_backlog_age_seconds", "How long the oldest page waiting for its vector has waited.",
            registry=r,
        )
        self.page_embedding_lag = Histogram(
            "memci_page_embedding_lag_seconds", "Time from a page's archive to its stored vector (embedded in the "
            "background: between turns, or after embeddings_max_lag_s regardless).", buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        # proactive recall (the push) and what epochs cost (honest accounting)
        self.recall_pushes = Counter(
            "memci_recall_pushes", "User turns weighed for a proactive recall round, by outcome: pushed, no_archive "
            "(nothing archived yet), no_match (no archived page holds a rare term of the message), weak (the match is "
            "not strong enough), in_prompt (the active pages hold what matched), no_hits, no_room, failed. The push "
            "rate is pushed over the sum.", ["outcome"], registry=r,
        )
        self.user_memory_pushes = Counter(
            "memci_user_memory_pushes", "User turns with a user id that asked something, searched in the user's other "
            "conversations, by outcome: pushed (a round of their pages), no_match (no page holds the message's terms), "
            "no_hits (none holds enough of them, or nothing specific), common (not searched: every term it names "
            "was found too common among the user's pages), alone (not searched: no other conversation of the user "
            "has pages yet), no_room, timeout, failed; write_skipped: a turn's pages "
            "not indexed (too many writes waiting; the conversation's next turn indexes them).", ["outcome"], registry=r,
        )
        self.recall_push_tokens = Histogram(
            "memci_recall_push_tokens", "Estimated tokens one proactive recall round added to the prompt (kept in the "
            "history: paid once, cached on later turns).", buckets=(32, 64, 128, 256, 512, 1024, 2048, 4096),
            registry=r,
        )
        self.vision_urls_refused = Counter(
            "memci_vision_urls_refused", "Image URLs not given to the vision model (image left undescribed), by "
            "reason (loopback, private, link_local, unspecified, multicast, reserved, unresolved, scheme, malformed).",
            ["reason"], registry=r,
        )
        self.epoch_tokens_shed = Histogram(
            "memci_epoch_tokens_shed", "Estimated tokens an epoch took out of the prompt (archived, condensed, "
            "evicted; net of the contents lines added).", buckets=(0, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536),
            registry=r,
        )
        self.epoch_tokens_prefilled = Histogram(
            "memci_epoch_tokens_prefilled", "Estimated prompt tokens an epoch's request sends after its stable prefix "
            "(what the upstream prefills again).", buckets=(0, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536),
            registry=r,
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once per process (``labels`` costs more than the count itself)."""
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        usage_meter.record(usage)  # the request's own count (virtual keys' budgets)
        prompt, completion, cached = _usage_counts(usage)
        self.prompt_tokens.inc(prompt)
        self.completion_tokens.inc(completion)
        self.cached_tokens.inc(cached)

    def observe_job_usage(self, usage: object) -> None:
        """A memory job's usage: counted apart from the turns' (it is no client's request)."""
        if isinstance(usage, dict):
            prompt, _, cached = _usage_counts(usage)
            self.job_prompt_tokens.inc(prompt)
            self.job_cached_tokens.inc(cached)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _usage_counts(usage: dict) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens of an OpenAI usage object; anything missing or malformed counts 0."""
    def count(value: object) -> int:
        return value if isinstance(value, int) and value > 0 else 0

    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return count(usage.get("prompt_tokens")), count(usage.get("completion_tokens")), count(cached)
