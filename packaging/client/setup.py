"""Build hook of `satchel-client`: inside the repository, lay the SDK out under src/ as it
installs (client/ -> satchel/client, satchel/v1 stubs and proto/satchel/v1/*.proto ->
satchel/v1) and copy the licence; from an unpacked sdist, src/ is already there."""

import shutil
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _sync(sources: list[Path], target: Path) -> None:
    """Make `target` hold exactly copies of `sources` (files rewritten only when changed)."""
    target.mkdir(parents=True, exist_ok=True)
    names = {source.name for source in sources}
    for stale in target.iterdir():
        if stale.name not in names:
            stale.unlink()
    for source in sources:
        copy = target / source.name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            shutil.copyfile(source, copy)


def _stage() -> None:
    src = HERE / "src" / "satchel"
    client = [p for p in (ROOT / "client").iterdir() if p.suffix == ".py" or p.name == "py.typed"]
    _sync(sorted(client), src / "client")
    stubs = [p for p in (ROOT / "satchel" / "v1").iterdir() if p.suffix in {".py", ".pyi"}]
    protos = list((ROOT / "proto" / "satchel" / "v1").glob("*.proto"))
    _sync(sorted(stubs + protos + [HERE / "py.typed"]), src / "v1")
    shutil.copyfile(ROOT / "LICENSE", HERE / "LICENSE")


if (ROOT / "client" / "__init__.py").is_file() and (ROOT / "proto" / "satchel").is_dir():
    _stage()

setup()
