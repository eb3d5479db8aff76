"""Embedders: the port, the fastembed adapter, and a fake for pure unit tests."""

from __future__ import annotations

from satchel.server.embedding.port import Embedder
from satchel.server.platform.config import Settings


def load_embedder(settings: Settings) -> Embedder:
    """Load the configured model from disk (fails fast with ConfigError)."""
    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder

    return FastEmbedEmbedder(
        settings.embed_model,
        model_path=settings.embed_model_path,
        threads=settings.embed_threads,
        cache_dir=settings.data_dir / "cache",
    )
