"""The env service: its app, sessions, worker processes and router, wire models, clients (``client``,
``socket_client``), fleets over replicas, OpenEnv's protocol and MCP tools. What other services share with it
is ``agentgym.service_kit``."""
