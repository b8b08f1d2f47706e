"""Writes the folders beside it: a training run (train_run/) and two evaluations (eval_run/: random, expert;
eval_model/: train_run's model) in the episode-log formats of commit 96fba02, before training and evaluation
shared one format, keeping only the files their readers read. They were written by that commit's code with
``python tests/data/legacy_runs/write_legacy_runs.py OUT`` and stay as written: tests open them to prove that
folders already on disk stay readable. Rerunning it with later code writes the current format instead."""
import shutil
import sys
from pathlib import Path

from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train


def main() -> None:
    out = Path(sys.argv[1])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    overrides = ["iterations=2", "checkpoint_every=1", "rollout.num_tasks=2", "rollout.group_size=2",
                 "eval.num_episodes=2", "sft.num_episodes=16", "sft.num_epochs=30", "env.max_turns=4"]
    train(load_config(None, overrides), out / "train_run")
    maze = EnvEntry("maze-v0", {"size": 2}, max_turns=8)
    baselines = (parse_policy("random"), parse_policy("expert"))
    Evaluation(EvalPlan(baselines, (maze,), tuple(range(3)), samples=2), out / "eval_run").run()
    short_maze = EnvEntry("maze-v0", {"size": 2}, max_turns=4)
    Evaluation(EvalPlan((parse_policy(str(out / "train_run")),), (short_maze,), tuple(range(2)), samples=2,
                        temperature=1.0), out / "eval_model").run()
    # Weights and checkpoints are not episode logs; the tokenizer files stay, for the viewer's decoding.
    for name in ("checkpoint.pt", "reference.pt", "learning_curve.png", "tensorboard",
                 "model/model.safetensors", "model/config.json", "model/generation_config.json"):
        path = out / "train_run" / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


if __name__ == "__main__":  # run as a script only: pytest collects this folder's modules for doctests
    main()
