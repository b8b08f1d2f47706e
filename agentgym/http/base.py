"""Moved to ``agentgym.service_kit.base``; kept while the tests move over."""

from agentgym.service_kit.base import AsyncServiceClient, RetryPolicy, ServiceClient  # noqa: F401
