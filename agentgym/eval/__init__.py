"""Evaluation: episode summaries (success with confidence intervals, returns, turns, invalid actions)."""
