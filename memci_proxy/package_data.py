"""Files the proxy reads at run time besides its code: the Alembic migrations, the default config file and the
Grafana dashboard (with the Prometheus files it reads).

In a checkout (and an editable install) they are the repository's own files (`migrations/`, `config/`). A built
wheel carries copies of them under `memci_proxy/_data/` with the same relative paths (setup.py's build step puts them
there), found through importlib.resources, so `pip install .` gives a proxy that migrates and configures itself.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# Repository paths shipped in the wheel (setup.py copies exactly these; MANIFEST.in puts them in the sdist).
SHIPPED = (
    "migrations",
    "config/default.toml",
    "config/grafana/dashboards/memci.json",
    "config/prometheus.yml",
    "config/prometheus-rules.yml",
)
PACKAGED_DIR = "_data"
CHECKOUT = Path(__file__).resolve().parent.parent


def path(relative: str) -> Path:
    """The file or directory ``relative`` (a repository path from SHIPPED): the wheel's copy when installed from
    a wheel, else the checkout's. The path may not exist (a checkout without it): callers check."""
    packaged = resources.files("memci_proxy").joinpath(PACKAGED_DIR, *relative.split("/"))
    if packaged.is_file() or packaged.is_dir():
        return Path(str(packaged))  # installed wheels are plain directories (zip imports are not supported)
    return CHECKOUT / relative


def is_checkout() -> bool:
    """True when the proxy runs from a source tree (not from an installed wheel)."""
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "memci_proxy" / "package_data.py").is_file()
