"""Peers benchmark: this proxy (pass-through and managed) beside the LiteLLM proxy and Headroom, on a long chat and
an agent loop, turn by turn.

Each target gets its own upstream emulator (``memci-proxy emulate``): the managed proxy's has the workload's window
(``--chat-window`` 8192, ``--agent-window`` 32768), the others' are unbounded (they forward whole histories). One
more emulator answers every request body a second time, straight: the added latency of a request is its time
through the target minus its twin's time direct. Targets are interleaved: request n of the workload goes to every
target (in a rotating order) before request n+1, so the machine's drift weighs on all of them alike.

Per workload and target: CPU per request of the target's process tree (children included: the managed proxy's
embedded PostgreSQL), over the whole run (from the first measured request to a few seconds after the last, so
background work counts) and within its own requests only; p50 latency and the added p50 / p99; prompt tokens its
emulator received and the cached share of them (Σ cached / Σ prompt, the emulator's radix-cache accounting).

The peers run from virtualenvs of their own that the benchmark creates on first use under ``--cache-dir``
(``peer_venvs.py``: pinned versions, printed); a peer that fails to install or start is skipped with the reason.

    python loadtests/peers.py                                   # chat (150 turns) and agent (120 requests), all
    python loadtests/peers.py --targets passthrough,managed --turns 5
    python loadtests/peers.py --workloads agent --json /tmp/peers.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from loadtests.bench_servers import counters, empty_when_idle
from loadtests.overhead import Server, free_port, group_cpu_seconds, groups_with, litellm_config
from loadtests.peer_lanes import MODEL, Conversation
from loadtests.peer_venvs import DEFAULT_CACHE, PEERS, PeerInstall, ensure_peer
from loadtests.peers_report import TARGET_KEYS, RequestRecord, Row, Totals, cpu_target, markdown, summarise
from loadtests.progress import Progress
from loadtests.workloads import make_workload

REPO = Path(__file__).resolve().parents[1]
UNBOUNDED_WINDOW = 10_000_000
DEFAULT_TURNS = {"chat": 150, "agent": 120}
AGENT_OUTPUT_CHARS = (2_000, 21_000)
HEADERS = {"Authorization": "Bearer peers-bench"}
# Headroom as it ships (mode "cache": prior turns frozen, the newest compressed; its structural compressors on)
# except what needs the internet or would throttle a benchmark: Kompress, its ML text compressor, loads a model from
# a hub (this machine reaches package registries only: --disable-kompress), the default limit of 60 requests a
# minute, the Anthropic subscription poller and telemetry.
HEADROOM_FLAGS = ("--disable-kompress", "--no-rate-limit", "--no-subscription-tracking", "--no-telemetry")
HEADROOM_ENV = {"HEADROOM_TELEMETRY": "off", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@dataclass
class Target:
    name: str
    server: Server
    base: str  # the /v1 base URL clients use
    emulator: Server | None  # None: in front of a real server (--upstream), shared by every target
    upstream_root: str  # the root URL of its emulator, or of the real server
    home: Path | None = None  # the proxy's MEMCI_HOME (its embedded PostgreSQL's command line names it)
    groups: set[int] = field(default_factory=set)
    database: set[int] = field(default_factory=set)  # the embedded PostgreSQL's process groups (in ``groups`` too)
    client: httpx.Client | None = None

    def find_groups(self) -> None:
        self.database = groups_with(str(self.home)) - {self.server.pid()} if self.home else set()
        self.groups = {self.server.pid()} | self.database

    def cpu(self) -> float:
        return sum(group_cpu_seconds(g) for g in self.groups)

    def database_cpu(self) -> float:
        return sum(group_cpu_seconds(g) for g in self.database)

    def totals(self) -> Totals:
        if self.emulator is None:
            return engine_totals(self.upstream_root)
        stats = httpx.get(self.upstream_root + "/emulator/stats", timeout=30).json()
        return Totals(stats["requests"], stats["prompt_tokens"], stats["cached_tokens"])

    def stop(self) -> None:
        self.server.stop()
        if self.emulator is not None:
            self.emulator.stop()


ENGINE_COUNTERS = ("sglang:num_requests_total", "sglang:prompt_tokens_total", "sglang:cached_tokens_total")


def engine_totals(root: str) -> Totals:
    """A real server's own counters (SGLang started with --enable-metrics): requests, prompt and cached tokens."""
    found = counters(root + "/metrics", ENGINE_COUNTERS)
    return Totals(*(int(found[name]) for name in ENGINE_COUNTERS))


def emulator(python: str, workdir: Path, name: str, window: int) -> tuple[Server, str]:
    port = free_port()
    server = Server(name, [python, "-m", "memci_proxy.cli", "emulate", "--port", str(port), "--max-model-len", str(window)],
                    f"http://127.0.0.1:{port}/health", log_dir=workdir, cwd=REPO)
    server.start(timeout=60)
    return server, f"http://127.0.0.1:{port}"


def target_command(key: str, python: str, upstream: str, workdir: Path, peers: dict[str, PeerInstall]
                   ) -> tuple[list[str], str, dict[str, str], Path | None]:
    """(command, health path, environment, MEMCI_HOME) of a target in front of ``upstream`` (its /v1 base URL)."""
    port = free_port()
    if key in ("passthrough", "managed"):
        home = workdir / f"home-{key}"
        env = {"MEMCI_LOG_LEVEL": "warning", "DATABASE_URL": "", "REDIS_URL": "", "MEMCI_CONFIG": "",
               "MEMCI_HOME": str(home), **({"MEMCI_MANAGE_CONTEXT": "false"} if key == "passthrough" else {})}
        serve = [python, "-m", "memci_proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--upstream", upstream]
        return serve, f"http://127.0.0.1:{port}/ready", env, home
    executable = str(peers[key].executable)
    if key == "litellm":
        litellm_config(workdir / "litellm.yaml", upstream)
        return ([executable, "--config", str(workdir / "litellm.yaml"), "--host", "127.0.0.1", "--port", str(port),
                 "--num_workers", "1"], f"http://127.0.0.1:{port}/health/liveliness",
                {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}, None)
    if key == "headroom":
        (workdir / "headroom-home").mkdir(exist_ok=True)
        return ([executable, "proxy", "--host", "127.0.0.1", "--port", str(port), "--openai-api-url", upstream,
                 *HEADROOM_FLAGS], f"http://127.0.0.1:{port}/livez",  # /health also checks api.anthropic.com
                {**HEADROOM_ENV, "HOME": str(workdir / "headroom-home"), "OPENAI_API_KEY": "peers-bench"}, None)
    raise ValueError(f"unknown target {key!r}")


def start_target(key: str, python: str, workdir: Path, window: int, peers: dict[str, PeerInstall],
                 upstream: str | None = None) -> Target:
    """A target in front of its own emulator, or in front of the real server ``upstream`` (a /v1 URL)."""
    name = TARGET_KEYS[key]
    if upstream:
        emu, emu_root = None, upstream.rstrip("/").removesuffix("/v1")
    else:
        emu, emu_root = emulator(python, workdir, f"emulator-{key}", window if key == "managed" else UNBOUNDED_WINDOW)
    try:
        cmd, health, env, home = target_command(key, python, emu_root + "/v1", workdir, peers)
        server = Server(key, cmd, health, env, workdir, cwd=REPO if key in ("passthrough", "managed") else workdir)
        server.start(timeout=240)
    except (RuntimeError, OSError) as exc:
        if emu is not None:
            emu.stop()
        raise RuntimeError(str(exc)) from exc
    base = re.sub(r"/(ready|livez|health.*)$", "", health) + "/v1"
    return Target(name, server, base, emu, emu_root, home, client=httpx.Client(timeout=600, headers=HEADERS))


def post(client: httpx.Client, url: str, payload: bytes, retried: list[int] | None = None
         ) -> tuple[float, dict | None, str]:
    """(seconds until the whole answer was read, the assistant message or None, error).

    A request the server closed without any answer (a kept-alive connection it had just dropped) is sent again once,
    as the OpenAI SDK does, and timed from the new attempt (counted in ``retried``)."""
    for attempt in range(2):
        started = time.perf_counter()
        try:
            resp = client.post(url, content=payload, headers={"Content-Type": "application/json"})
            seconds = time.perf_counter() - started
            break
        except httpx.RemoteProtocolError as exc:
            if attempt == 0:
                if retried is not None:
                    retried.append(1)
                continue
            return time.perf_counter() - started, None, type(exc).__name__
        except httpx.HTTPError as exc:
            return time.perf_counter() - started, None, type(exc).__name__
    if resp.status_code != 200:
        return seconds, None, f"{resp.status_code} {resp.text[:120]}"
    try:
        return seconds, resp.json()["choices"][0]["message"], ""
    except (ValueError, KeyError, IndexError, TypeError):
        return seconds, None, "unreadable answer"


def warm_up(target: Target, direct: httpx.Client | None, direct_url: str | None) -> None:
    """One short request each way (connections, lazy imports, the embedded database), not measured."""
    body = json.dumps({"model": MODEL, "max_tokens": 16, "messages": [
        {"role": "system", "content": "Warm-up."}, {"role": "user", "content": "Hello there. [[len:8]]"}]}).encode()
    for _ in range(2):
        assert target.client is not None
        _, _, error = post(target.client, target.base + "/chat/completions", body)
        if direct is not None and direct_url is not None:
            post(direct, direct_url, body)
    if error:
        raise RuntimeError(f"warm-up request failed: {error}")


def run_workload(kind: str, turns: int, keys: list[str], args: argparse.Namespace, peers: dict[str, PeerInstall],
                 skipped: list[str]) -> tuple[list[Row], dict]:
    workload = make_workload(kind, turns, args.seed,
                             agent_output_chars=AGENT_OUTPUT_CHARS if kind == "agent" else None)
    assert workload is not None
    if args.max_tokens:
        workload = dataclasses.replace(workload, max_tokens=args.max_tokens)
    window = args.chat_window if kind == "chat" else args.agent_window
    workdir = Path(tempfile.mkdtemp(prefix=f"memci-peers-{kind}-"))
    upstream = args.upstream
    direct_emu, direct_root = (None, None) if upstream else emulator(args.python, workdir, "emulator-direct",
                                                                      UNBOUNDED_WINDOW)
    direct = None if upstream else httpx.Client(timeout=600, headers=HEADERS)
    direct_url = None if direct_root is None else direct_root + "/v1/chat/completions"
    targets: list[Target] = []
    records: dict[str, list[RequestRecord]] = {}
    info: dict = {"workload": kind, "requests": workload.requests, "window_managed": window, "notes": [],
                  "upstream": upstream}
    try:
        for key in keys:
            print(f"{kind}: starting {TARGET_KEYS[key]}", file=sys.stderr)
            try:
                target = start_target(key, args.python, workdir, window, peers, upstream)
            except RuntimeError as exc:
                reason = f"{kind}: {TARGET_KEYS[key]} did not start: {str(exc).strip().splitlines()[0][:300]}"
                skipped.append(reason)
                print(f"skipping: {reason}", file=sys.stderr)
                continue
            try:
                warm_up(target, direct, direct_url)
            except RuntimeError as exc:
                skipped.append(f"{kind}: {target.name}: {exc}")
                print(f"skipping: {kind}: {target.name}: {exc}", file=sys.stderr)
                target.stop()
                continue
            targets.append(target)
        for target in targets:
            target.find_groups()
            records[target.name] = []
        conversations = {t.name: Conversation(workload) for t in targets}
        retried: dict[str, list[int]] = {t.name: [] for t in targets}
        # Against the emulators the targets are interleaved request by request; against one real server they take
        # turns, each after its radix cache is emptied (interleaved, they would read each other's prefixes).
        groups = [[t] for t in targets] if upstream else [targets]
        rows = []
        for group in groups:
            if upstream and not empty_when_idle(group[0].upstream_root):
                info["notes"].append(f"{kind}: {upstream} did not empty its cache before {group[0].name}")
            marks = {t.name: t.totals() for t in group}
            cpu_before = {t.name: (t.cpu(), t.database_cpu()) for t in group}
            drive(kind, workload, group, conversations, records, retried, direct, direct_url, args)
            time.sleep(args.settle)  # background work the last requests left (the managed proxy's write-behind, jobs)
            for target in group:
                after, mark = target.totals(), marks[target.name]
                totals = Totals(after.requests - mark.requests, after.prompt_tokens - mark.prompt_tokens,
                                after.cached_tokens - mark.cached_tokens)
                cpu, database = cpu_before[target.name]
                row = summarise(kind, target.name, records[target.name], target.cpu() - cpu, totals,
                                database_cpu_seconds=target.database_cpu() - database if target.database else None)
                notes = []
                if breaks := conversations[target.name].breaks:
                    notes.append(f"tool loop broken {breaks} times (outputs pasted as user messages)")
                if retried[target.name]:
                    notes.append(f"{len(retried[target.name])} requests sent again (the connection closed unanswered)")
                row.note = "; ".join(notes)
                rows.append(row)
        info["records"] = {name: [asdict(r) for r in recs] for name, recs in records.items()}
        return rows, info
    finally:
        for target in targets:
            if target.client is not None:
                target.client.close()
            target.stop()
            if count := target.server.tracebacks():
                info["notes"].append(f"{kind}: {target.name} logged {count} tracebacks ({target.server.log_path})")
        if direct is not None:
            direct.close()
        if direct_emu is not None:
            direct_emu.stop()
        if info["notes"] or any(s.startswith(f"{kind}:") for s in skipped):
            info["notes"].append(f"{kind}: server logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def drive(kind: str, workload, group: list[Target], conversations: dict[str, Conversation],
          records: dict[str, list[RequestRecord]], retried: dict[str, list[int]], direct: httpx.Client | None,
          direct_url: str | None, args: argparse.Namespace) -> None:
    """Send the group's conversations to the end, request n to every target (rotating order) before n+1; each body
    also straight to ``direct_url`` when there is one (the added latency's twin)."""
    label = f"{kind}: requests to every target" if len(group) > 1 else f"{kind}: {group[0].name}"
    with Progress(workload.requests, label, bars=args.progress or None) as bar:
        step = 0
        while any(conversations[t.name].body is not None for t in group):
            order = group[step % len(group):] + group[:step % len(group)]
            for target in order:
                conversation = conversations[target.name]
                if conversation.body is None:
                    continue
                payload = json.dumps(conversation.body).encode()
                before = target.cpu()
                seconds, message, error = post(target.client, target.base + "/chat/completions", payload,
                                               retried[target.name])
                cpu = target.cpu() - before
                direct_seconds, direct_error = None, "no twin"
                if direct is not None and direct_url is not None:
                    direct_seconds, _, direct_error = post(direct, direct_url, payload)
                records[target.name].append(RequestRecord(step, seconds, None if direct_error else direct_seconds,
                                                          cpu, error))
                conversation.answer(message)
            step += 1
            bar.update(step)


def resolve_peers(keys: list[str], args: argparse.Namespace, skipped: list[str]) -> tuple[list[str], dict]:
    """The targets that can run: peers installed (or installed now) in their own virtualenvs, others skipped."""
    peers: dict[str, PeerInstall] = {}
    runnable = []
    for key in keys:
        if key not in PEERS:
            runnable.append(key)
            continue
        install = ensure_peer(PEERS[key], args.cache_dir, install=not args.no_install)
        if install.executable is None:
            skipped.append(f"{TARGET_KEYS[key]}: {install.reason}")
            print(f"skipping {TARGET_KEYS[key]}: {install.reason}", file=sys.stderr)
            continue
        print(f"{TARGET_KEYS[key]}: {install.package.distribution} {install.version} ({install.venv})", file=sys.stderr)
        peers[key] = install
        runnable.append(key)
    return runnable, peers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="passthrough,managed,litellm,headroom",
                        help="comma-separated: passthrough, managed, litellm, headroom (default all)")
    parser.add_argument("--workloads", default="chat,agent", help="chat, agent or both (default both)")
    parser.add_argument("--turns", type=int, help="requests per workload (default: chat 150, agent 120)")
    parser.add_argument("--chat-window", type=int, default=8192, help="the managed proxy's emulator window, chat")
    parser.add_argument("--agent-window", type=int, default=32768, help="the managed proxy's emulator window, agent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds after the last request whose CPU still counts (default 3)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                        help=f"where the peers' virtualenvs live (default {DEFAULT_CACHE})")
    parser.add_argument("--no-install", action="store_true", help="skip peers not installed yet instead of installing")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the proxy and the emulators")
    parser.add_argument("--progress", action="store_true", help="a progress bar on stderr even when not a terminal")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--upstream", default=None, metavar="URL",
                        help="a real server's /v1 URL (SGLang with --enable-metrics; it answers any model name) "
                             "in front of which every target runs, one target after another, the server's "
                             "cache emptied before each; tokens and cached share from its own /metrics; no added "
                             "latency (no twin)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="the requests' max_tokens (default: the workload's); a small value keeps a CPU engine's "
                             "decoding short")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.targets.split(",") if k.strip()]
    kinds = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if unknown := [k for k in keys if k not in TARGET_KEYS] + [w for w in kinds if w not in DEFAULT_TURNS]:
        parser.error(f"unknown target or workload: {', '.join(unknown)}")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_at_start = os.getloadavg()[0]
    skipped: list[str] = []
    runnable, peers = resolve_peers(keys, args, skipped)
    rows: list[Row] = []
    details = []
    for kind in kinds:
        turns = args.turns or DEFAULT_TURNS[kind]
        workload_rows, info = run_workload(kind, turns, runnable, args, peers, skipped)
        rows += workload_rows
        details.append(info)
    versions = {TARGET_KEYS[k]: f"{p.package.distribution} {p.version}" for k, p in peers.items()}
    load = f"load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    where = (f"every target in front of {args.upstream}, one after another (its own /metrics)" if args.upstream else
             f"windows of the managed proxy: chat {args.chat_window}, agent {args.agent_window}")
    print(f"## Peers, {started}, {os.cpu_count()} CPUs ({load}); {where}; agent outputs {AGENT_OUTPUT_CHARS[0]}-"
          f"{AGENT_OUTPUT_CHARS[1]} chars\n")
    if versions:
        print("Peers: " + ", ".join(f"{name} = {version}" for name, version in versions.items()) + "\n")
    print(markdown(rows))
    print("\nTarget (managed CPU per request vs LiteLLM proxy's):")
    print("\n".join(cpu_target(rows)))
    for row in rows:
        if row.note:
            print(f"\nNote: {row.workload} / {row.target}: {row.note}")
    for reason in skipped:
        print(f"\nSkipped: {reason}")
    for info in details:
        for note in info["notes"]:
            print(f"\nNote: {note}")
    if args.json:
        args.json.write_text(json.dumps({"started": started, "cpus": os.cpu_count(), "load": load, "argv": sys.argv,
                                         "versions": versions, "rows": [asdict(r) for r in rows],
                                         "skipped": skipped, "workloads": details}, indent=1))
    return 0 if rows and all(r.requests and r.errors < r.requests for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
