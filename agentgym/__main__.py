"""``python -m agentgym`` runs the command line."""

from agentgym.cli import main

main()
