"""Rollout (torch-free): records, the ``Policy`` protocol, action parsing, prompts, the collector, hooks, demos."""
