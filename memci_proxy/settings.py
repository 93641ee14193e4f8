"""One typed settings object for the whole proxy.

Precedence: environment variables > config file (TOML) > defaults.
Every field has an environment variable (``MEMCI_<NAME>`` unless listed otherwise in ``ENV_ALIASES``),
and a bad value fails at start-up with a message that names the setting.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

from memci_proxy import package_data

DEFAULT_CONFIG_FILE = package_data.path("config/default.toml")

# Settings whose environment variable is not MEMCI_<NAME>.
ENV_ALIASES: dict[str, str] = {
    "database_url": "DATABASE_URL",
    "redis_url": "REDIS_URL",
}


# The groups of settings, in order, each named by its first field (docs/settings.md and config/default.toml
# follow them); a field belongs to the group of the nearest first field above it in `Settings`.
SECTIONS: dict[str, str] = {
    "host": "Serving",
    "max_body_bytes": "Limits and timeouts",
    "manage_context": "Context engine",
    "recall_enabled": "Recall",
    "intent_rewrite_enabled": "Intent rewrite and memory injection",
    "memory_workers": "Long-term memory (background workers)",
    "hot_state_max_mb": "Memory bounds of one process",
    "auth_mode": "Tenancy and auth",
    "blob_store": "Images",
    "admin_key": "Admin",
}


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


def _doc(text: str, **kw: typing.Any) -> dict[str, typing.Any]:
    return {"doc": text, **kw}


@dataclass(frozen=True)
class Settings:
    # --- serving -------------------------------------------------------------------------------
    host: str = field(default="127.0.0.1", metadata=_doc("Address the proxy listens on."))
    port: int = field(default=8080, metadata=_doc("Port the proxy listens on.", min=1, max=65535))
    upstream_url: str = field(
        default="http://127.0.0.1:30000/v1",
        metadata=_doc(
            "Upstream OpenAI base URL, as an OpenAI SDK's base_url takes it. Several URLs may be given "
            "separated by commas (data-parallel workers)."
        ),
    )
    upstream_api_key: str = field(
        default="",
        metadata=_doc("Key sent upstream instead of the client's Authorization header (empty: forward the client's)."),
    )
    config: str = field(default="", metadata=_doc("Path of a TOML config file read under the environment."))
    home: str = field(default="~/.memci", metadata=_doc("Data directory of the embedded defaults (database, blobs)."))
    database_url: str = field(
        default="", metadata=_doc("PostgreSQL URL (with pgvector). Empty: an embedded PostgreSQL under home.")
    )
    redis_url: str = field(default="", metadata=_doc("Redis URL. Empty: in-process hot state (one replica only)."))
    page_fulltext: bool = field(
        default=False,
        metadata=_doc("Keep a PostgreSQL full-text index (pages.tsv) of the archived pages, for SQL tools and your own "
                      "queries. The proxy's own search ranks in process and never reads it; computing it costs about "
                      "6 ms of database CPU per epoch, so it is off unless asked for (on: the pages archived while it "
                      "was off are indexed at the next start)."),
    )
    workers: int = field(default=1, metadata=_doc("Server worker processes.", min=1, max=64))
    log_level: str = field(default="info", metadata=_doc(
        "Log level (`serve --log-level`); the embedded PostgreSQL's initdb and server output and each migration step "
        "show only at debug.", choices=("debug", "info", "warning", "error")))
    log_prompts: bool = field(
        default=False,
        metadata=_doc("Write each chat request's messages to the log at debug level (with log_level debug). Off: "
                      "logs never hold message content or keys."),
    )

    # --- limits and timeouts -------------------------------------------------------------------
    max_body_bytes: int = field(default=16 * 1024 * 1024, metadata=_doc("Largest request body accepted (413 above).", min=1))
    upstream_connect_timeout: float = field(default=5.0, metadata=_doc("Seconds to connect upstream (502 past it).", min=0.001))
    upstream_read_timeout: float = field(
        default=600.0, metadata=_doc("Seconds to wait for upstream bytes (504 past it).", min=0.001)
    )
    upstream_max_connections: int = field(default=1024, metadata=_doc("Connection pool size to the upstream.", min=1))
    max_messages: int = field(
        default=10000, metadata=_doc("Most messages in one request: chat completions, Responses (input and the chain "
                                     "before it), Messages and its count_tokens (400 above; 0: no limit).", min=0)
    )
    rate_limit_rps: float = field(
        default=0.0, metadata=_doc("Requests per second each tenant may send (token bucket; 0: no limit).", min=0.0)
    )
    rate_limit_burst: int = field(
        default=0, metadata=_doc("Token bucket size of the per-tenant rate (0: the rate rounded up, at least 1).", min=0)
    )
    max_concurrent_streams_per_tenant: int = field(
        default=0, metadata=_doc("Streaming chat requests one tenant may have open at once (429 above; 0: no limit).", min=0)
    )
    upstream_max_inflight: int = field(
        default=512,
        metadata=_doc("Requests this process has in flight to the upstream at once; more wait in a bounded queue "
                      "(0: no limit).", min=0),
    )
    upstream_max_queue: int = field(
        default=1024, metadata=_doc("Requests that may wait for an upstream slot; past it 429 at once.", min=0)
    )
    upstream_queue_timeout_ms: int = field(
        default=2000, metadata=_doc("Milliseconds a request waits for an upstream slot before 429 with Retry-After.", min=0)
    )
    upstream_down_after_errors: int = field(
        default=3,
        metadata=_doc("Consecutive 5xx answers after which an upstream worker is skipped (a connection failure "
                      "skips it at once).", min=1),
    )
    upstream_down_seconds: float = field(
        default=10.0, metadata=_doc("Seconds a failed upstream worker is skipped before it is tried again.", min=0.0)
    )

    # --- context engine ------------------------------------------------------------------------
    manage_context: bool = field(
        default=True, metadata=_doc("Manage the context (pages, contents page, epochs). Off: pure pass-through.")
    )
    context_window: int = field(
        default=0,
        metadata=_doc("Context window in tokens. 0: learn max_model_len from the upstream's /v1/models, else 32768.", min=0),
    )
    output_reserve: int = field(
        default=4096, metadata=_doc("Tokens reserved for the answer when the request has no max_tokens (at most output_reserve_share of the window).", min=0)
    )
    output_reserve_share: float = field(
        default=0.25,
        metadata=_doc("Largest share of the window reserved for the answer. A request's max_tokens (max_completion_tokens, "
                      "Responses max_output_tokens, Messages max_tokens) above it still plans the prompt with this share, and "
                      "the max_tokens sent upstream is lowered to what the window leaves after the prompt and the safety "
                      "margin (header X-Memci-Max-Tokens-Lowered).", min=0.0, max=0.9),
    )
    safety_margin: float = field(default=0.10, metadata=_doc("Fraction of the window kept free.", min=0.0, max=0.9))
    active_high_watermark: float = field(
        default=0.95,
        metadata=_doc("A compaction epoch starts when the prompt passes the client's fixed part (its system message "
                      "and tools) plus this fraction of the budget's room above it.", min=0.05, max=1.0),
    )
    active_low_watermark: float = field(
        default=0.40, metadata=_doc("Fraction of the budget a compaction epoch brings the prompt down to (under a larger fixed "
                                "part: every page but the open one archived).", min=0.01, max=1.0)
    )
    contents_max_tokens: int = field(
        default=2048, metadata=_doc("Largest contents page (and never over 8% of the prompt budget); past it entries are evicted LRU.", min=64)
    )
    evict_after_rounds_unrecalled: int = field(
        default=200, metadata=_doc("Seed 000 rule m: evict a contents entry never recalled after m rounds.", min=1)
    )
    evict_after_rounds_unchanged: int = field(
        default=400, metadata=_doc("Seed 000 rule p: evict a contents entry whose recall count is unchanged for p rounds.", min=1)
    )
    page_max_tokens: int = field(
        default=4096, metadata=_doc("Pages larger than this (or than a sixth of the prompt budget) split into continuation pages at assistant boundaries.", min=64)
    )
    condense_tool_chars: int = field(
        default=200, metadata=_doc("Old tool outputs are cut to this many characters at epochs (seed 003).", min=0)
    )
    condense_keep_pages: int = field(
        default=2, metadata=_doc("Newest active pages never condensed at an epoch.", min=0)
    )
    cold_cache_ratio: float = field(
        default=0.5,
        metadata=_doc("The upstream cache counts as cold when reported cached tokens fall below this fraction of the "
                      "expected stable prefix.", min=0.0, max=1.0),
    )
    cold_cache_min_tokens: int = field(
        default=256, metadata=_doc("Expected stable prefixes shorter than this never count as a cold cache.", min=0)
    )
    offload: bool = field(
        default=True,
        metadata=_doc("First-sight offload: a huge tool output or pasted document becomes its own archived page when "
                      "it arrives, and prompts carry a stable preview in its place (per request: X-Memci-Offload)."),
    )
    offload_tool_tokens: int = field(
        default=2000,
        metadata=_doc("A tool output over this many tokens (or over an eighth of the prompt budget, when less) is "
                      "offloaded on arrival; 0: never.", min=0),
    )
    offload_document_tokens: int = field(
        default=8000,
        metadata=_doc("A user message (a pasted document) over this many tokens (or over a quarter of the prompt "
                      "budget, when less) is offloaded on arrival; 0: never.", min=0),
    )
    offload_preview_tokens: int = field(
        default=192,
        metadata=_doc("Size of an offloaded output's preview (head, lines that look like errors, tail), at most half "
                      "the tool threshold.", min=32),
    )
    summary_line_chars: int = field(
        default=80, metadata=_doc("Length of each per-message line of the contents page.", min=16)
    )
    cache_ttl: float = field(
        default=300.0,
        metadata=_doc("Seconds after which the upstream cache of an idle conversation is taken as cold.", min=0.0),
    )
    tokenizer_file: str = field(
        default="", metadata=_doc("A Hugging Face tokenizer.json for exact counts (empty: the upstream's /tokenize "
                                  "when it serves one, else the CJK-aware estimate).")
    )
    count_learning: bool = field(
        default=True,
        metadata=_doc("Learn each conversation's token costs (text, images, tools' schema, per message) from the "
                      "upstream's reported prompt_tokens and plan with them; kept in the conversation's state, so "
                      "every replica plans its turns alike. Off: the base count and the conversation's correction "
                      "ratio alone."),
    )
    upstream_tokenize: bool = field(
        default=True,
        metadata=_doc("Without tokenizer_file, count text with the upstream's POST /tokenize (SGLang, vLLM) or "
                      "/extras/tokenize/count (llama-cpp-python) when it serves one, cached by text hash; the estimate "
                      "meanwhile and whenever it fails."),
    )
    tokenize_timeout_s: float = field(
        default=0.2,
        metadata=_doc("Longest wait of a turn for the upstream's /tokenize counts of its new messages (s); later "
                      "counts still fill the cache for the next turns.", min=0.0),
    )
    tokenize_wait_min_chars: int = field(
        default=2000,
        metadata=_doc("A turn waits for /tokenize only when its new texts not counted yet reach this many characters "
                      "(a tool result, a pasted file); shorter ones are planned with the estimate, and a sample of "
                      "them (all of the process's first 32, then one in 8) is counted behind the answer to keep the "
                      "exact/estimate ratio current (0: always wait).", min=0),
    )
    tokenize_min_chars: int = field(
        default=256,
        metadata=_doc("Texts shorter than this are not sent to /tokenize: they are estimated (times the exact/estimate "
                      "ratio seen so far), their error a few tokens that the learned costs absorb (at least 16).",
                      min=16),
    )
    tokenize_cache_entries: int = field(
        default=20000, metadata=_doc("Texts whose /tokenize counts are cached per process (by xxh3 hash).", min=1)
    )

    # --- persistence of the managed turn -------------------------------------------------------
    write_behind: bool = field(
        default=True,
        metadata=_doc("Store the per-turn appends (messages the client resends anyway) after the answer, batched. "
                      "Whatever leaves the prompt is stored before the upstream call either way. Off: every turn is "
                      "stored before its answer."),
    )
    write_behind_max_lag_ms: int = field(
        default=100, metadata=_doc("Longest time an answered turn waits before its batch is written (ms).", min=0)
    )
    write_behind_batch: int = field(
        default=64, metadata=_doc("Most conversations written per PostgreSQL transaction.", min=1)
    )
    write_behind_max_pending: int = field(
        default=1000,
        metadata=_doc("Conversations with unwritten turns past which new turns wait for the store (back-pressure).",
                      min=1),
    )
    state_cache_max_entries: int = field(
        default=10000, metadata=_doc("Conversation states this process keeps decoded in memory.", min=1)
    )
    state_cache_max_mb: int = field(
        default=256, metadata=_doc("Memory bound of the decoded conversation states (MB, estimated).", min=1)
    )
    state_cache_idle_s: float = field(
        default=300.0, metadata=_doc("Seconds a conversation's decoded state stays in memory without a turn (0: until "
                                     "the bounds push it out); a later turn reads it again from the hot state.", min=0.0)
    )
    last_prompts_max_entries: int = field(
        default=1000, metadata=_doc("Last upstream prompts kept for the admin prompt view, in conversations.", min=1)
    )
    gc_gen0_threshold: int = field(
        default=20000,
        metadata=_doc("Allocations between collections of the youngest objects; what start-up built is frozen out of "
                      "the collector's sight (0: Python's defaults, 700 and no freezing).", min=0),
    )
    last_prompts_max_mb: int = field(
        default=64, metadata=_doc("Memory bound of the last upstream prompts kept (MB, estimated).", min=1)
    )

    # --- recall --------------------------------------------------------------------------------
    recall_enabled: bool = field(default=True, metadata=_doc("Inject the recall tool and answer its calls."))
    recall_tool_name: str = field(default="recall", metadata=_doc("Name of the injected recall tool."))
    recall_max_rounds: int = field(default=3, metadata=_doc("Recall rounds resolved per request.", min=0, max=16))
    recall_max_tokens: int = field(default=2048, metadata=_doc("Largest recall result given to the model.", min=64))
    embeddings_url: str = field(
        default="",
        metadata=_doc(
            "OpenAI base URL serving /embeddings for the vector half of the recall search (fused with BM25); "
            "'upstream': the upstream's own. Empty: the packaged model (embeddings_local)."
        ),
    )
    embeddings_local: str = field(
        default="use-multilingual-v3",
        metadata=_doc(
            "Packaged embedding model of the recall search when embeddings_url is empty (in-process, CPU, nothing "
            "downloaded): 'use-multilingual-v3' (multilingual), 'wordllama-l2-256' (English, faster; extra "
            "memci-proxy[wordllama]), or 'off' for lexical search only."
        ),
    )
    embeddings_page_process: bool = field(
        default=True,
        metadata=_doc(
            "Embed archived pages with the packaged model in a child process of their own (spawned, at Linux's "
            "SCHED_IDLE priority: it runs when no turn wants the CPU): the "
            "model's forward pass holds the interpreter lock while it runs, and on a thread of the proxy it made "
            "every turn wait for that lock. Off: a background thread (one model in memory instead of two)."
        ),
    )
    embeddings_local_weights: str = field(
        default="", metadata=_doc("Weights file of the packaged model (empty: the one its package ships).")
    )
    embeddings_cache_mb: int = field(
        default=64, metadata=_doc("Memory bound of the page vectors kept in this process (MB, estimated).", min=1)
    )
    embeddings_max_lag_s: float = field(
        default=5.0,
        metadata=_doc("Seconds an archived page may wait for a moment without turns before it is embedded regardless "
                      "(background embedding; turns never wait on it).", min=0.0),
    )
    embeddings_pages: str = field(
        default="candidates",
        metadata=_doc("How the vectors serve a search: candidates (the vectors that exist re-order what a search's "
                      "BM25 half finds; pages are embedded in the background after the turn that archived them: their "
                      "user words, and their whole text when short or without user words; kept by digest in memory) "
                      "or archive (every page embedded in the background and stored; the vectors may add pages BM25 "
                      "missed: worth it with an embeddings_url served elsewhere).",
                      choices=("candidates", "archive")),
    )
    embeddings_query_deadline_ms: float = field(
        default=50.0,
        metadata=_doc("Milliseconds a search on the request path waits for its query's vector from the packaged "
                      "model (embeddings_pages=candidates); past it the search is lexical (an embeddings_url is "
                      "bounded by embeddings_timeout instead).", min=1.0),
    )
    embeddings_model: str = field(
        default="", metadata=_doc("Embedding model name sent and stored with the vectors (empty: 'default').")
    )
    embeddings_api_key: str = field(default="", metadata=_doc("Bearer key sent to the embeddings endpoint."))
    embeddings_timeout: float = field(
        default=5.0, metadata=_doc("Seconds to wait for the embeddings endpoint (then: lexical only).", min=0.001)
    )
    recall_lexical_weight: float = field(
        default=1.0, metadata=_doc("Weight of the BM25 ranking in the fused recall search.", min=0.0)
    )
    recall_vector_weight: float = field(
        default=1.0, metadata=_doc("Weight of the vector ranking in the fused recall search.", min=0.0)
    )
    recall_entity_boost: float = field(
        default=2.0,
        metadata=_doc("Weight of the query's proper nouns, numbers and codes in the BM25 half of the recall search "
                      "(1: none).", min=0.0),
    )
    recall_user_weight: int = field(
        default=2,
        metadata=_doc("How many times the user's own words count in a page's BM25 terms, against once for the "
                      "assistant's and tools' (1: all alike).", min=1, max=8),
    )
    recall_min_cosine: float = field(
        default=0.2,
        metadata=_doc("Pages the vectors alone found stay out of the fused search under this cosine similarity "
                      "(embeddings_pages=archive).", min=-1.0, max=1.0),
    )

    # --- intent rewrite (B2b) and memory injection (B5) -----------------------------------------
    intent_rewrite_enabled: bool = field(
        default=True, metadata=_doc("Rewrite the latest user message into a standalone intent (B2b block).")
    )
    intent_in_prompt: str = field(
        default="with_memory",
        metadata=_doc("When the rewritten intent goes into the prompt: always, with_memory (only beside injected "
                      "memory: a block costs a cache miss on the next turn), never (retrieval only).",
                      choices=("always", "with_memory", "never")),
    )
    rewrite_model_url: str = field(
        default="", metadata=_doc("OpenAI base URL of a small model for the rewrite (empty: rules only).")
    )
    rewrite_model: str = field(default="", metadata=_doc("Model name for the rewrite model."))
    rewrite_model_api_key: str = field(default="", metadata=_doc("API key for the rewrite model."))
    rewrite_timeout_ms: int = field(
        default=300, metadata=_doc("Milliseconds the rewrite model may take before the rules serve.", min=1)
    )
    memory_injection_enabled: bool = field(
        default=False,
        metadata=_doc("Inject memory retrieved from archived pages next to the latest user message (B5): the same as "
                      "memory_push=injection (kept for existing configurations). Off by default: each injection costs "
                      "a cache miss on the next turn, while the proactive push keeps the prefix stable."),
    )
    memory_push: str = field(
        default="proactive",
        metadata=_doc("How archived memory reaches a turn that looks something up: proactive (the proxy runs one "
                      "recall round itself before the model answers, shaped as a model-called one and kept in the "
                      "history, so later turns keep their cache), injection (B5 block next to the latest message, "
                      "a cache miss on the next turn; same as memory_injection_enabled), off (only the model's own "
                      "recall calls).", choices=("proactive", "injection", "off")),
    )
    memory_budget_tokens: int = field(default=2048, metadata=_doc("Token budget of the injected memory.", min=0))
    memory_max_hits: int = field(default=5, metadata=_doc("Most memory hits injected per turn.", min=0, max=50))
    memory_cut_chars: int = field(default=300, metadata=_doc("Each memory hit is cut to this many characters.", min=20))

    # --- long-term memory (background workers) ------------------------------------------------
    memory_workers: bool = field(
        default=True,
        metadata=_doc("Run the memory workers: conversation summaries (B4), the end user's profile (B2a: per user id, "
                      "per conversation without one), archival by age. "
                      "Their summary and profile jobs resend the conversation's pre-epoch prompt plus one instruction, "
                      "so the upstream's prefix cache covers them (measured on a 300-turn 8k chat: hit rate 0.963 "
                      "workers off, 0.967 on; 0.891 with the earlier standalone summary prompts)."),
    )
    summary_model_url: str = field(
        default="", metadata=_doc("OpenAI base URL of the summariser (empty: the first upstream URL).")
    )
    summary_model: str = field(default="", metadata=_doc("Model name for summaries (empty: the summariser's first model)."))
    summary_model_api_key: str = field(default="", metadata=_doc("API key of the summariser (empty: upstream_api_key)."))
    summary_timeout_s: float = field(default=60.0, metadata=_doc("Seconds one summariser call may take.", min=1.0))
    summary_wait_s: float = field(
        default=10.0,
        metadata=_doc("An epoch's summary and profile are those covering every page archived before it, the same on "
                      "every replica however fast the jobs ran: seconds an epoch waits at most for the previous "
                      "epoch's jobs when they are still running (then, or when they failed, it keeps the summary it "
                      "has); 0: never waits (what is done at the epoch enters). Not with summary_idle_s > 0.",
                      min=0.0),
    )
    summary_idle_s: float = field(
        default=0.0,
        metadata=_doc("When the summary and profile jobs of an epoch run: 0, right after the epoch; N > 0, once the "
                      "conversation has had no turn for N seconds (or at its next epoch, whichever comes first).",
                      min=0.0),
    )
    upstream_cache: str = field(
        default="auto",
        metadata=_doc("The upstream's prefix cache, for when the memory jobs run: radix (many prefixes: SGLang, vLLM, "
                      "OpenAI; the jobs follow the epoch's answer, on its cached prefix), single_slot (one prompt per "
                      "slot: llama.cpp, llama-cpp-python; the jobs run before the epoch's request, on the prefix the "
                      "slot still holds, so no job evicts the live conversation; the epoch's turn waits for them, at "
                      "most summary_timeout_s), auto (llama.cpp and llama-cpp-python servers are recognised from "
                      "their routes, anything else is radix).", choices=("auto", "radix", "single_slot")),
    )
    max_summary_tokens: int = field(
        default=1000, metadata=_doc("Largest conversation summary; over it the summary is re-compressed.", min=64)
    )
    archive_verbatim_days: int = field(
        default=5, metadata=_doc("Stored messages of the last N days stay verbatim; older days and months are "
                                 "summarised.", min=0)
    )
    history_soft_limit: int = field(
        default=0, metadata=_doc("Stored messages per conversation above which the oldest archived ones (summarised, "
                                 "outside active pages) are deleted; 0: never (seed 001 suggests 200).", min=0)
    )
    history_hard_limit: int = field(
        default=0, metadata=_doc("Stored messages per conversation above which, after pruning, a history_overflow "
                                 "event is recorded and recent days are archived at once; unarchived messages are "
                                 "never deleted. 0: never (seed 001 suggests 300).", min=0)
    )
    profile_max_facts: int = field(
        default=30, metadata=_doc("Facts in the end user's profile (B2a; a conversation's own without a user id).", min=0))
    memory_sweep_interval_s: float = field(
        default=600.0, metadata=_doc("Seconds between archival-by-age sweeps and retries of failed summaries.", min=1.0)
    )
    summary_cache_ttl_s: float = field(
        default=30.0, metadata=_doc("Seconds an end user's profile (facts from all their conversations) is cached per "
                                    "process; a conversation's own summary and profile are cached by how far they "
                                    "cover (summary_wait_s), with no time to live.", min=0.0)
    )

    # --- memory bounds of one process ----------------------------------------------------------
    hot_state_max_mb: int = field(
        default=256,
        metadata=_doc("MiB of conversation snapshots the in-process hot state keeps (no Redis, or while Redis is "
                      "down); older ones are read back from PostgreSQL.", min=1),
    )
    search_index_max_mb: int = field(
        default=128,
        metadata=_doc("MiB (estimated) of recall search indexes kept per process; an index dropped is rebuilt from "
                      "PostgreSQL when next searched.", min=1),
    )

    # --- tenancy and auth ----------------------------------------------------------------------
    auth_mode: str = field(
        default="passthrough",
        metadata=_doc("passthrough: the tenant is a hash of the client's bearer key and the key goes upstream; "
                      "virtual_keys: only the keys in virtual_keys are accepted (401 otherwise), each mapped to a "
                      "tenant and an upstream key, and the client's key never goes upstream.",
                      choices=("passthrough", "virtual_keys")),
    )
    virtual_keys: str = field(
        default="",
        metadata=_doc("The virtual keys: a JSON or TOML table {\"<client key>\": {\"tenant\": ..., \"upstream_key\": "
                      "..., \"user\": ...}} given inline, or the path of a .json/.toml file holding it (user, optional: "
                      "the one end user the key is bound to)."),
    )
    cache_salt_per_tenant: bool = field(
        default=False,
        metadata=_doc("Add SGLang's cache_salt (a hash of the tenant) to chat and completion requests, so tenants "
                      "never share prefix cache entries."),
    )
    prompt_cache_key: bool = field(
        default=True,
        metadata=_doc("Managed chat requests without a prompt_cache_key get the conversation id as theirs (OpenAI "
                      "routes requests with the same key to the same cache); a client's own key is passed on as sent."),
    )
    session_affinity_header: str = field(
        default="",
        metadata=_doc("A header sent upstream with the conversation id on managed chat requests, for routers that "
                      "pin a session to a worker (e.g. X-Session-Affinity); empty: none."),
    )

    # --- images --------------------------------------------------------------------------------
    blob_store: str = field(
        default="",
        metadata=_doc("Where image bytes are kept, by sha256: empty = <home>/blobs; a directory; or "
                      "s3://bucket/prefix for an S3-compatible store."),
    )
    blob_s3_endpoint: str = field(
        default="", metadata=_doc("S3 endpoint URL (empty: https://s3.<region>.amazonaws.com), e.g. MinIO's.")
    )
    blob_s3_region: str = field(default="us-east-1", metadata=_doc("S3 region (request signing)."))
    blob_s3_access_key: str = field(default="", metadata=_doc("S3 access key id."))
    blob_s3_secret_key: str = field(default="", metadata=_doc("S3 secret access key."))
    vision_model: str = field(
        default="", metadata=_doc("Vision model that describes images (empty: a placeholder with type and size).")
    )
    vision_url: str = field(default="", metadata=_doc("OpenAI base URL of the vision model (empty: the upstream)."))
    vision_api_key: str = field(default="", metadata=_doc("API key of the vision model (empty: upstream_api_key)."))
    vision_timeout: float = field(default=60.0, metadata=_doc("Seconds one image description may take.", min=0.001))
    vision_max_tokens: int = field(default=300, metadata=_doc("Longest image description in tokens.", min=16))
    vision_concurrency: int = field(default=2, metadata=_doc("Image descriptions computed at once.", min=1))
    vision_prompt: str = field(default="", metadata=_doc("Instruction sent with each image (empty: the built-in one)."))
    vision_allow_private_urls: bool = field(
        default=False, metadata=_doc("Let the vision model be given image URLs whose host is loopback, private, "
                                     "link-local, unspecified, multicast or reserved (or does not resolve). Off: "
                                     "such images are not described. Schemes other than http(s) and data: are "
                                     "never passed on.")
    )

    # --- admin ---------------------------------------------------------------------------------
    admin_key: str = field(default="", metadata=_doc("Bearer key for /memci/ admin endpoints (empty: admin API off)."))
    user_memory: bool = field(
        default=True,
        metadata=_doc("With a user id on the request: the push, recall and /memci/search also reach the same user's "
                      "other conversations (every stored page, newest first, labelled <conversation>/<page>). Never "
                      "another user's; without a user id nothing leaves its conversation."),
    )
    user_memory_timeout_ms: int = field(
        default=100, metadata=_doc("Milliseconds the search of the user's other conversations may take on a turn; "
                                   "past it the turn goes on without their round.", min=1),
    )
    user_hash_key: str = field(
        default="",
        metadata=_doc("Secret key of the keyed hash that end-user ids (X-Memci-User, safety_identifier, user, "
                      "Anthropic metadata.user_id) are stored as, per tenant; the same on every replica. Set it in "
                      "production: without it the hash is keyed by a constant, and a guessed id can be checked."),
    )

    # -------------------------------------------------------------------------------------------
    @property
    def upstream_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.upstream_url.split(",") if u.strip()]

    @property
    def home_path(self) -> Path:
        return Path(os.path.expanduser(self.home))

    def replace(self, **changes: typing.Any) -> "Settings":
        return load_settings(env={}, file_values={**dataclasses.asdict(self), **changes}, read_file=False)


def env_name(name: str) -> str:
    return ENV_ALIASES.get(name, "MEMCI_" + name.upper())


# Settings a release removed: a config file naming one still starts (a warning says why it is ignored).
RETIRED_SETTINGS = {
    "count_models_max": "token costs are learnt per conversation now (its state), not per model in each process",
}


def setting_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(Settings))


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _coerce(f: dataclasses.Field, raw: typing.Any, source: str) -> typing.Any:
    kind = f.type if isinstance(f.type, type) else {"str": str, "int": int, "float": float, "bool": bool}[str(f.type)]
    where = f"setting '{f.name}' ({source})"
    try:
        if kind is bool:
            if isinstance(raw, bool):
                value: typing.Any = raw
            elif isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                value = raw.strip().lower() in _TRUE
            else:
                raise ValueError(f"expected true/false, got {raw!r}")
        elif kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(f"expected an integer, got {raw!r}")
            value = int(raw)
        elif kind is float:
            if isinstance(raw, bool):
                raise ValueError(f"expected a number, got {raw!r}")
            value = float(raw)
        else:
            if not isinstance(raw, (str, int, float)):
                raise ValueError(f"expected text, got {raw!r}")
            value = str(raw)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{where}: {exc}") from None
    meta = f.metadata
    if "min" in meta and value < meta["min"]:
        raise SettingsError(f"{where}: {value!r} is below the minimum {meta['min']}")
    if "max" in meta and value > meta["max"]:
        raise SettingsError(f"{where}: {value!r} is above the maximum {meta['max']}")
    if "choices" in meta and value not in meta["choices"]:
        raise SettingsError(f"{where}: {value!r} is not one of {', '.join(meta['choices'])}")
    return value


def read_config_file(path: str | Path) -> dict[str, typing.Any]:
    p = Path(os.path.expanduser(str(path)))
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise SettingsError(f"setting 'config': file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"setting 'config': {p} is not valid TOML: {exc}") from None
    flat: dict[str, typing.Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):  # sections are for humans; names are unique across them
            flat.update(value)
        else:
            flat[key] = value
    return flat


def load_settings(
    env: typing.Mapping[str, str] | None = None,
    overrides: typing.Mapping[str, typing.Any] | None = None,
    file_values: typing.Mapping[str, typing.Any] | None = None,
    read_file: bool = True,
) -> Settings:
    """Build the settings: overrides (CLI flags) > env > config file > defaults."""
    return load_settings_with_sources(env, overrides, file_values, read_file)[0]


def load_settings_with_sources(
    env: typing.Mapping[str, str] | None = None,
    overrides: typing.Mapping[str, typing.Any] | None = None,
    file_values: typing.Mapping[str, typing.Any] | None = None,
    read_file: bool = True,
) -> tuple[Settings, dict[str, str]]:
    """The settings and, for each value not left at its default, where it came from ("env MEMCI_PORT", ...)."""
    env = os.environ if env is None else env
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    known = {f.name: f for f in setting_fields()}
    values: dict[str, typing.Any] = {}
    sources: dict[str, str] = {}

    file_label = "config file"
    if read_file:
        config_path = overrides.get("config") or env.get(env_name("config")) or ""
        file_path = config_path or (str(DEFAULT_CONFIG_FILE) if DEFAULT_CONFIG_FILE.exists() else "")
        if file_path:
            file_values = {**(file_values or {}), **read_config_file(file_path)}
            if config_path:
                values["config"] = config_path
            else:
                file_label = "default config file"
    for key, raw in (file_values or {}).items():
        if key in RETIRED_SETTINGS:
            logging.getLogger("memci.settings").warning("setting '%s' (%s) is ignored: %s", key, file_label,
                                                        RETIRED_SETTINGS[key])
            continue
        if key not in known:
            raise SettingsError(f"setting '{key}' ({file_label}): unknown setting")
        values[key] = raw
        sources[key] = file_label
    for name in known:
        var = env_name(name)
        if var in env:
            values[name] = env[var]
            sources[name] = f"env {var}"
    for key, raw in overrides.items():
        if key not in known:
            raise SettingsError(f"setting '{key}': unknown setting")
        values[key] = raw
        sources[key] = "command line"

    coerced = {k: _coerce(known[k], v, sources.get(k, "default")) for k, v in values.items()}
    settings = Settings(**coerced)
    _check(settings)
    return settings, sources


def _check(s: Settings) -> None:
    if s.active_low_watermark >= s.active_high_watermark:
        raise SettingsError(
            f"setting 'active_low_watermark': {s.active_low_watermark} must be below "
            f"active_high_watermark ({s.active_high_watermark})"
        )
    if not s.upstream_urls:
        raise SettingsError("setting 'upstream_url': no URL given")
    for url in s.upstream_urls:
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"setting 'upstream_url': {url!r} is not an http(s) URL")
    if not s.recall_tool_name.replace("_", "").replace("-", "").isalnum():
        raise SettingsError(f"setting 'recall_tool_name': {s.recall_tool_name!r} is not a valid function name")
    for name in ("database_url",):
        url = getattr(s, name)
        if url and not url.startswith(("postgresql", "postgres")):
            raise SettingsError(f"setting '{name}': {url!r} is not a postgresql:// URL")
    if s.redis_url and not s.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(f"setting 'redis_url': {s.redis_url!r} is not a redis:// URL")
