"""Moved to ``agentgym.service_kit.transport``; kept while the tests move over."""

from agentgym.service_kit.transport import LeanAsyncTransport  # noqa: F401
