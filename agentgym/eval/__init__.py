"""Evaluation: the harness and its plan and policies, the paired comparison of policies, reports, the episode
store and the trajectory viewer. (The envs it plays come from ``agentgym.sources``; episode summaries are
``agentgym.rollout.summary``'s.)"""
