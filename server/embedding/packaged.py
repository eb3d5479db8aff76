"""A model file shipped inside an installed PyPI package, found at its pinned version."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from satchel.server.platform.config import ConfigError


def packaged_file(package: str, version: str, filename: str, model: str, hint: str) -> Path:
    """`filename` inside the installed `package` at `version` (ConfigError naming the fix when
    the package is missing, at another version, or lacks the file)."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise ConfigError(f"{model} needs the package {package}: {hint}") from None
    if dist.version != version:
        found = f"{package} {dist.version} is installed"
        raise ConfigError(f"{found}, {model} needs {version}: {hint}")
    found_files = [f for f in dist.files or () if f.name == filename]
    path = Path(str(dist.locate_file(found_files[0]))) if found_files else None
    if path is None or not path.is_file():
        raise ConfigError(f"{package} is installed but holds no {filename}: reinstall it")
    return path
