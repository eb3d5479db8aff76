"""Settings read from the environment: types converted, bad values named."""

from __future__ import annotations

import pytest

from satchel.server.config import ConfigError, Settings


@pytest.mark.parametrize(
    ("raw", "expected"), [("off", False), ("FALSE", False), ("0", False), ("on", True), ("1", True)]
)
def test_boolean_settings(raw: str, expected: bool) -> None:
    settings = Settings.from_env({"SATCHEL_SKIP_SERVED_EPISODES": raw})
    assert settings.context.skip_served_episodes is expected


def test_booleans_default_and_refuse_other_words() -> None:
    assert Settings.from_env({}).context.skip_served_episodes is True
    with pytest.raises(ConfigError, match="SATCHEL_SKIP_SERVED_EPISODES='maybe'"):
        Settings.from_env({"SATCHEL_SKIP_SERVED_EPISODES": "maybe"})
