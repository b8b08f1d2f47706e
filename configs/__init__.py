"""The shipped training presets (flat YAML, env × algorithm × model) and the data files they name, installed
as ``agentgym.configs`` so that ``agentgym train NAME`` finds them from any folder
(``agentgym.training.config.loading.presets_dir``)."""
