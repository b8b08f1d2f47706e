"""Moved to ``agentgym.service_kit.launcher``; kept while the tests move over."""

from agentgym.service_kit.launcher import (  # noqa: F401
    free_port,
    python_command,
    start_service,
    stop_service,
    wait_healthy,
)
