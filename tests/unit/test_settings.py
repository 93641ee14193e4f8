import dataclasses

import pytest

from memci_proxy.settings import DEFAULT_CONFIG_FILE, Settings, SettingsError, env_name, load_settings, read_config_file, setting_fields


def test_defaults_without_file_or_env():
    s = load_settings(env={}, read_file=False)
    assert s == Settings()
    assert s.upstream_urls == ["http://127.0.0.1:30000/v1"]


def test_default_config_file_matches_the_defaults():
    values = read_config_file(DEFAULT_CONFIG_FILE)
    defaults = {f.name: f.default for f in setting_fields()}
    assert set(values) <= set(defaults)
    for key, value in values.items():
        assert value == defaults[key], key
    missing = set(defaults) - set(values) - {"config"}
    assert not missing, f"settings missing from config/default.toml: {missing}"


def test_env_beats_file_and_flags_beat_env(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n')
    s = load_settings(env={"MEMCI_CONFIG": str(cfg), "MEMCI_PORT": "9100"})
    assert (s.port, s.host, s.config) == (9100, "0.0.0.0", str(cfg))
    s = load_settings(env={"MEMCI_CONFIG": str(cfg), "MEMCI_PORT": "9100"}, overrides={"port": 9200})
    assert s.port == 9200


def test_database_and_redis_use_conventional_env_names():
    assert env_name("database_url") == "DATABASE_URL"
    assert env_name("redis_url") == "REDIS_URL"
    assert env_name("upstream_url") == "MEMCI_UPSTREAM_URL"
    s = load_settings(env={"DATABASE_URL": "postgresql://x@h/db", "REDIS_URL": "redis://h:1/0"}, read_file=False)
    assert (s.database_url, s.redis_url) == ("postgresql://x@h/db", "redis://h:1/0")


@pytest.mark.parametrize(
    "env, named",
    [
        ({"MEMCI_PORT": "eighty"}, "port"),
        ({"MEMCI_PORT": "70000"}, "port"),
        ({"MEMCI_MANAGE_CONTEXT": "maybe"}, "manage_context"),
        ({"MEMCI_SAFETY_MARGIN": "2"}, "safety_margin"),
        ({"MEMCI_UPSTREAM_URL": "ftp://x"}, "upstream_url"),
        ({"MEMCI_LOG_LEVEL": "loud"}, "log_level"),
        ({"MEMCI_ACTIVE_LOW_WATERMARK": "0.9", "MEMCI_ACTIVE_HIGH_WATERMARK": "0.8"}, "active_low_watermark"),
        ({"DATABASE_URL": "mysql://x"}, "database_url"),
    ],
)
def test_bad_values_fail_naming_the_setting(env, named):
    with pytest.raises(SettingsError) as err:
        load_settings(env=env, read_file=False)
    assert f"'{named}'" in str(err.value)


def test_unknown_key_in_config_file_is_an_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(SettingsError, match="'prot'"):
        load_settings(env={"MEMCI_CONFIG": str(cfg)})


def test_a_retired_setting_in_a_config_file_is_ignored_with_a_warning(tmp_path, caplog):
    cfg = tmp_path / "c.toml"
    cfg.write_text('count_models_max = 8\nupstream_url = "http://a:1/v1"\n')
    with caplog.at_level("WARNING", logger="memci.settings"):
        s = load_settings(env={"MEMCI_CONFIG": str(cfg)})
    assert s.upstream_urls == ["http://a:1/v1"]
    assert "'count_models_max'" in caplog.text and "ignored" in caplog.text


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(SettingsError, match="'config'"):
        load_settings(env={"MEMCI_CONFIG": str(tmp_path / "nope.toml")})


def test_several_upstreams():
    s = load_settings(env={"MEMCI_UPSTREAM_URL": "http://a:1/v1, http://b:2/v1/"}, read_file=False)
    assert s.upstream_urls == ["http://a:1/v1", "http://b:2/v1"]


def test_replace_validates():
    s = Settings()
    assert s.replace(port=1234).port == 1234
    with pytest.raises(SettingsError):
        s.replace(port=0)
    assert dataclasses.asdict(s.replace())["port"] == 8080


def test_only_secret_values_are_masked():
    from memci_proxy import settings_doc
    from memci_proxy.settings import Settings

    shown = settings_doc.resolved(Settings(prompt_cache_key=True, upstream_api_key="sk-secret"), {})
    line = next(x for x in shown.splitlines() if x.startswith("prompt_cache_key "))
    assert "True" in line and "****" not in line  # a boolean named *_key is no secret
    assert "sk-secret" not in shown
    assert settings_doc.shown_value("upstream_api_key", "sk-secret") == "'****'"
    assert settings_doc.shown_value("virtual_keys", "sk-a=t1") == "'****'"
