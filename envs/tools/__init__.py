"""Tool-using envs: search QA, math with a Python sandbox, code against hidden tests, function calling.

``tool_calls`` parses the ``<tool_call>`` JSON they share; ``code_runner`` runs their code in the sandbox.
"""
