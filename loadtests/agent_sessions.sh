#!/usr/bin/env bash
# Whole sessions of the real agent CLIs through the proxy, against a strict emulator at a given window:
# Claude Code (`claude -p`, then `--continue`) or Codex (`codex exec`, then `exec resume --last`), each turn a prompt
# whose [[call:...]] marker makes the emulator call the agent's shell tool on a 4-5 KB slice of a build log; the agent
# runs it and sends the output back. Prints: turns answered, upstream refusals (prompt + max_tokens over the window,
# resent by the proxy), epochs, pages archived, the turns' hit rate (the proxy's memci_upstream_* counters) and the
# whole session's (the emulator's, memory jobs included).
#
#   loadtests/agent_sessions.sh claude 32768 30      # needs npm (the CLIs are installed under $AGENTS_DIR once)
#   loadtests/agent_sessions.sh codex 16384 30
#
# AGENTS_DIR (default ~/.cache/memci-agents) keeps the npm installs; CLAUDE_CODE_VERSION / CODEX_VERSION pin them.
# EMULATOR_MODEL_DIR: a model's tokenizer.json and chat template for the emulator (its --model-dir), so that the
# window is counted in that model's tokens rather than the built-in tokenizer's (which counts JSON's punctuation one
# token a mark: about twice a BPE tokenizer's count of a tools schema). EMULATOR_CHAT_TEMPLATE replaces its chat
# template, e.g. loadtests/chatml_tools.jinja (ChatML rendering the tools' schemas in the system turn, as tool-calling
# models' templates do; SmolLM2's own template leaves the tools out):
#   EMULATOR_MODEL_DIR=~/.cache/memci-real-sglang/model EMULATOR_CHAT_TEMPLATE=loadtests/chatml_tools.jinja \
#     loadtests/agent_sessions.sh codex 16384 30
set -euo pipefail
agent=${1:?claude or codex}; window=${2:-32768}; turns=${3:-30}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
agents_dir=${AGENTS_DIR:-$HOME/.cache/memci-agents}
cc_version=${CLAUDE_CODE_VERSION:-2.1.332}; codex_version=${CODEX_VERSION:-0.171.0}
if [ ! -x "$agents_dir/node_modules/.bin/claude" ] || [ ! -x "$agents_dir/node_modules/.bin/codex" ]; then
  mkdir -p "$agents_dir"
  npm install --no-audit --no-fund --prefix "$agents_dir" "@anthropic-ai/claude-code@$cc_version" \
    "@openai/codex@$codex_version" >&2
fi
work=$(mktemp -d /tmp/memci-agent-session-XXXX)
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
emu_port=$(free_port); proxy_port=$(free_port)
cleanup() { kill -- -"$emu_pid" -"$proxy_pid" 2>/dev/null || true; }
trap cleanup EXIT
emu_args=()
if [ -n "${EMULATOR_MODEL_DIR:-}" ]; then
  mkdir -p "$work/model"
  for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -f "$EMULATOR_MODEL_DIR/$f" ] && ln -s "$(cd "$EMULATOR_MODEL_DIR" && pwd)/$f" "$work/model/$f"
  done
  if [ -n "${EMULATOR_CHAT_TEMPLATE:-}" ]; then
    rm -f "$work/model/chat_template.jinja"; cp "$EMULATOR_CHAT_TEMPLATE" "$work/model/chat_template.jinja"
  fi
  emu_args=(--model-dir "$work/model")
fi
(cd "$repo" && exec setsid "$python" -m memci_proxy.emulator --port "$emu_port" --max-model-len "$window" "${emu_args[@]}") \
  > "$work/emulator.log" 2>&1 & emu_pid=$!
for _ in $(seq 1 60); do curl -sf "127.0.0.1:$emu_port/health" >/dev/null && break; sleep 1; done
(cd "$repo" && MEMCI_HOME="$work/home" MEMCI_LOG_LEVEL=warning DATABASE_URL= REDIS_URL= MEMCI_CONFIG= \
  exec setsid "$python" -m memci_proxy.cli serve --host 127.0.0.1 --port "$proxy_port" \
  --upstream "http://127.0.0.1:$emu_port/v1") > "$work/proxy.log" 2>&1 & proxy_pid=$!
for _ in $(seq 1 120); do curl -sf "127.0.0.1:$proxy_port/ready" >/dev/null && break; sleep 1; done
for i in $(seq 1 200); do
  echo "line $i of the build log: compiling module_$i.c with flags -O2 -Wall -Wextra; linking object_$i.o"
done > "$work/build.log"
export HOME="$work/agent-home"; mkdir -p "$HOME/.codex"
export ANTHROPIC_BASE_URL="http://127.0.0.1:$proxy_port" ANTHROPIC_AUTH_TOKEN=sk-session \
  ANTHROPIC_MODEL=memci-emulator ANTHROPIC_SMALL_FAST_MODEL=memci-emulator CLAUDE_CODE_ATTRIBUTION_HEADER=0 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 MEMCI_CLIENT_KEY=sk-session
cat > "$HOME/.codex/config.toml" <<TOML
model = "memci-emulator"
model_provider = "memci"
model_context_window = 1000000

[model_providers.memci]
name = "Memci proxy"
base_url = "http://127.0.0.1:$proxy_port/v1"
wire_api = "responses"
env_key = "MEMCI_CLIENT_KEY"
TOML
cd "$work"
answered=0
for i in $(seq 1 "$turns"); do
  start=$(( (i * 37) % 150 + 1 )); cmd="sed -n '${start},$((start + 45))p' build.log"
  if [ "$agent" = claude ]; then
    prompt="Step $i: show the part of the build log I need. [[call:Bash {\"command\": \"$cmd\", \"description\": \"read the log\"}]]"
    args=(-p "$prompt"); [ "$i" -gt 1 ] && args+=(--continue)
    if timeout 300 "$agents_dir/node_modules/.bin/claude" "${args[@]}" --allowedTools=Bash > "turn-$i.out" 2>&1; then
      answered=$((answered + 1)); fi
  else
    prompt="Step $i: show the part of the build log I need. [[call:exec_command {\"cmd\": \"$cmd\"}]]"
    if [ "$i" = 1 ]; then args=(exec --skip-git-repo-check "$prompt")
    else args=(exec --skip-git-repo-check resume --last "$prompt"); fi
    if timeout 300 "$agents_dir/node_modules/.bin/codex" "${args[@]}" > "turn-$i.out" 2>&1; then
      answered=$((answered + 1)); fi
  fi
  echo "turn $i: $(tail -c 100 "turn-$i.out" | tr '\n' ' ')" >&2
done
sleep 8  # the memory workers' last jobs
curl -s "127.0.0.1:$proxy_port/metrics" > metrics.txt
curl -s "127.0.0.1:$emu_port/emulator/stats" > stats.json
"$python" - "$agent" "$window" "$turns" "$answered" "$repo" <<'PY'
import json, sys
agent, window, turns, answered = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from loadtests.replicas import metric_sum
metrics = [open("metrics.txt").read()]
get = lambda name: metric_sum(metrics, name)
stats = json.load(open("stats.json"))
refusals = sum("status 400" in line for line in open("proxy.log"))
prompt, cached = get("memci_upstream_prompt_tokens_total"), get("memci_upstream_cached_tokens_total")
print(f"{agent} at a {window:,}-token window: {answered}/{turns} turns answered, "
      f"{get('memci_requests_total'):.0f} requests, {refusals} upstream refusals (resent: "
      f"{get('memci_turn_resends_total'):.0f}), {get('memci_compaction_epochs_total'):.0f} epochs, "
      f"{get('memci_pages_archived_total'):.0f} pages archived, max_tokens lowered {get('memci_max_tokens_lowered_total'):.0f}; "
      f"turns' hit rate {cached / max(1.0, prompt):.4f} ({cached:,.0f} of {prompt:,.0f}); whole session, memory jobs "
      f"included: {stats['cached_tokens'] / max(1, stats['prompt_tokens']):.4f}")
PY
echo "logs: $work" >&2
