"""Build hook: the wheel carries the run-time files kept outside the package in the repository (the Alembic
migrations, config/default.toml, the Grafana dashboard), copied under memci_proxy/_data/ (see memci_proxy/package_data.py).
Everything else is declared in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def shipped() -> tuple[tuple[str, ...], str]:
    namespace: dict = {"__file__": str(ROOT / "memci_proxy" / "package_data.py")}
    exec((ROOT / "memci_proxy" / "package_data.py").read_text(encoding="utf-8"), namespace)  # no package import at build time
    return namespace["SHIPPED"], namespace["PACKAGED_DIR"]


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's own files
        paths, packaged_dir = shipped()
        target = Path(self.build_lib) / "memci_proxy" / packaged_dir
        shutil.rmtree(target, ignore_errors=True)  # build/ is reused between builds: no stale migration survives
        for relative in paths:
            source, dest = ROOT / relative, target / relative
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest)


setup(cmdclass={"build_py": BuildPyWithData})
