"""The OpenAI-compatible policy backend: ``OpenAIEndpoint`` (chat and completions calls with one-line
errors) and ``OpenAIPolicy`` (the ``Policy`` protocol over an endpoint's ``/v1/completions``).

Works with any server that speaks the OpenAI API: vLLM and SGLang ``serve``, ``agentgym
serve-policy``, hosted APIs. It uses the official ``openai`` client (the ``openai`` extra).

**Token ids.** ``OpenAIPolicy.generate`` sends prompts as token ids and asks for the generated ids
back with ``return_token_ids`` (vLLM 0.10.2+ and ``agentgym serve-policy`` honour it; older vLLM
gives them through ``return_tokens_as_token_ids`` log-prob tokens, which are read too). Those ids are
used as they are, never re-tokenized. A server that returns only text (hosted APIs, SGLang without
the option) cannot give exact token ids: with ``allow_retokenize=True`` — what evaluation uses,
where only the text matters — the text is tokenized again with the local tokenizer and the
generation says so in ``extras["retokenized"]``; with the default ``allow_retokenize=False`` such a
reply is an error, so generated text is never re-tokenized on a training path.

**Training.** ``model.backend: openai`` is registered so configs can name it, but training needs
what no OpenAI-compatible API offers: the policy's weights in the trainer's process and a way to
send the updated weights to the server after every update. The builder therefore stops with a
one-line ``ConfigError`` saying so; train with ``model.backend: transformers``, or with
``model.backend: vllm-server`` (``agentgym.backends.vllm_server``: the trained model stays here and
reaches a vLLM server as LoRA adapters it hot-loads), and evaluate served models with ``agentgym eval
--policy http://HOST:PORT/v1``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym.backends.builder import register_backend
from agentgym.backends.config import ModelConfig
from agentgym.errors import AgentGymError, ConfigError
from agentgym.rollout.policy import ChatTokenizer, Generation, Policy, PolicyBase, SamplingParams

_CONTEXT = re.compile(r"context length|maximum context|context window", re.IGNORECASE)


class PolicyEndpointError(AgentGymError):
    """An OpenAI-compatible endpoint was unreachable, answered with an error, timed out, or returned
    something that is not an OpenAI response. The message names the endpoint and what to check."""

    http_status = 502


class ContextLengthExceeded(PolicyEndpointError):
    """The endpoint refused a prompt (plus ``max_tokens``) longer than the model's context (HTTP 400
    whose message speaks of the context length, as vLLM, SGLang, OpenAI and serve-policy word it)."""


@dataclass(frozen=True)
class EndpointReply:
    """One choice of an endpoint's answer."""

    text: str
    """The generated text (tool calls returned as structured ``tool_calls`` are written back as
    ``<tool_call>{json}</tool_call>`` lines, the text form agentgym's tool envs parse)."""
    finish_reason: str
    """``stop`` or ``length`` (or what the server said)."""
    token_ids: list[int] | None = None
    """Generated token ids, when the server returned them."""
    logprobs: list[float] | None = None
    """Per generated token log-probs, when asked for and returned."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per position (id, log-prob) alternatives, when the server wrote tokens as ``token_id:N``."""
    completion_tokens: int | None = None
    """Generated tokens as the server counted them (``usage.completion_tokens``)."""
    prompt_tokens: int | None = None
    """Prompt tokens as the server counted them."""
    extras: dict[str, Any] = field(default_factory=dict)


class OpenAIEndpoint:
    """Calls one model on an OpenAI-compatible server and turns every failure into one clear line.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8001/v1``.
        model: the served model's name; None takes the only model ``GET /models`` lists.
        api_key: bearer key; default ``$OPENAI_API_KEY`` or a placeholder (local servers need none).
        timeout_s: deadline of one request.
        max_retries: retries of failed connections, timeouts, 429 and 5xx answers (the openai
            client's backoff), before the request fails.

    Example (needs a running server)::

        endpoint = OpenAIEndpoint("http://127.0.0.1:8001/v1")
        reply = endpoint.chat([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=8))
    """

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 2) -> None:
        try:
            from openai import OpenAI
        except ImportError:
            raise ConfigError("OpenAI-compatible endpoints need the openai package: "
                              "pip install 'agentgym-rl[openai]'") from None
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"endpoint {base_url!r} must be an http(s):// URL such as http://127.0.0.1:8001/v1")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.client = OpenAI(base_url=self.base_url,
                             api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                             timeout=timeout_s, max_retries=max_retries)
        self._model = model

    @property
    def model(self) -> str:
        """The model name requests use (asks the server the first time when none was given)."""
        if self._model is None:
            served = self.models()
            if len(served) != 1:
                raise ConfigError(f"endpoint {self.base_url} serves {len(served)} models "
                                  f"({', '.join(served) or 'none'}); name one with model=NAME")
            self._model = served[0]
        return self._model

    def use_model(self, name: str) -> None:
        """Send later requests to model ``name`` (e.g. a LoRA adapter the server loaded at run time)."""
        self._model = name

    def models(self) -> list[str]:
        """Model names the server lists (``GET /models``)."""
        page = self._call("GET /models", lambda: self.client.models.list())
        try:
            return [str(m.id) for m in page.data]
        except (AttributeError, TypeError):
            raise PolicyEndpointError(f"endpoint {self.base_url}/models did not answer with a model list; "
                                      "is this an OpenAI-compatible API root (it usually ends in "
                                      "/v1)?") from None

    def check(self) -> str:
        """Reach the server and confirm it serves the model; returns the model name.

        Raises:
            PolicyEndpointError: unreachable, or an error answer.
            ConfigError: the model is not among those served.
        """
        try:
            served = self.models()
        except PolicyEndpointError as exc:
            if self._model is None or "HTTP 404" not in str(exc):
                raise
            served = []  # a server without GET /models: trust the model name given
        name = self.model
        if served and name not in served:
            raise ConfigError(f"endpoint {self.base_url} does not serve model {name!r}; it serves "
                              f"{', '.join(served)} (set model=NAME)")
        return name

    # --- requests ---------------------------------------------------------------------------------

    def chat(self, messages: list[dict[str, Any]], params: SamplingParams, *,
             tools: list[dict[str, Any]] | None = None, token_ids: bool = False) -> EndpointReply:
        """One chat completion (``n=1``) of ``messages``."""
        kwargs = self._sampling(params, token_ids)
        if params.num_top_logprobs:
            kwargs.update(logprobs=True, top_logprobs=params.num_top_logprobs)
        if tools:
            kwargs["tools"] = tools
        body = self._call("POST /chat/completions", lambda: self.client.chat.completions.create(
            model=self.model, messages=messages, **kwargs))
        return self._reply(body, chat=True)

    def complete(self, prompt: str | Sequence[int], params: SamplingParams, *,
                 token_ids: bool = True) -> EndpointReply:
        """One completion (``n=1``) of a text or token-id prompt, with log-probs."""
        kwargs = self._sampling(params, token_ids)
        kwargs["logprobs"] = max(1, params.num_top_logprobs)
        body = self._call("POST /completions", lambda: self.client.completions.create(
            model=self.model, prompt=prompt if isinstance(prompt, str) else list(prompt), **kwargs))
        return self._reply(body, chat=False)

    def _sampling(self, params: SamplingParams, token_ids: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"max_tokens": params.max_new_tokens, "temperature": params.temperature,
                                  "top_p": params.top_p}
        extra: dict[str, Any] = {}
        if params.stop_strings:
            kwargs["stop"] = list(params.stop_strings)
            extra["include_stop_str_in_output"] = True  # agentgym keeps stop strings in responses
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.top_k:
            extra["top_k"] = params.top_k
        if token_ids:
            extra["return_token_ids"] = True
            extra["return_tokens_as_token_ids"] = True
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _call(self, what: str, request: Any) -> Any:
        import openai

        where = f"policy endpoint {self.base_url} ({what})"
        try:
            return request()
        except openai.APITimeoutError:
            raise PolicyEndpointError(f"{where} timed out after {self.timeout_s:g} s; the server is "
                                      "overloaded or stuck: lower --concurrency or raise "
                                      "timeout_s=") from None
        except openai.APIConnectionError as exc:
            raise PolicyEndpointError(f"{where} is unreachable ({_cause(exc)}); start the server or fix the "
                                      "URL") from None
        except openai.APIStatusError as exc:
            if exc.status_code == 400 and _CONTEXT.search(_message(exc)):
                raise ContextLengthExceeded(f"{where}: {_message(exc)}") from None
            raise PolicyEndpointError(f"{where} answered HTTP {exc.status_code}: {_message(exc)}; check the "
                                      "request options and the server's log") from None
        except openai.APIError as exc:
            raise PolicyEndpointError(f"{where} returned a response that is not OpenAI-compatible "
                                      f"({type(exc).__name__}: {str(exc)[:200]})") from None

    def _reply(self, body: Any, *, chat: bool) -> EndpointReply:
        what = "chat completion" if chat else "completion"
        try:
            data = body.model_dump() if hasattr(body, "model_dump") else dict(body)
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            if chat:
                message = choice["message"]
                text = message.get("content") or ""
                if message.get("tool_calls"):
                    text = (text + "\n" if text else "") + _tool_calls_as_text(message["tool_calls"])
                entries = (choice.get("logprobs") or {}).get("content")
                logprobs = [float(e["logprob"]) for e in entries] if entries else None
                tokens = [e["token"] for e in entries] if entries else None
                alternatives = [[(e2["token"], e2["logprob"]) for e2 in e.get("top_logprobs") or []]
                                for e in entries] if entries else None
            else:
                text = choice["text"]
                lp = choice.get("logprobs") or {}
                logprobs = [float(x) for x in lp["token_logprobs"]] if lp.get("token_logprobs") else None
                tokens = lp.get("tokens")
                alternatives = ([list((t or {}).items()) for t in lp["top_logprobs"]]
                                if lp.get("top_logprobs") else None)
            if not isinstance(text, str):
                raise TypeError("text is not a string")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            shown = _shown(body)
            route = "POST /chat/completions" if chat else "POST /completions"
            raise PolicyEndpointError(f"policy endpoint {self.base_url} ({route}) returned something that is "
                                      f"not an OpenAI {what}: {shown}; is the URL an OpenAI-compatible API "
                                      "root?") from None
        ids = choice.get("token_ids")
        if ids is None and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        top = None
        if alternatives and all(str(t).startswith("token_id:") for row in alternatives for t, _ in row):
            top = [[(int(str(t).split(":", 1)[1]), float(v)) for t, v in row] for row in alternatives]
        return EndpointReply(text, str(choice.get("finish_reason") or "stop"),
                             [int(i) for i in ids] if ids is not None else None, logprobs, top,
                             usage.get("completion_tokens"), usage.get("prompt_tokens"))


def _shown(body: Any) -> str:
    """A short view of an unexpected response body (the fields it did have)."""
    import json

    try:
        data = body.model_dump() if hasattr(body, "model_dump") else body
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}
        return json.dumps(data, default=str)[:200]
    except (TypeError, ValueError):
        return repr(body)[:200]


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause else str(exc)


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        detail = body.get("error", body)
        if isinstance(detail, dict) and detail.get("message"):
            return str(detail["message"])[:300]
    text = getattr(getattr(exc, "response", None), "text", "") or str(exc)
    return " ".join(text.split())[:300]


def _tool_calls_as_text(calls: list[dict[str, Any]]) -> str:
    import json

    lines = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            pass
        lines.append(f"<tool_call>{json.dumps({'name': function.get('name'), 'arguments': arguments})}"
                     "</tool_call>")
    return "\n".join(lines)


def load_chat_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer in a local model directory (no weights loaded), which must have a chat template.

    Raises:
        ConfigError: not a directory, no tokenizer files, or no chat template (naming the fix).
    """
    from agentgym.backends.gguf import model_dir

    where = model_dir(path)  # a packaged model's name or a .gguf file: its converted folder
    if not where.is_dir():
        raise ConfigError(f"tokenizer directory '{where}' does not exist; pass tokenizer=DIR, a local "
                          "Hugging Face directory holding the served model's tokenizer")
    if not any((where / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ConfigError(f"'{where}' has no tokenizer files (tokenizer.json or tokenizer_config.json); "
                          f"save them there with tokenizer.save_pretrained('{where}')")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the tokenizer in '{where}' has no chat template; add 'chat_template' to "
                          f"{where / 'tokenizer_config.json'} or a {where / 'chat_template.jinja'} file")
    return tokenizer


class OpenAIPolicy(PolicyBase):
    """The ``Policy`` protocol over an endpoint's completions API: prompts go out as token ids and
    each prompt of a batch is one request, all sent concurrently.

    Args:
        endpoint: the server and model.
        tokenizer: the served model's tokenizer (renders prompts, decodes responses).
        concurrency: requests in flight at once.
        allow_retokenize: accept servers that return only text by tokenizing it again (evaluation
            only; see the module docstring). False makes such a reply a ``PolicyEndpointError``.

    ``Generation.entropies`` are never available over the API (None); top log-probs only from
    servers that write tokens as ``token_id:N``. ``sync_weights`` cannot reach the server's weights
    and accepts only None (nothing to sync).

    Example (needs a running server)::

        policy = OpenAIPolicy(OpenAIEndpoint("http://127.0.0.1:8001/v1"), load_chat_tokenizer("model/"))
        [generation] = policy.generate([prompt_ids], SamplingParams(max_new_tokens=16))
    """

    supports_entropies = False
    """The API returns no per-position entropies."""

    def __init__(self, endpoint: OpenAIEndpoint, tokenizer: ChatTokenizer, *, concurrency: int = 32,
                 allow_retokenize: bool = False) -> None:
        self.endpoint = endpoint
        self.tokenizer = tokenizer
        self.allow_retokenize = allow_retokenize
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="agentgym-openai")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One concurrent completions request per prompt (``seed + i`` for prompt i when seeded)."""
        from dataclasses import replace

        def one(item: tuple[int, Sequence[int]]) -> Generation:
            index, prompt = item
            seeded = params if params.seed is None else replace(params, seed=params.seed + index)
            reply = self.endpoint.complete(prompt, seeded, token_ids=True)
            return self._generation(reply, params.num_top_logprobs > 0)

        return list(self._pool.map(one, enumerate(prompts)))

    def _generation(self, reply: EndpointReply, wants_top: bool) -> Generation:
        extras: dict[str, Any] = {}
        ids = reply.token_ids
        if ids is None:
            if not self.allow_retokenize:
                raise PolicyEndpointError(
                    f"policy endpoint {self.endpoint.base_url} returned text but no generated token ids; "
                    "training must not re-tokenize text. Use a server that honours return_token_ids "
                    "(vLLM >= 0.10.2, agentgym serve-policy)")
            ids = list(self.tokenizer.encode(reply.text, add_special_tokens=False))  # type: ignore[attr-defined]
            extras["retokenized"] = True
        logprobs = reply.logprobs if reply.logprobs is not None and len(reply.logprobs) == len(ids) else None
        if logprobs is None:
            extras["logprobs_missing"] = True
        if reply.completion_tokens is not None:
            extras["completion_tokens"] = reply.completion_tokens
        reason = "length" if reply.finish_reason == "length" else "stop"
        top = reply.top_logprobs if wants_top else None
        return Generation(list(ids), list(logprobs) if logprobs is not None else [0.0] * len(ids), reason,
                          top, None, extras)

    def sync_weights(self, state_dict: Any) -> None:
        """Nothing to sync when ``state_dict`` is None; weights cannot be sent over the OpenAI API.

        Raises:
            ConfigError: a state dict was given.
        """
        if state_dict is not None:
            raise ConfigError("OpenAIPolicy cannot send weights to an OpenAI-compatible server; "
                              "serve the updated model again (agentgym serve-policy DIR)")

    def close(self) -> None:
        """Stop the request threads."""
        self._pool.shutdown(wait=False)


def _openai_builder(cfg: ModelConfig, seed: int) -> Policy:
    raise ConfigError(
        "model.backend 'openai' cannot train: training needs the policy's weights in this process and a "
        "way to send each update to the server, which the OpenAI API does not offer; use "
        "model.backend=transformers to train, model.backend=vllm-server to train with generation on a vLLM "
        "server (adapters hot-loaded), and `agentgym eval --policy http://HOST:PORT/v1` to evaluate a "
        "served model")


register_backend("openai", _openai_builder)
