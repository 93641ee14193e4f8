"""Consistency of the deployment files (Dockerfile, compose.yaml, Prometheus, Grafana) with the code.

Everything here is checked without Docker: the files parse, and the names and ports they use are the ones
the proxy really has (settings, CLI subcommands, metric names).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from memci_proxy import settings as proxy_settings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config"

# The proxy's metric names (prometheus-client exposition names).
PROXY_COUNTERS = {
    "memci_requests_total",
    "memci_upstream_prompt_tokens_total",
    "memci_upstream_cached_tokens_total",
    "memci_prefix_reuse_tokens_total",
    "memci_compaction_epochs_total",
    "memci_pages_archived_total",
    "memci_evictions_total",
    "memci_tokens_saved_total",
    "memci_recall_calls_total",
    "memci_over_budget_total",
    "memci_engine_errors_total",
}
PROXY_HISTOGRAMS = {
    "memci_request_duration_seconds",
    "memci_upstream_ttft_seconds",
    "memci_proxy_overhead_seconds",
    "memci_turn_stage_seconds",
}
PROXY_GAUGES = {"memci_inflight_streams"}
# SGLang's (--enable-metrics), names as its production-metrics documentation gives them.
SGLANG_METRICS = {"sglang:prompt_tokens_total", "sglang:cached_tokens_total"}
SGLANG_HISTOGRAMS = {"sglang:time_to_first_token_seconds"}

PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}


# --- helpers -----------------------------------------------------------------------------------------

def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def compose() -> dict[str, Any]:
    return load_yaml(ROOT / "compose.yaml")


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def command_words(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)  # line continuations
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_exec_form(instruction: str) -> list[str]:
    values = [rest for word, rest in dockerfile_instructions() if word == instruction]
    assert values, f"Dockerfile has no {instruction}"
    parsed = json.loads(values[-1])  # the last one wins, as in Docker
    assert isinstance(parsed, list), f"{instruction} must use the exec (JSON array) form"
    return parsed


def option_value(words: list[str], option: str) -> str | None:
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    return None


def cli_subcommands() -> set[str]:
    from memci_proxy.cli import build_parser

    parser = build_parser()
    for action in parser._actions:  # argparse keeps subparsers as an action
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("build_parser() has no subcommands")


def known_env_names() -> set[str]:
    return {proxy_settings.env_name(f.name) for f in proxy_settings.setting_fields()}


def promql_metric_names(expr: str) -> set[str]:
    """Metric (or recording rule) names a PromQL expression reads."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range selectors
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?[0-9][0-9smhdwy]*", " ", s)  # offset modifiers
    s = re.sub(r"(?<![A-Za-z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", " ", s)  # numbers
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        token = match.group(0)
        if s[match.end():].lstrip().startswith("("):
            continue  # a function call
        if token in PROMQL_KEYWORDS:
            continue
        names.add(token)
    return names


def rules() -> list[dict[str, Any]]:
    doc = load_yaml(CONFIG / "prometheus-rules.yml")
    return [rule for group in doc["groups"] for rule in group["rules"]]


def recording_rule_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def exposed_proxy_metric_names() -> set[str]:
    """Sample names the proxy's registry exposes at /metrics."""
    from memci_proxy.metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def raw_metric_names() -> set[str]:
    names = PROXY_COUNTERS | PROXY_GAUGES | SGLANG_METRICS | exposed_proxy_metric_names()
    for histogram in PROXY_HISTOGRAMS | SGLANG_HISTOGRAMS:
        names |= {histogram + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def dashboard() -> dict[str, Any]:
    return json.loads((CONFIG / "grafana" / "dashboards" / "memci.json").read_text(encoding="utf-8"))


def dashboard_panels() -> list[dict[str, Any]]:
    out = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside collapsed rows
    return out


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", []) if t.get("expr")]


# --- the metric names the deployment files rely on ----------------------------------------------------

def test_the_proxy_exposes_the_metrics_the_dashboards_rely_on() -> None:
    exposed = exposed_proxy_metric_names()
    expected = PROXY_COUNTERS | PROXY_GAUGES | {h + "_bucket" for h in PROXY_HISTOGRAMS}
    missing = expected - exposed
    assert not missing, f"memci_proxy.metrics does not expose {sorted(missing)}"


# --- the files parse --------------------------------------------------------------------------------

YAML_FILES = [
    ROOT / "compose.yaml",
    CONFIG / "prometheus.yml",
    CONFIG / "prometheus-rules.yml",
    *sorted((CONFIG / "grafana").rglob("*.yml")),
    *sorted((CONFIG / "grafana").rglob("*.yaml")),
]


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_files_parse_to_mappings(path: Path) -> None:
    assert isinstance(load_yaml(path), dict)


def test_grafana_json_files_parse() -> None:
    files = sorted((CONFIG / "grafana").rglob("*.json"))
    assert files, "no Grafana dashboard JSON"
    for path in files:
        assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict), path


def test_compose_has_the_stack() -> None:
    services = compose()["services"]
    for name in ("proxy", "postgres", "redis", "sglang", "prometheus", "grafana", "emulator"):
        assert name in services, f"compose.yaml lacks service {name}"
    assert services["postgres"]["image"].startswith("pgvector/pgvector:pg16")
    assert services["redis"]["image"].startswith("redis:7")
    assert services["sglang"]["image"].startswith("lmsysorg/sglang")


def test_compose_bind_mounts_exist_in_the_repository() -> None:
    for name, svc in compose()["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"


# --- compose and settings ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["proxy", "migrate"])
def test_compose_passes_only_known_settings_to_the_proxy(name: str) -> None:
    services = compose()["services"]
    if name not in services:
        pytest.skip(f"no {name} service")
    unknown = set(environment(services[name])) - known_env_names()
    assert not unknown, f"compose passes {sorted(unknown)} to {name}, which are not settings"


def test_compose_proxy_env_points_at_the_stack() -> None:
    env = environment(service("proxy"))
    assert "sglang:30000/v1" in env["MEMCI_UPSTREAM_URL"]
    assert env["DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in env["DATABASE_URL"]
    assert env["REDIS_URL"].startswith("redis://redis:6379")


def test_compose_proxy_env_values_are_valid_settings() -> None:
    env = {k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v) for k, v in environment(service("proxy")).items()}
    proxy_settings.load_settings(env=env, read_file=False)  # raises SettingsError on a bad value


def test_proxy_port_is_the_same_everywhere() -> None:
    default_port = proxy_settings.Settings().port
    exposed = [rest for word, rest in dockerfile_instructions() if word == "EXPOSE"]
    assert exposed == [str(default_port)]
    cmd = dockerfile_exec_form("CMD")
    assert option_value(cmd, "--port") == str(default_port)
    ports = [str(p) for p in service("proxy")["ports"]]
    assert any(p.rsplit(":", 1)[-1] == str(default_port) for p in ports), ports
    compose_cmd = command_words(service("proxy"))
    if compose_cmd:
        assert option_value(compose_cmd, "--port") in (None, str(default_port))


def test_migrations_run_before_the_proxy_serves() -> None:
    services = compose()["services"]
    proxy_cmd = " ".join(command_words(services["proxy"]))
    if "migrate" in proxy_cmd:
        assert proxy_cmd.index("migrate") < proxy_cmd.index("serve")
        return
    depends = services["proxy"].get("depends_on", {})
    migrators = [n for n, s in services.items() if command_words(s)[:1] == ["migrate"]]
    assert migrators, "nothing runs `memci-proxy migrate`"
    for name in migrators:
        assert depends.get(name, {}).get("condition") == "service_completed_successfully"


def test_compose_proxy_waits_for_healthy_postgres_and_redis() -> None:
    depends = service("proxy")["depends_on"]
    for name in ("postgres", "redis"):
        assert depends[name]["condition"] == "service_healthy"
        assert "healthcheck" in service(name)
    assert "pg_isready" in json.dumps(service("postgres")["healthcheck"]["test"])


# --- Dockerfile and CLI -----------------------------------------------------------------------------

def test_dockerfile_base_user_volume_and_healthcheck() -> None:
    instructions = dockerfile_instructions()
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert froms and all(f.startswith("python:3.11-slim") for f in froms)
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must not run as root"
    env_text = " ".join(rest for word, rest in instructions if word == "ENV")
    assert re.search(r"\bMEMCI_HOME=/data\b", env_text)
    assert any(word == "VOLUME" and "/data" in rest for word, rest in instructions)
    health = [rest for word, rest in instructions if word == "HEALTHCHECK"]
    assert health and "/health" in health[-1] and "urllib" in health[-1]
    assert "curl" not in health[-1] and "wget" not in health[-1]  # neither is in python:3.11-slim
    assert any(word == "RUN" and re.search(r"pip (install|wheel)\b.*(\s\.$|\s\.\s|\.whl)", rest) for word, rest in instructions)


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for word, rest in dockerfile_instructions():
        if word == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word, rest))
    return stages


def copy_sources(rest: str) -> list[str]:
    words = [w for w in shlex.split(rest) if not w.startswith("--")]
    return words[:-1]


def test_dockerfile_builds_a_wheel_and_runs_it_without_the_source_tree() -> None:
    from memci_proxy import package_data

    build, runtime = dockerfile_stages()[0], dockerfile_stages()[-1]
    assert len(dockerfile_stages()) >= 2, "build the wheel in a builder stage"
    build_runs = " ".join(rest for word, rest in build if word == "RUN")
    assert re.search(r"pip wheel\b.*\s\.(\s|$)", build_runs), "the builder stage builds the wheel"
    assert re.search(r"pip install\s+\S*\.whl", build_runs), "the builder stage installs the built wheel"
    assert "-e" not in shlex.split(build_runs), "an editable install would need the source tree at run time"
    # the builder gets what the wheel is made of: the build hook, the package and the files it ships
    copied = {src.rstrip("/").removeprefix("./") for word, rest in build if word == "COPY" for src in copy_sources(rest)}
    for needed in ("pyproject.toml", "setup.py", "memci_proxy"):
        assert needed in copied, f"the builder stage does not copy {needed}"
    for shipped in package_data.SHIPPED:
        assert any(shipped == c or shipped.startswith(c + "/") for c in copied), f"the wheel would lack {shipped}"
    for source in copied:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"
    # the runtime stage copies only the installed virtualenv, never the checkout
    runtime_copies = [rest for word, rest in runtime if word == "COPY"]
    assert runtime_copies and all(rest.startswith("--from=") for rest in runtime_copies), runtime_copies
    assert any(word == "RUN" and "is_checkout()" in rest for word, rest in runtime), "check the wheel's data at build"


def test_the_sdist_and_the_image_carry_the_shipped_files() -> None:
    from memci_proxy import package_data

    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8")
    included = set()
    for line in manifest.splitlines():
        words = line.split()
        if words and words[0] in ("include", "graft"):
            included |= set(words[1:])
    for shipped in package_data.SHIPPED:
        assert any(shipped == i or shipped.startswith(i + "/") for i in included), f"MANIFEST.in lacks {shipped}"
        assert (ROOT / shipped).exists(), shipped
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()}
    assert {".git", ".venv"} <= ignored
    assert not any(shipped in ignored for shipped in package_data.SHIPPED)


def test_package_data_finds_the_checkout_files_in_a_checkout() -> None:
    from memci_proxy import package_data
    from memci_proxy.settings import DEFAULT_CONFIG_FILE
    from memci_proxy.store.sql.migrate import MIGRATIONS_DIR

    assert package_data.is_checkout()
    assert DEFAULT_CONFIG_FILE == ROOT / "config" / "default.toml"
    assert MIGRATIONS_DIR == ROOT / "migrations" and (MIGRATIONS_DIR / "env.py").is_file()


def test_dockerfile_runs_the_console_script_with_a_known_subcommand() -> None:
    assert dockerfile_exec_form("ENTRYPOINT") == ["memci-proxy"]
    cmd = dockerfile_exec_form("CMD")
    assert cmd[0] == "serve"
    assert cmd[0] in cli_subcommands()
    assert option_value(cmd, "--host") == "0.0.0.0"


def test_console_script_is_declared() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"]["memci-proxy"] == "memci_proxy.cli:main"


def test_compose_proxy_image_commands_are_known_subcommands() -> None:
    known = cli_subcommands()
    for name, svc in compose()["services"].items():
        if "build" not in svc:
            continue  # not the proxy image
        words = command_words(svc)
        if not words:
            continue
        if words[:2] == ["sh", "-c"]:
            for part in re.split(r"&&|;", words[2]):
                part_words = shlex.split(part)
                assert part_words[0] == "memci-proxy" and part_words[1] in known, (name, part)
        else:
            assert words[0] in known, f"service {name} runs unknown subcommand {words[0]!r}"


def test_emulator_service_runs_the_emulate_subcommand_under_its_profile() -> None:
    emulator = service("emulator")
    words = command_words(emulator)
    assert "emulate" in words
    assert option_value(words, "--port") == "30000"
    assert "emulator" in emulator.get("profiles", [])


# --- SGLang -----------------------------------------------------------------------------------------

def test_sglang_reports_cache_and_metrics_on_a_gpu() -> None:
    sglang = service("sglang")
    words = command_words(sglang)
    assert "--enable-cache-report" in words
    assert "--enable-metrics" in words
    assert option_value(words, "--port") == "30000"
    assert option_value(words, "--host") == "0.0.0.0"
    assert "SGLANG_MODEL" in (option_value(words, "--model-path") or "")
    devices = sglang["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d.get("capabilities", []) for d in devices)
    assert "HF_TOKEN" in environment(sglang)
    assert any("huggingface" in str(v) for v in sglang.get("volumes", []))


# --- Prometheus -------------------------------------------------------------------------------------

def scrape_targets() -> dict[str, list[str]]:
    doc = load_yaml(CONFIG / "prometheus.yml")
    return {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in doc["scrape_configs"]
    }


def test_prometheus_scrapes_the_proxy_and_sglang_ports() -> None:
    targets = [t for ts in scrape_targets().values() for t in ts]
    assert f"proxy:{proxy_settings.Settings().port}" in targets
    assert "sglang:30000" in targets


def test_prometheus_loads_the_rules_file_compose_mounts() -> None:
    doc = load_yaml(CONFIG / "prometheus.yml")
    mounts = [v for v in service("prometheus")["volumes"] if isinstance(v, str)]
    mounted = {v.split(":")[1] for v in mounts if v.startswith("./config/prometheus")}
    assert set(doc["rule_files"]) <= mounted
    assert any(v.startswith("./config/prometheus-rules.yml:") for v in mounts)


def test_recording_rules_compute_hit_rates_as_counter_ratios() -> None:
    by_name = {rule["record"]: rule["expr"] for rule in rules() if "record" in rule}
    proxy = by_name["memci:upstream_cache_hit_rate:5m"]
    assert re.search(r"rate\(memci_upstream_cached_tokens_total\[5m\]\).*/.*rate\(memci_upstream_prompt_tokens_total\[5m\]\)", proxy, re.S)
    sglang = by_name["sglang:cache_hit_rate:5m"]
    assert re.search(r"rate\(sglang:cached_tokens_total\[5m\]\).*/.*rate\(sglang:prompt_tokens_total\[5m\]\)", sglang, re.S)
    assert "memci_tokens_saved_total" in by_name["memci:tokens_saved:rate5m"]
    assert "memci_compaction_epochs_total" in by_name["memci:compaction_epochs:rate5m"]


def test_rules_read_only_known_metrics() -> None:
    allowed = raw_metric_names() | recording_rule_names()
    for rule in rules():
        unknown = promql_metric_names(rule["expr"]) - allowed
        assert not unknown, f"{rule.get('record') or rule.get('alert')} reads unknown metrics {sorted(unknown)}"


# --- Grafana ----------------------------------------------------------------------------------------

def test_promql_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(memci_request_duration_seconds_bucket{status=~"5.."}[5m])))'
        " / on (route) group_left memci:x:rate5m - 1e-9 * sglang:cached_tokens_total offset 5m"
    )
    assert promql_metric_names(expr) == {"memci_request_duration_seconds_bucket", "memci:x:rate5m", "sglang:cached_tokens_total"}


def test_dashboard_queries_use_only_known_metrics_and_rules() -> None:
    allowed = raw_metric_names() | recording_rule_names()
    exprs = dashboard_exprs()
    assert exprs
    for expr in exprs:
        unknown = promql_metric_names(expr) - allowed
        assert not unknown, f"dashboard query {expr!r} reads unknown metrics {sorted(unknown)}"


def test_dashboard_covers_what_an_operator_watches() -> None:
    used = set().union(*(promql_metric_names(e) for e in dashboard_exprs()))
    rule_exprs = {rule["record"]: rule["expr"] for rule in rules() if "record" in rule}
    # a recording rule stands for the metrics it reads
    for name in list(used):
        if name in rule_exprs:
            used |= promql_metric_names(rule_exprs[name])
    base = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    expected = PROXY_COUNTERS | PROXY_HISTOGRAMS | PROXY_GAUGES | SGLANG_METRICS
    missing = expected - base
    assert not missing, f"the dashboard shows nothing of {sorted(missing)}"


def test_dashboard_uses_the_provisioned_datasource() -> None:
    datasources = load_yaml(CONFIG / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    uids = {d["uid"] for d in datasources}
    assert any(d["url"] == "http://prometheus:9090" for d in datasources)
    for panel in dashboard_panels():
        if panel.get("type") == "row":
            continue
        assert panel["datasource"]["uid"] in uids, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] in uids


def test_dashboard_panel_ids_are_unique() -> None:
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids))


def test_grafana_provisions_the_mounted_dashboard_folder() -> None:
    providers = load_yaml(CONFIG / "grafana" / "provisioning" / "dashboards" / "memci.yml")["providers"]
    paths = {p["options"]["path"] for p in providers}
    mounts = {v.split(":")[1] for v in service("grafana")["volumes"] if isinstance(v, str) and v.startswith("./config/grafana/dashboards")}
    assert paths & mounts, (paths, mounts)
    assert any(v.startswith("./config/grafana/provisioning:/etc/grafana/provisioning") for v in service("grafana")["volumes"])
