"""``EnvSource``: where the envs of a training run or an evaluation come from, which tasks they play and
how they are rewarded.

Training (``agentgym.training.run.setup``) and ``agentgym eval`` (``agentgym.eval.harness``) describe
their envs with the same fields (id, arguments, turn budget, env services) and build them here, so both
make the same envs the same way: in-process (``agentgym.make``), sessions on an env service
(``RemoteEnv``), a fleet of services stepped through their batched routes (``EnvFleet``), or Ray
actors (``RayEnvPool``). The action format an env asks for is read from its spec, or from its
service when it runs on one. A source may also name a task split (its envs' task seeds are then task
indices of that split: ``TaskSplitEnv``) and a judge (``JUDGE_FIELDS``: its envs' rewards are then the
judge's scores, ``agentgym.judge.JudgedReward``). It sits below training and evaluation, which both
import it, and above the rollout package and the env service's client, which it builds on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import agentgym
from agentgym.core import HELD_OUT_SEED_START, Env
from agentgym.errors import ConfigError
from agentgym.rollout.pool import EnvPool
from agentgym.sources.task_split import TaskRoute

if TYPE_CHECKING:
    from agentgym.http.client import EnvClient
    from agentgym.judge import Judge

__all__ = ["HELD_OUT_SEED_START", "JUDGE_FIELDS", "EnvSource", "check_judge_settings", "make_judge"]

#: The settings of a judge, named as ``JudgeSettings``' fields (``agentgym.judge``), so a run's
#: ``env.judge`` and `agentgym eval --judge FILE` read alike: ``base_url``, ``model`` and ``rubric`` are
#: required; ``mode``, ``success_threshold`` and ``on_error`` go to ``JudgedReward``, the rest to ``Judge``
#: (``api_key_env`` names the environment variable holding the key).
JUDGE_FIELDS = ("base_url", "model", "rubric", "mode", "success_threshold", "on_error", "timeout_s",
                "retries", "max_concurrency", "max_tokens", "temperature", "api_key_env", "cache_file")
_WRAPPER_FIELDS = ("mode", "on_error", "success_threshold")
_DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


def check_judge_settings(settings: Any, where: str = "judge") -> dict[str, Any]:
    """Judge settings checked as far as can be without a request: the fields and their values.

    Args:
        settings: a mapping of ``JUDGE_FIELDS``.
        where: what the settings came from, named in errors (``--judge judge.json``).

    Returns:
        The settings as a plain dict.

    Raises:
        ConfigError: not a mapping, an unknown field (the message lists the valid ones), a missing
            ``base_url``/``model``/``rubric`` or a bad value.

    Example:
        >>> check_judge_settings({"base_url": "http://127.0.0.1:8001/v1", "model": "m", "rubric": "r",
        ...                       "mode": "add"})["mode"]
        'add'
        >>> check_judge_settings({"url": "http://x"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: judge: unknown field 'url'; the fields are base_url, model, rubric, ...
    """
    from agentgym.judge import Judge

    if not isinstance(settings, Mapping):
        raise ConfigError(f"{where}: a judge is a mapping of {', '.join(JUDGE_FIELDS[:3])}, ..., "
                          f"got {type(settings).__name__}")
    unknown = [key for key in settings if key not in JUDGE_FIELDS]
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(JUDGE_FIELDS)}")
    settings = dict(settings)
    checked = {key: settings[key] for key in ("timeout_s", "retries", "max_concurrency", "max_tokens",
                                               "temperature") if key in settings}
    try:
        Judge.check_settings(settings.get("base_url"), settings.get("model"), settings.get("rubric"),
                             **checked)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if settings.get("mode", "replace") not in ("replace", "add"):
        raise ConfigError(f"{where}: judge mode must be 'replace' or 'add', got {settings['mode']!r}")
    if settings.get("on_error", "raise") not in ("raise", "zero"):
        raise ConfigError(f"{where}: judge on_error must be 'raise' or 'zero', got {settings['on_error']!r}")
    threshold = settings.get("success_threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0.0 <= threshold <= 1.0):
        raise ConfigError(f"{where}: judge success_threshold must be a number in [0, 1] or null, got "
                          f"{threshold!r}")
    for key in ("api_key_env", "cache_file"):
        if settings.get(key) is not None and not isinstance(settings[key], str):
            raise ConfigError(f"{where}: judge {key} must be a string, got {settings[key]!r}")
    return settings


def make_judge(settings: Mapping[str, Any]) -> Judge:
    """The ``Judge`` that checked ``settings`` describe (``mode``, ``on_error`` and ``success_threshold``
    are ``JudgedReward``'s, not the judge's). The caller closes it."""
    import os

    from agentgym.judge import Judge

    judge_args = {key: value for key, value in settings.items()
                  if key not in (*_WRAPPER_FIELDS, "base_url", "model", "rubric", "api_key_env")}
    api_key = os.environ.get(settings.get("api_key_env") or _DEFAULT_API_KEY_ENV) or None
    return Judge(settings["base_url"], settings["model"], settings["rubric"], api_key=api_key, **judge_args)


@dataclass(frozen=True)
class EnvSource:
    """One env, and where its instances run.

    Example:
        >>> source = EnvSource("maze-v0", {"size": 2}, max_turns=3)
        >>> env = source.factory()()
        >>> (env.reset(seed=1)[1]["state_key"]
        ...  == agentgym.make("maze-v0", size=2).reset(seed=1)[1]["state_key"])
        True
        >>> source.action_format()
        'plain'
    """

    id: str
    """Registered env id."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Env constructor arguments."""
    max_turns: int | None = None
    """Override of the spec's turn budget."""
    urls: tuple[str, ...] = ()
    """Env services holding the env; empty: in-process envs."""
    token: str | None = None
    """Bearer token of the services."""
    timeout_s: float = 60.0
    """Per-request deadline on the services."""
    backend: Literal["local", "ray"] = "local"
    """Where in-process envs run: ``local`` (this process) or ``ray`` (Ray actors)."""
    ray_address: str | None = None
    """For ``ray``: the cluster to join (None: a local instance)."""
    ray_workers: int | None = None
    """For ``ray``: env actors (None: one per CPU, at most 16)."""
    split: str | None = None
    """A task split of the env: its envs then start task ``i`` of that split on ``reset(seed=i)``
    (``TaskSplitEnv``); None: task seeds are reset seeds."""
    judge: dict[str, Any] | None = None
    """Judge settings (``JUDGE_FIELDS``): every env is wrapped in ``JudgedReward``; None: the env's own
    rewards."""
    routes: tuple[TaskRoute, ...] = ()
    """Seed ranges that name tasks of splits (``RoutedTaskEnv``; a training run's ``env.train_split`` and
    ``eval.split``); empty: none. Not with ``split``."""

    def __post_init__(self) -> None:
        if self.split is not None and (not isinstance(self.split, str) or not self.split):
            raise ConfigError(f"env {self.id}: a task split is a non-empty name such as 'test', got "
                              f"{self.split!r}")
        if self.split is not None and self.routes:
            raise ConfigError(f"env {self.id}: give a task split or task routes, not both")
        if self.judge is not None:
            check_judge_settings(self.judge, f"env {self.id} judge")

    def client(self) -> EnvClient:
        """A client of the first service (the caller closes it).

        Raises:
            ValueError: the source has no service.
        """
        from agentgym.http.client import EnvClient

        if not self.urls:
            raise ValueError(f"env {self.id} runs in-process; it has no service to connect to")
        return EnvClient(self.urls[0], token=self.token, timeout_s=self.timeout_s)

    def factory(self, client: EnvClient | None = None, judge: Judge | None = None) -> Callable[[], Env]:
        """Stand-alone envs, one per call: in-process, or sessions on the first service (through
        ``client`` when given, so many sessions share its connections); with ``split``, each in a
        ``TaskSplitEnv`` (with ``routes``, a ``RoutedTaskEnv``); with ``judge`` settings, each in a
        ``JudgedReward``.

        Args:
            client: the service client to share.
            judge: the judge of ``self.judge``'s settings to share (the caller closes it); None: one
                judge made here is shared by every env of this factory.
        """
        if self.urls:
            from agentgym.http.client import RemoteEnv

            shared = client if client is not None else self.client()

            def plain() -> Env:
                return RemoteEnv(self.id, client=shared, max_turns=self.max_turns, **self.kwargs)
        else:
            def plain() -> Env:
                return agentgym.make(self.id, max_turns=self.max_turns, **self.kwargs)

        def of_split() -> Env:
            from agentgym.sources.task_split import RoutedTaskEnv, TaskSplitEnv

            if self.routes:
                return RoutedTaskEnv(plain(), self.routes)
            return TaskSplitEnv(plain(), self.split) if self.split is not None else plain()

        if self.judge is None:
            return of_split
        from agentgym.judge import JudgedReward

        wrapper_args = {key: self.judge[key] for key in _WRAPPER_FIELDS if key in self.judge}
        shared_judge = judge if judge is not None else make_judge(self.judge)
        return lambda: JudgedReward(of_split(), shared_judge, **wrapper_args)

    def pool(self) -> Callable[[], Env] | EnvPool:
        """What a collector steps in batches; every answer is also a zero-argument env factory.

        - services: an ``EnvFleet`` over them (one batched request per service per turn;
          least-loaded placement; a dead service's episodes replayed on another);
        - ``backend: ray``: a ``RayEnvPool`` (envs inside Ray actors);
        - else in-process envs (``agentgym.make``).

        A source with a ``split`` or a ``judge`` wraps each env in this process, so it answers
        ``factory()`` (sessions on its services, or in-process envs). So does a source with ``routes``.

        Raises:
            ConfigError: ``split``, ``routes`` or ``judge`` with ``backend: ray`` (its envs live in other
                processes).
        """
        if self.split is not None or self.routes or self.judge is not None:
            if self.backend == "ray":
                raise ConfigError(f"env {self.id}: a task split, task routes or a judge wrap envs in this "
                                  "process; they cannot be combined with backend: ray (drop one of them)")
            return self.factory()
        if self.urls:
            from agentgym.http.fleet import EnvFleet

            return EnvFleet(list(self.urls), self.id, kwargs=self.kwargs, max_turns=self.max_turns,
                            token=self.token, timeout_s=self.timeout_s)
        if self.backend == "ray":
            from agentgym.rollout.ray_pool import RayEnvPool

            return RayEnvPool(self.id, kwargs=self.kwargs, max_turns=self.max_turns,
                              num_workers=self.ray_workers, address=self.ray_address)
        return self.factory()

    def demo_factory(self, pool: Callable[[], Env] | EnvPool) -> Callable[[], Env]:
        """Envs an expert can be asked through (SFT demonstrations): ``pool``, the answer of ``pool()``,
        except for ``backend: ray``, whose envs live in Ray actors that answer resets and steps but no expert
        calls: in-process envs of the same id and settings then (demonstrations are few and cheap)."""
        if self.urls or self.backend != "ray":
            return pool
        return self.factory()

    def action_format(self, client: EnvClient | None = None) -> str:
        """The action format the env's spec asks for (its service's spec when it runs on one), else
        ``plain``."""
        if self.urls:
            if client is not None:
                wanted = client.env_detail(self.id).get("action_format")
            else:
                with self.client() as own:
                    wanted = own.env_detail(self.id).get("action_format")
        else:
            wanted = getattr(agentgym.spec(self.id), "action_format", None)
        return wanted or "plain"
