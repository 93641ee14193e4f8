"""The `memci-proxy` command: serve, emulate, migrate, settings, doctor, inspect."""

from __future__ import annotations

import argparse
import os
import sys

from memci_proxy.listen_check import PortInUse, ensure_free
from memci_proxy.log_setup import configure_logging
from memci_proxy.settings import Settings, SettingsError, env_name, load_settings

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memci-proxy", description="OpenAI-compatible context-managing proxy.")
    parser.add_argument("--version", action="version", version=f"memci-proxy {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--host", help="listen address (env MEMCI_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (env MEMCI_PORT, default 8080)")
    serve.add_argument("--upstream", dest="upstream_url", help="upstream OpenAI base URL, e.g. http://127.0.0.1:30000/v1 (env MEMCI_UPSTREAM_URL)")
    serve.add_argument("--config", help="TOML config file (env MEMCI_CONFIG)")
    serve.add_argument("--workers", type=int, help="worker processes (env MEMCI_WORKERS, default 1)")
    serve.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS,
                       help="log level (env MEMCI_LOG_LEVEL, default info; debug adds initdb and migration output)")

    emulate = sub.add_parser("emulate", help="run the upstream emulator (an OpenAI-compatible test server)")
    try:
        from memci_proxy.emulator.cli import add_arguments
    except ImportError:  # pragma: no cover - the emulator ships with the package
        add_arguments = None
    if add_arguments is not None:
        add_arguments(emulate)

    migrate = sub.add_parser("migrate", help="run the database migrations (DATABASE_URL, else the embedded database)")
    migrate.add_argument("--config", help="TOML config file (env MEMCI_CONFIG)")
    migrate.add_argument("--revision", default="head", help="target revision (default head)")
    migrate.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS,
                         help="log level (env MEMCI_LOG_LEVEL, default info; debug shows each migration step)")

    settings = sub.add_parser("settings", help="print the settings in effect (or, with --markdown, their reference page)")
    settings.add_argument("--config", help="TOML config file (env MEMCI_CONFIG)")
    settings.add_argument("--markdown", action="store_true", help="print docs/settings.md, generated from the code")

    doctor = sub.add_parser("doctor", help="check the upstream, the database and Redis; say what the proxy will do and why")
    doctor.add_argument("--config", help="TOML config file (env MEMCI_CONFIG)")
    doctor.add_argument("--upstream", dest="upstream_url", help="upstream OpenAI base URL (env MEMCI_UPSTREAM_URL)")
    doctor.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""),
                        help="key for the upstream probe when upstream_api_key is unset (env OPENAI_API_KEY)")
    doctor.add_argument("--model", default="", help="model of the probe request (default: the upstream's first)")

    inspect = sub.add_parser("inspect", help="print a conversation's last upstream prompt, its blocks coloured")
    inspect.add_argument("conversation", help="conversation id (response header X-Memci-Conversation-Id)")
    inspect.add_argument("--url", default=os.environ.get("MEMCI_URL", ""),
                         help="the running proxy (env MEMCI_URL; default: host and port of the settings, "
                              "http://127.0.0.1:8080 unless changed)")
    inspect.add_argument("--admin-key", default="", help="the proxy's admin key (default: the setting admin_key, "
                                                         "env MEMCI_ADMIN_KEY)")
    inspect.add_argument("--config", help="TOML config file (env MEMCI_CONFIG)")
    inspect.add_argument("--no-color", action="store_true", help="plain text (the default when stdout is not a terminal)")
    inspect.add_argument("--color", action="store_true", help="colour even when stdout is not a terminal")
    inspect.add_argument("--json", action="store_true", help="print the admin API's JSON instead")

    metrics = sub.add_parser("metrics", help="print the reference of the proxy's Prometheus metrics")
    metrics.add_argument("--markdown", action="store_true", help="as docs/metrics.md (the default and only format)")
    return parser


def package_version() -> str:
    """The installed package's version (its metadata, as pip installed it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memci-proxy")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _settings_from(args: argparse.Namespace) -> Settings:
    overrides = {k: getattr(args, k, None) for k in ("host", "port", "upstream_url", "config", "workers", "log_level")}
    return load_settings(overrides=overrides)


def _export(settings: Settings) -> None:
    """Put the resolved settings into the environment, where the server's worker processes read them."""
    for name, value in vars(settings).items():
        os.environ[env_name(name)] = str(value).lower() if isinstance(value, bool) else str(value)


def serve(args: argparse.Namespace) -> int:
    settings = _settings_from(args)
    configure_logging(settings.log_level)
    _export(settings)
    ensure_free(settings.host, settings.port, "the proxy")
    from granian import Granian

    Granian(
        "memci_proxy.app:create_app_from_env",
        factory=True,
        interface="asgi",
        address=settings.host,
        port=settings.port,
        workers=settings.workers,
        loop="uvloop" if sys.platform != "win32" else "asyncio",
        log_level=settings.log_level,
        backlog=2048,
    ).serve()
    return 0


def migrate(args: argparse.Namespace) -> int:
    settings = load_settings(overrides={"config": args.config, "log_level": args.log_level})
    configure_logging(settings.log_level)
    from memci_proxy.store.sql.embedded import start_embedded_postgres
    from memci_proxy.store.sql.migrate import run_migrations
    from memci_proxy.store.sql.urls import redact, to_async_url

    embedded = None
    if settings.database_url:
        url = to_async_url(settings.database_url)
    else:
        embedded = start_embedded_postgres(settings.home_path / "pg")
        url = embedded.async_url
    try:
        run_migrations(url, args.revision)
    finally:
        if embedded is not None:
            embedded.stop()
    print(f"migrated {'embedded' if embedded else 'external'} database {redact(url)} to {args.revision}")
    return 0


def show_settings(args: argparse.Namespace) -> int:
    from memci_proxy.settings import load_settings_with_sources
    from memci_proxy.settings_doc import markdown, resolved

    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    settings, sources = load_settings_with_sources(overrides={"config": args.config})
    sys.stdout.write(resolved(settings, sources))
    return 0


def doctor(args: argparse.Namespace) -> int:
    from memci_proxy import doctor as checks

    settings = load_settings(overrides={"config": args.config, "upstream_url": args.upstream_url})
    return checks.run(settings, api_key=args.api_key, model=args.model)


def inspect_prompt(args: argparse.Namespace) -> int:
    from memci_proxy import prompt_view

    settings = load_settings(overrides={"config": args.config})
    admin_key = args.admin_key or settings.admin_key
    host = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host
    url = args.url or f"http://{host}:{settings.port}"
    if not admin_key:
        print("memci-proxy inspect: the admin key is needed (--admin-key or MEMCI_ADMIN_KEY)", file=sys.stderr)
        return 2
    try:
        view = prompt_view.fetch_prompt(url, args.conversation, admin_key)
    except prompt_view.InspectError as exc:
        print(f"memci-proxy inspect: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(prompt_view.render_json(view))
        return 0
    color = args.color or (not args.no_color and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    sys.stdout.write(prompt_view.render(view, color=color))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet = args.command in ("doctor", "inspect")  # their output is the report, not the libraries' logs
    configure_logging("warning" if quiet else getattr(args, "log_level", None) or os.environ.get("MEMCI_LOG_LEVEL") or "info")
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "emulate":
            from memci_proxy.emulator.cli import run_from_args

            run_from_args(args)
            return 0
        if args.command == "migrate":
            return migrate(args)
        if args.command == "doctor":
            return doctor(args)
        if args.command == "inspect":
            return inspect_prompt(args)
        if args.command == "settings":
            return show_settings(args)
        if args.command == "metrics":
            from memci_proxy.metrics_doc import markdown

            sys.stdout.write(markdown())
            return 0
    except SettingsError as exc:
        print(f"memci-proxy: {exc}", file=sys.stderr)
        return 2
    except PortInUse as exc:
        print(f"memci-proxy: {exc}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
