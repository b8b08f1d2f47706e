"""Checking a config needs no torch: every preset loads, and bad loss settings still fail, with torch
blocked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentgym.training.config.loading import list_presets

ROOT = Path(__file__).resolve().parents[3]

# Runs in a fresh interpreter where `import torch` raises ImportError (a None entry in sys.modules);
# prints one JSON object: per preset "ok" or the error, per bad override the error line.
PROBE = """
import json, sys
sys.modules["torch"] = None
from agentgym.errors import AgentGymError
from agentgym.training import load_config
from agentgym.training.config.loading import list_presets

def outcome(preset, overrides=()):
    try:
        load_config(preset, list(overrides))
    except AgentGymError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"

print(json.dumps({
    "presets": {name: outcome(name) for name in list_presets()},
    "bad_loss_mode": outcome("quickstart_maze_grpo", ["loss.loss_mode=gpso"]),
    "bad_term_arg": outcome("quickstart_maze_epo", ["loss.terms.epo.band_low=5"]),
    "unknown_term": outcome("quickstart_maze_grpo", ["loss.terms.lldss.coef=0.1"]),
    "torch_loaded": any(name == "torch" or name.startswith("torch.") for name, module in sys.modules.items()
                        if module is not None),
}))
"""


def run_probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_preset_and_every_loss_check_works_without_torch():
    result = run_probe()
    assert list_presets(), "no presets found in configs/"
    assert result["presets"] == {name: "ok" for name in list_presets()}
    assert result["bad_loss_mode"].startswith("RegistryError: no policy loss named 'gpso'")
    assert "Did you mean 'gspo'" in result["bad_loss_mode"]
    assert result["bad_term_arg"].startswith("ConfigError") and "band_low" in result["bad_term_arg"]
    assert result["unknown_term"].startswith("RegistryError: no loss term named 'lldss'")
    assert "Did you mean 'llds'" in result["unknown_term"]
    assert result["torch_loaded"] is False
