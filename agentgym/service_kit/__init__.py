"""The helper kit every agentgym HTTP service and client is built from: the client base with its retry policy
and lean transport (``base``, ``transport``), the ASGI gates (``gate``, ``guard``), JSON and error answers
(``responses``, ``wire``) and starting local services (``launcher``). It imports no service: the env service
(``agentgym.http``), the sandbox, retrieval, the policy server and the viewer all stand on it."""
