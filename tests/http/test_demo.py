"""The foundation demo (``make serve-demo``): an env service started with the service kit's launcher, and
its envs played by their experts through the CLI."""

from __future__ import annotations

import pytest

from agentgym.http import demo

pytestmark = pytest.mark.timeout(120)


def test_the_serve_demo_plays_each_env_through_the_cli(capfd: pytest.CaptureFixture[str]) -> None:
    assert demo.main(("maze-v0",), seed=3) == 0
    out = capfd.readouterr().out
    assert "agentgym play maze-v0 --url http://127.0.0.1:" in out
    assert "success after" in out  # printed by the `agentgym play` process, against the service
