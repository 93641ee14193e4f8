#!/usr/bin/env bash
# The cache benchmark against a real SGLang server (GPU path).
#
#   loadtests/sglang_bench.sh --upstream http://GPU-HOST:30000/v1 [--window 8192] [cache_bench options...]
#
# Start SGLang with cache reporting, e.g.
#   python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --port 30000 \
#       --context-length 8192 --enable-cache-report --enable-metrics
# Every strategy talks to that one server; its radix cache is emptied before each strategy with
# POST /flush_cache (SGLang refuses to flush while requests are running: run nothing else against it).
# The proxy strategy starts a local `memci-proxy serve` in front of the server. Figures come from the
# responses' usage (prompt_tokens, prompt_tokens_details.cached_tokens); the sent prompts of the proxy are
# not visible, so its "verbatim" columns are n/a. Pass-through is bounded by the server's context length
# here: its turns past the window fail and are counted as errors.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"

upstream=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --upstream) upstream="$2"; shift 2 ;;
    --upstream=*) upstream="${1#--upstream=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$upstream" ]; then
  echo "usage: $0 --upstream http://HOST:PORT/v1 [--window N] [--workloads chat,agent] [--turns N] [--json OUT]" >&2
  exit 2
fi
root="${upstream%/}"
root="${root%/v1}"
if ! curl -fsS -m 5 "$root/health" >/dev/null 2>&1; then
  echo "SGLang not reachable at $root/health; nothing to do" >&2
  exit 3
fi
# The model's context length, unless --window was given.
if ! printf '%s\n' "${args[@]+"${args[@]}"}" | grep -q -- '--window'; then
  window="$(curl -fsS -m 5 "$root/v1/models" | "$python" -c 'import json,sys; d=json.load(sys.stdin)["data"][0]; print(d.get("max_model_len") or "")' || true)"
  if [ -n "$window" ]; then args+=(--window "$window"); fi
fi
if ! printf '%s\n' "${args[@]+"${args[@]}"}" | grep -q -- '--model'; then
  model="$(curl -fsS -m 5 "$root/v1/models" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])' || true)"
  if [ -n "$model" ]; then args+=(--model "$model"); fi
fi
cd "$repo"
exec "$python" loadtests/cache_bench.py --upstream "$upstream" "${args[@]+"${args[@]}"}"
