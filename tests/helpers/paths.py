"""Where the repository is, for tests that read its files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root."""
