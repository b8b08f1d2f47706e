"""Judged rewards: ``Judge`` (an LLM scores transcripts from a rubric), ``JudgedReward`` (its env wrapper)
and ``JudgeSettings`` (what a config sets of them).

The judge is any OpenAI-compatible chat endpoint (`agentgym serve-policy`, vLLM, a hosted API). It is
asked to end its answer with a line ``SCORE: <s>`` (``parse_score`` says which forms count); the score
is a float in [0, 1]. Verdicts are cached by (model, rubric, prompt template, transcript), in memory and
optionally in a JSONL file, so a transcript is judged once however often it recurs.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any, Literal

import gymnasium
import httpx

from agentgym.core import Env
from agentgym.errors import ConfigError, JudgeError

JudgeMode = Literal["replace", "add"]
OnJudgeError = Literal["raise", "zero"]

@dataclass(frozen=True)
class JudgeSettings:
    """The settings of an LLM judge that scores each finished episode from a rubric; its score becomes the
    episode's reward (a training run's ``env.judge``). ``base_url``, ``model`` and ``rubric`` must be set.

    Example:
        >>> JudgeSettings(base_url="http://127.0.0.1:8001/v1", model="m", rubric="r", retries=-1)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: JudgeSettings.retries must be an integer >= 0, got -1
    """

    base_url: str = ""
    """The judge's OpenAI-compatible API root, e.g. ``http://127.0.0.1:8001/v1`` (`agentgym serve-policy`,
    vLLM, a hosted API)."""
    model: str = ""
    """The judge model's name, as the endpoint serves it."""
    rubric: str = ""
    """What a good episode is, in words the judge reads."""
    mode: Literal["replace", "add"] = "replace"
    """``replace``: the episode's return is the judge's score (0 to 1); ``add``: the score is added to the
    env's reward at the last step."""
    success_threshold: float | None = None
    """The score from which an episode counts as solved (``info["success"]``); None keeps the env's own."""
    on_error: Literal["raise", "zero"] = "raise"
    """When the judge gives no score after its retries: ``raise`` stops the run, ``zero`` scores the
    episode 0 (the error is in the turn's ``info["judge"]``)."""
    timeout_s: float = 60.0
    """Deadline of each judge request, seconds."""
    retries: int = 3
    """Attempts after the first (connection errors, timeouts, HTTP 5xx/429, answers without a score)."""
    max_concurrency: int = 8
    """Judge requests in flight at once."""
    max_tokens: int = 512
    """Longest judge answer, tokens."""
    temperature: float = 0.0
    """The judge's sampling temperature."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the judge's API key (keys stay out of config files); unset or
    empty: no key is sent."""
    cache_file: str | None = None
    """A JSONL file of verdicts, read at start and appended to, so a transcript is judged once across runs."""

    def __post_init__(self) -> None:
        try:
            Judge.check_settings(self.base_url, self.model, self.rubric, timeout_s=self.timeout_s,
                                 retries=self.retries, max_concurrency=self.max_concurrency,
                                 max_tokens=self.max_tokens, temperature=self.temperature)
        except ConfigError as exc:  # "judge timeout_s ..." names the field as "JudgeSettings.timeout_s ..."
            raise ConfigError(str(exc).replace("judge ", "JudgeSettings.", 1)) from None
        if self.success_threshold is not None and not 0.0 <= self.success_threshold <= 1.0:
            raise ConfigError(f"JudgeSettings.success_threshold must be in [0, 1] or null, got "
                              f"{self.success_threshold}")



#: The system message of every judging request: the answer format ``parse_score`` reads.
JUDGE_INSTRUCTIONS = (
    "You grade the transcript of an agent's episode against a rubric. Think briefly, then end your "
    "answer with one line `SCORE: <s>`, where <s> is a number from 0 (fails the rubric) to 1 (fully "
    "meets it); a fraction such as `SCORE: 7/10` is fine too."
)

#: The user message of a judging request; ``{rubric}`` and ``{transcript}`` are filled in.
DEFAULT_TEMPLATE = ("Rubric:\n{rubric}\n\nTranscript:\n{transcript}\n\n"
                    "Grade the transcript against the rubric.")

#: Sent after an answer without a score line, before asking again.
REMINDER = ("Your answer has no valid score line. Answer again, ending with one line `SCORE: <s>`, "
            "0 <= s <= 1.")

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_SCORE_LINE = re.compile(
    rf"^[\s*_#>`-]*score[\s*_`]*[:=][\s*_`]*(?P<value>{_NUMBER})\s*(?:(?P<percent>%)|/\s*(?P<scale>{_NUMBER}))?"
    r"[\s*_`.]*$",
    re.IGNORECASE | re.MULTILINE,
)


def parse_score(answer: str) -> float:
    """The score in a judge's answer: its last line of the form ``SCORE: <s>``.

    ``<s>`` is a number in [0, 1], a fraction ``a/b`` (``7/10``; 0 <= a <= b) or a percentage
    (``70%``). The word ``score`` may be in any case and wrapped in Markdown emphasis (``**Score:**``);
    ``=`` may stand for ``:``. Lines before the last score line do not count.

    Args:
        answer: the judge's reply text.

    Returns:
        The score, in [0, 1].

    Raises:
        ValueError: no score line, or a value outside [0, 1] (the message says which).

    Example:
        >>> parse_score("Reached the goal in 3 moves.\\nSCORE: 0.75")
        0.75
        >>> parse_score("**Score:** 7/10"), parse_score("score = 40%")
        (0.7, 0.4)
        >>> parse_score("SCORE: 7")
        Traceback (most recent call last):
        ...
        ValueError: score 7 is outside [0, 1]; write a fraction (7/10) or a percentage for other scales
    """
    matches = list(_SCORE_LINE.finditer(answer))
    if not matches:
        raise ValueError("the answer has no line 'SCORE: <s>' with a number <s> from 0 to 1")
    found = matches[-1]
    value = float(found["value"])
    if found["percent"]:
        score = value / 100
    elif found["scale"] is not None:
        scale = float(found["scale"])
        if scale <= 0:
            raise ValueError(f"score {found['value']}/{found['scale']} has a scale that is not positive")
        score = value / scale
    else:
        score = value
    if not (0.0 <= score <= 1.0):
        shown = found.group(0).split(":", 1)[-1].split("=", 1)[-1].strip(" *_`.")
        raise ValueError(f"score {shown} is outside [0, 1]; write a fraction (7/10) or a percentage for "
                         "other scales")
    return score


@dataclass(frozen=True)
class Verdict:
    """One judged transcript."""

    score: float
    """The parsed score, in [0, 1]."""
    raw: str
    """The judge's whole answer (the one the score was read from)."""
    model: str
    """The judge model that gave it."""
    cached: bool = False
    """True when it came from the cache instead of a request."""

    def to_info(self) -> dict[str, Any]:
        """The verdict as JSON-safe data (what ``JudgedReward`` puts in ``info["judge"]``)."""
        return asdict(self)


class Judge:
    """An LLM judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Each transcript is sent as two messages: ``JUDGE_INSTRUCTIONS`` (system) and ``template`` filled with
    the rubric and the transcript (user). The answer's score line is read by ``parse_score``. A failed
    attempt is tried again, up to ``retries`` more times with exponential backoff (``backoff_s``, doubled
    each time; the server's ``Retry-After`` instead when longer and under a minute): connection errors,
    timeouts, HTTP 5xx and 429, and answers without a valid score line (asked again with the bad answer
    and ``REMINDER`` appended). Other HTTP errors (400, 401, 404) fail at once. Verdicts are cached by (model,
    rubric, template, transcript); concurrent calls for one transcript share one request. At most
    ``max_concurrency`` requests are in flight at a time, over every thread that uses the judge.
    The judge is thread-safe.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8001/v1`` (requests go to
            ``base_url/chat/completions``).
        model: the model name sent with each request.
        rubric: what a good episode is, in words the judge reads.
        api_key: bearer key; None sends no ``Authorization`` header (local servers need none).
        template: the user message, with the placeholders ``{rubric}`` and ``{transcript}`` (write ``{{``
            and ``}}`` for literal braces).
        timeout_s: deadline of each request (connect, read, write), seconds.
        retries: attempts after the first one (0: no retry).
        backoff_s: wait before the first retry; doubled for each further one.
        max_concurrency: requests in flight at once.
        max_tokens: the judge's answer length limit, tokens.
        temperature: sampling temperature of the judge.
        cache_file: a JSONL file of verdicts: read when the judge is made, appended to as it judges.
        extra_body: more request fields, sent as given (e.g. vLLM's ``guided_regex``).

    Attributes:
        requests_sent: chat requests sent so far, retries included (cache hits send none).

    Raises:
        ConfigError: an argument is invalid (the message names it).

    Example:
        >>> judge = Judge("http://127.0.0.1:8001/v1", "judge-model", "The agent reached the goal.")
        >>> judge.prompt("> up\\nYou reached the goal.")[1]["content"].splitlines()[:2]
        ['Rubric:', 'The agent reached the goal.']
        >>> judge.close()
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        rubric: str,
        *,
        api_key: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
        max_tokens: int = 512,
        temperature: float = 0.0,
        cache_file: str | Path | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.check_settings(base_url, model, rubric, template=template, timeout_s=timeout_s, retries=retries,
                            backoff_s=backoff_s, max_concurrency=max_concurrency, max_tokens=max_tokens,
                            temperature=temperature)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.rubric = rubric
        self.template = template
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self.max_concurrency = max_concurrency
        self.max_tokens = max_tokens
        self.temperature = float(temperature)
        self.extra_body = dict(extra_body or {})
        self.cache_file = Path(cache_file) if cache_file is not None else None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), headers=headers,
                                    limits=httpx.Limits(max_connections=max_concurrency))
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._lock = threading.Lock()
        self._cache: dict[str, Verdict] = {}
        self._pending: dict[str, Future[Verdict]] = {}
        self.requests_sent = 0
        if self.cache_file is not None and self.cache_file.exists():
            self._load_cache(self.cache_file)

    @staticmethod
    def check_settings(base_url: Any, model: Any, rubric: Any, *, template: Any = DEFAULT_TEMPLATE,
                       timeout_s: Any = 60.0, retries: Any = 3, backoff_s: Any = 0.5,
                       max_concurrency: Any = 8, max_tokens: Any = 512, temperature: Any = 0.0) -> None:
        """Check the judge's arguments without making a judge (the constructor's checks).

        Raises:
            ConfigError: ``judge <argument> ...``, saying what was wrong with which argument.
        """
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"judge base_url must be an http(s):// URL such as http://127.0.0.1:8001/v1, "
                              f"got {base_url!r}")
        for name, text in (("model", model), ("rubric", rubric)):
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"judge {name} must be a non-empty string, got {text!r}")
        if not isinstance(template, str) or "{rubric}" not in template or "{transcript}" not in template:
            raise ConfigError("judge template must contain the placeholders {rubric} and {transcript}")
        try:
            template.format(rubric="", transcript="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"judge template has a stray brace or placeholder ({exc!s}); write {{{{ and "
                              "}} for literal braces") from None
        _check_number("timeout_s", timeout_s, positive=True)
        _check_number("backoff_s", backoff_s, positive=False)
        _check_number("temperature", temperature, positive=False)
        for name, count, least in (("retries", retries, 0), ("max_concurrency", max_concurrency, 1),
                                   ("max_tokens", max_tokens, 1)):
            if isinstance(count, bool) or not isinstance(count, int) or count < least:
                raise ConfigError(f"judge {name} must be an integer >= {least}, got {count!r}")

    # --- judging ------------------------------------------------------------------------------

    def prompt(self, transcript: str) -> list[dict[str, str]]:
        """The chat messages that judge ``transcript``."""
        return [{"role": "system", "content": JUDGE_INSTRUCTIONS},
                {"role": "user", "content": self.template.format(rubric=self.rubric, transcript=transcript)}]

    def score(self, transcript: str) -> Verdict:
        """Judge one transcript (from the cache when it was judged before).

        Raises:
            JudgeError: no usable score after the retries (one line: what failed and what to change).
        """
        if not isinstance(transcript, str):
            raise ConfigError(f"a transcript to judge must be a str, got {type(transcript).__name__}")
        key = self.cache_key(transcript)
        with self._lock:
            if key in self._cache:
                return _as_cached(self._cache[key])
            pending = self._pending.get(key)
            owner = pending is None
            if owner:
                pending = self._pending[key] = Future()
        assert pending is not None
        if not owner:
            return _as_cached(pending.result())
        try:
            verdict = self._judge(transcript)
        except BaseException as exc:
            with self._lock:
                del self._pending[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            self._cache[key] = verdict
            del self._pending[key]
            if self.cache_file is not None:
                with self.cache_file.open("a", encoding="utf-8") as out:
                    out.write(json.dumps({"key": key, "score": verdict.score, "raw": verdict.raw,
                                          "model": verdict.model}) + "\n")
        pending.set_result(verdict)
        return verdict

    def score_many(self, transcripts: Sequence[str]) -> list[Verdict | JudgeError]:
        """Judge a batch concurrently (``max_concurrency`` requests at a time); identical transcripts are
        judged once.

        Returns:
            One item per transcript, in order: its ``Verdict``, or the ``JudgeError`` that judging it
            raised (one failure does not lose the rest of the batch).
        """
        if not transcripts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(transcripts)),
                                thread_name_prefix="agentgym-judge") as threads:
            futures = [threads.submit(self.score, t) for t in transcripts]
        results: list[Verdict | JudgeError] = []
        for future in futures:
            error = future.exception()
            if error is not None and not isinstance(error, JudgeError):
                raise error
            results.append(error if isinstance(error, JudgeError) else future.result())
        return results

    def reward_function(self) -> Callable[..., float]:
        """This judge as a keyword-argument reward callable, for envs that take one (``mcp-v0``'s
        ``reward=``): the arguments become a transcript (one ``[name]`` entry each, non-text values as
        JSON, in the order given) and the call returns its score. A ``JudgeError`` propagates.

        Example:
            >>> judge = Judge("http://127.0.0.1:8001/v1", "judge-model", "The answer is right.")
            >>> reward = judge.reward_function()
            >>> print(render_transcript(reward.entries(answer="42", task={"prompt": "6*7?"})))
            [answer]
            42
            <BLANKLINE>
            [task]
            {"prompt": "6*7?"}
            >>> judge.close()
        """
        return _FieldsReward(self)

    def cache_key(self, transcript: str) -> str:
        """The cache key of ``transcript``: a hash of (model, rubric, template, transcript)."""
        text = json.dumps([self.model, self.rubric, self.template, transcript], ensure_ascii=False)
        return sha256(text.encode("utf-8")).hexdigest()

    def close(self) -> None:
        """Close the HTTP connections (idempotent)."""
        self._client.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- one transcript, with retries ---------------------------------------------------------

    def _judge(self, transcript: str) -> Verdict:
        messages = self.prompt(transcript)
        attempts = self.retries + 1
        problem, wait_s, last_answer = "", 0.0, None
        for attempt in range(attempts):
            if attempt:
                time.sleep(wait_s)
            answer, problem, retry_after_s = self._ask(messages)
            wait_s = max(self.backoff_s * 2**attempt, retry_after_s)
            if answer is None:
                continue
            last_answer = answer
            try:
                return Verdict(parse_score(answer), answer, self.model)
            except ValueError as exc:
                problem = f"its answer had no valid score ({exc}); last answer: {_clip(answer)!r}"
                messages = [*self.prompt(transcript), {"role": "assistant", "content": answer},
                            {"role": "user", "content": REMINDER}]
        raise JudgeError(f"judge {self.model!r} at {self.base_url} gave no score after {attempts} "
                         f"attempt{'s' * (attempts > 1)}: {problem}", raw=last_answer)

    def _ask(self, messages: list[dict[str, str]]) -> tuple[str | None, str, float]:
        """One request: ``(answer, "", 0)``, or ``(None, problem, retry_after_s)`` for a failure worth
        retrying (``retry_after_s``: the server's ``Retry-After``, else 0).

        Raises:
            JudgeError: a failure that retrying cannot fix (a 4xx other than 429, a malformed body).
        """
        body = {**self.extra_body, "model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature}
        url = f"{self.base_url}/chat/completions"
        with self._slots:
            with self._lock:
                self.requests_sent += 1
            try:
                response = self._client.post(url, json=body)
            except httpx.TimeoutException:
                late = f"no answer within timeout_s={self.timeout_s:g} s; raise timeout_s or check the server"
                return None, late, 0.0
            except httpx.TransportError as exc:
                return None, f"{type(exc).__name__} ({exc}); is the server running at that URL?", 0.0
        if response.status_code == 429 or response.status_code >= 500:
            return None, f"HTTP {response.status_code}: {_error_text(response)}", _retry_after_s(response)
        if response.status_code >= 400:
            raise JudgeError(f"judge {self.model!r} at {url} refused the request (HTTP "
                             f"{response.status_code}): {_error_text(response)}")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge at {url} did not answer with an OpenAI chat completion: "
                             f"{_clip(response.text)}; is base_url the API root (ending in /v1)?") from None
        return (content if isinstance(content, str) else ""), "", 0.0

    def _load_cache(self, path: Path) -> None:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                self._cache[row["key"]] = Verdict(float(row["score"]), str(row["raw"]), str(row["model"]))
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"judge cache_file {path} line {number} is not a verdict row; delete the "
                                  "line or the file") from None


class _FieldsReward:
    """``Judge.reward_function``'s callable: keyword arguments in, the judge's score out."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    @staticmethod
    def entries(**fields: Any) -> list[tuple[str, str]]:
        """The transcript entries of the arguments: text as is, anything else as JSON."""
        return [(name, value if isinstance(value, str)
                 else json.dumps(value, ensure_ascii=False, default=str)) for name, value in fields.items()]

    def __call__(self, **fields: Any) -> float:
        return self.judge.score(render_transcript(self.entries(**fields))).score


def _check_number(name: str, value: Any, *, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(f"judge {name} must be a {'positive' if positive else 'non-negative'} number, "
                          f"got {value!r}")


def _as_cached(verdict: Verdict) -> Verdict:
    return Verdict(verdict.score, verdict.raw, verdict.model, cached=True)


def _retry_after_s(response: httpx.Response) -> float:
    """The server's ``Retry-After`` in seconds when given as seconds below a minute, else 0."""
    try:
        wait = float(response.headers.get("retry-after", ""))
    except ValueError:
        return 0.0
    return wait if 0 <= wait < 60 else 0.0


def _error_text(response: httpx.Response) -> str:
    """An error answer's message: the OpenAI error body's ``error.message`` when it has one, else the body."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = None
    return _clip(message if isinstance(message, str) else response.text)


def _clip(text: str, limit: int = 200) -> str:
    """One line of at most ``limit`` characters (for error messages)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def render_transcript(entries: Sequence[tuple[str, str]]) -> str:
    """A transcript as the judge reads it: one ``[role]`` header per entry, entries apart by a blank line.

    Example:
        >>> print(render_transcript([("environment", "You are at the door."), ("agent", "open door")]))
        [environment]
        You are at the door.
        <BLANKLINE>
        [agent]
        open door
    """
    return "\n\n".join(f"[{role}]\n{text}" for role, text in entries)


class JudgedReward(gymnasium.Wrapper[str, str, str, str], Env):
    """Wraps any agentgym env: the judge scores each finished episode, and that score is its reward.

    The wrapper records the transcript (the reset's ``info["instructions"]`` when there are any, then
    every observation and action) and, at the step that terminates or truncates the episode, has the
    judge score it (``render_transcript``). Then:

    - ``mode="replace"``: the last step's reward is the score and earlier steps' rewards are 0, so the
      episode's return is the judge's score; ``mode="add"``: the score is added to the last step's reward.
    - ``info["judge"]`` holds the verdict, JSON-safe: ``score``, ``raw`` (the judge's answer), ``model``,
      ``cached``, and ``env_return`` (the return the env itself gave); after a failure ``score`` is None
      and ``error`` says what failed.
    - With ``success_threshold``, ``info["success"]`` is ``score >= success_threshold``.
    - A ``JudgeError`` (after the judge's own retries) is raised from ``step`` with ``on_error="raise"``;
      with ``on_error="zero"`` the score counts as 0 and the episode ends normally.

    ``fork`` forks the wrapped env and carries the transcript over. The judge blocks the step that ends
    an episode; envs stepped from several threads (an env pool of non-``EpisodeGuard`` envs) are judged
    concurrently, within the judge's ``max_concurrency``.

    Args:
        env: the env to wrap (e.g. from ``agentgym.make``).
        judge: the judge; one judge (and its cache) is usually shared by every env of a run.
        mode: ``"replace"`` or ``"add"``.
        on_error: ``"raise"`` or ``"zero"``.
        success_threshold: a score in [0, 1] from which the episode counts as solved; None keeps the
            env's own ``info["success"]``.

    Example:
        >>> import agentgym
        >>> judge = Judge("http://127.0.0.1:9/v1", "judge", "Reach the goal.", retries=0, timeout_s=1)
        >>> env = JudgedReward(agentgym.make("maze-v0", size=2), judge, on_error="zero")
        >>> _ = env.reset(seed=1)
        >>> steps = [env.step(env.expert_action()) for _ in range(4)]
        >>> steps[-1][1], steps[-1][2], steps[-1][4]["judge"]["score"]  # nothing listens on port 9
        (0.0, True, None)
        >>> judge.close()
    """

    def __init__(self, env: Env, judge: Judge, *, mode: JudgeMode = "replace",
                 on_error: OnJudgeError = "raise", success_threshold: float | None = None) -> None:
        if not isinstance(env, Env):
            raise ConfigError(f"JudgedReward wraps agentgym.Env instances, got {type(env).__name__}")
        if not isinstance(judge, Judge):
            raise ConfigError(f"JudgedReward needs a Judge, got {type(judge).__name__}")
        if mode not in ("replace", "add"):
            raise ConfigError(f"judge mode must be 'replace' or 'add', got {mode!r}")
        if on_error not in ("raise", "zero"):
            raise ConfigError(f"judge on_error must be 'raise' or 'zero', got {on_error!r}")
        if success_threshold is not None and (
                isinstance(success_threshold, bool) or not isinstance(success_threshold, (int, float))
                or not 0.0 <= success_threshold <= 1.0):
            raise ConfigError(f"judge success_threshold must be a number in [0, 1] or None, got "
                              f"{success_threshold!r}")
        gymnasium.Wrapper.__init__(self, env)
        self.judge = judge
        self.mode: JudgeMode = mode
        self.on_error: OnJudgeError = on_error
        self.success_threshold = success_threshold
        self.supports_snapshot = False  # type: ignore[misc]  # snapshots would lose the transcript
        self.has_expert = env.has_expert  # type: ignore[misc]
        self.forkable = getattr(env, "forkable", True)  # type: ignore[misc]
        self.steps_wait = getattr(env, "steps_wait", False)  # type: ignore[misc]
        self._entries: list[tuple[str, str]] = []
        self._env_return = 0.0

    @property
    def spec(self) -> Any:  # type: ignore[override]
        """The wrapped env's spec (an agentgym ``EnvSpec``, which Gymnasium's wrapper spec cannot copy)."""
        return self.env.spec

    @property
    def transcript(self) -> str:
        """The current episode so far, as the judge will read it."""
        return render_transcript(self._entries)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._entries = []
        if isinstance(info.get("instructions"), str) and info["instructions"]:
            self._entries.append(("instructions", info["instructions"]))
        self._entries.append(("environment", obs))
        self._env_return = 0.0
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._entries += [("agent", action), ("environment", obs)]
        self._env_return += float(reward)
        if not (terminated or truncated):
            return obs, (0.0 if self.mode == "replace" else reward), terminated, truncated, info
        try:
            verdict: dict[str, Any] = self.judge.score(self.transcript).to_info()
            score = verdict["score"]
        except JudgeError as exc:
            if self.on_error == "raise":
                raise
            verdict, score = {"score": None, "raw": exc.raw, "model": self.judge.model, "cached": False,
                              "error": str(exc)}, 0.0
        verdict["env_return"] = self._env_return
        info = {**info, "judge": verdict}
        if self.success_threshold is not None:
            info["success"] = score >= self.success_threshold
        return obs, (score if self.mode == "replace" else reward + score), terminated, truncated, info

    def expert_action(self) -> str | None:
        return self.env.expert_action()

    def fork(self) -> JudgedReward:
        """A new env in the same state, with the transcript so far (the wrapped env must have ``fork``)."""
        fork = getattr(self.env, "fork", None)
        if fork is None:
            raise ConfigError(f"{type(self.env).__name__} cannot fork; make envs with agentgym.make()")
        child = JudgedReward(fork(), self.judge, mode=self.mode, on_error=self.on_error,
                             success_threshold=self.success_threshold)
        child._entries, child._env_return = list(self._entries), self._env_return
        return child
