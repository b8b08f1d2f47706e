"""``agentgym serve-policy``: an OpenAI-compatible HTTP server over a ``TransformersPolicy``.

Routes: ``GET /v1/models``, ``POST /v1/completions`` (text or token-id prompts, batches),
``POST /v1/chat/completions`` (the model's chat template; ``tools`` passed to a template that knows them,
else written in the Hermes text form, as ``agentgym.rollout.chat_messages`` renders a local model's
prompts), ``GET /health``,
and vLLM's run-time LoRA routes ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``
(``{"lora_name", "lora_path"}``; the adapter is then served as model ``lora_name``), so the trainer's
``vllm-server`` backend can be run against this server.
Supported: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (vLLM extension), ``n``, ``stop``
(up to 4 strings, cut from the returned text), ``seed``, log-probs (``logprobs``/``top_logprobs``),
``max_tokens``/``max_completion_tokens``, ``return_token_ids`` (vLLM extension: every choice then
carries ``token_ids`` — the generated ids, never re-tokenized, including the end-of-turn token when
one was sampled — and ``prompt_token_ids``), and ``stream``. Streaming is the cheap kind: the answer
is generated first and then sent as server-sent events, one token per chunk. ``GET /v1/models``
entries carry ``agentgym.prompt``, the prompt settings of the run the model comes from, and
``agentgym.run``, its env and held-out task settings (``agentgym.eval.policies.run_settings``), when the
server was given them (``agentgym eval`` reads both, so a served run is evaluated as its folder is).

Concurrent requests are batched: requests that arrive while a batch is generating are collected
and generated together (one batched ``generate`` per distinct set of sampling parameters), so an
evaluation with 32 concurrent episodes gets batched generation over HTTP too. A request with a
``seed`` is generated in a batch of its own, so its result does not depend on other requests.

The app sits behind ``PolicyGuard``, a pure-ASGI gate: the bearer token (every route but
``/health``), the request-size limit (413 before a large body is read whole), and the last word on
any exception that escapes the app (a logged 500, after which the connection stays usable).
Tokenizing, chat templates and building answers run in worker threads, so a large prompt never
stalls ``/health`` or other requests. One request asks for at most ``max_request_rows`` sequences
(prompts × n). LoRA adapters load only from under ``adapter_dirs`` and only as safetensors.

Errors use OpenAI's body shape ``{"error": {"message", "type", "param", "code"}}``: 400 for a
request the server cannot serve (validation, prompt too long, too many sequences, unsupported
option), 401 for a missing or wrong token, 403 for an adapter path the server does not allow, 404
for an unknown model or route, 405 for a wrong method, 413 for a body over the limit; 500 only for
the server's own failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentgym.backends.generation_batcher import GenerationBatcher
from agentgym.backends.openai_guard import (
    TEXT_ANSWER,
    PolicyGuard,
    RequestError,
    error_response,
    error_responses,
)
from agentgym.backends.openai_wire import ChatRequest, CompletionRequest
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.errors import ConfigError
from agentgym.rollout.chat_messages import render_messages
from agentgym.rollout.policy import Generation, SamplingParams
from agentgym.service_kit.responses import keep_integer_bounds

logger = logging.getLogger(__name__)

#: Defaults of ``create_policy_app`` (``serve-policy --max-body-bytes``, ``--max-request-rows``).
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_REQUEST_ROWS = 256
#: Each loaded adapter is a full copy of the weights: this many at most.
DEFAULT_MAX_ADAPTERS = 8

_T = TypeVar("_T")


# --- LoRA adapters -------------------------------------------------------------------------------


class LoraAdapterRequest(BaseModel):
    """Body of vLLM's ``/v1/unload_lora_adapter`` (``lora_path`` is ignored there)."""

    lora_name: str = Field(min_length=1, max_length=256,
                           description="The model name the adapter is served as.")
    lora_path: str | None = Field(None, max_length=4096,
                                  description="Absolute path of the adapter's directory, on the server.")


class LoraLoadRequest(LoraAdapterRequest):
    """Body of vLLM's ``/v1/load_lora_adapter``."""

    lora_path: str = Field(min_length=1, max_length=4096,  # type: ignore[assignment]
                           description="Absolute path of the adapter's directory, on the server.")


def adapter_policy(policy: TransformersPolicy, adapter_dir: str) -> TransformersPolicy:
    """A policy whose weights are ``policy``'s with the PEFT adapter in ``adapter_dir`` folded in (a copy).

    Raises:
        ConfigError: not an adapter directory, or an adapter for another model.
    """
    import copy

    from agentgym.backends.lora import merged_from_adapter

    model = copy.deepcopy(policy.model)
    model.load_state_dict(merged_from_adapter(policy.model, adapter_dir))
    return TransformersPolicy(model, policy.tokenizer, decode=policy.decode)


def allowed_adapter_dir(path: str, allowed: Sequence[str | Path] | None) -> str:
    """``path`` resolved, when adapters may be loaded from it: under one of ``allowed`` (None: anywhere).

    The files an adapter is loaded from must resolve under the same directory, so a symbolic link
    inside an allowed directory does not lead out of it.

    Raises:
        RequestError: 403 when loading is off (``allowed`` empty) or the path is outside; 400 when
            it is not absolute.
    """
    if allowed is not None and not allowed:
        raise RequestError("loading LoRA adapters is off on this server; start serve-policy with "
                           "--adapter-dir DIR (the directory adapters are saved under)",
                           403, "adapter_loading_off", "lora_path")
    if not Path(path).is_absolute():
        raise RequestError(f"lora_path {path!r} is not an absolute path; send the adapter directory's "
                           "absolute path on the server", param="lora_path")
    resolved = Path(path).resolve()
    if allowed is None:
        return str(resolved)
    roots = [Path(root).resolve() for root in allowed]
    files = [resolved, resolved / "adapter_config.json", resolved / "adapter_model.safetensors"]
    for root in roots:
        if all(f.resolve() == root or root in f.resolve().parents for f in files):
            return str(resolved)
    raise RequestError(f"lora_path {path!r} is outside the directories this server loads adapters from "
                       f"({', '.join(map(str, roots))}; serve-policy --adapter-dir); save the adapter under "
                       "one of them", 403, "adapter_path_not_allowed", "lora_path")


# --- the app -----------------------------------------------------------------------------------


def _longest_token_chars(tokenizer: Any) -> int | None:
    """Characters of the vocabulary's longest entry (None where the tokenizer cannot list its vocabulary)."""
    try:
        return max((len(entry) for entry in tokenizer.get_vocab()), default=0) or None
    except Exception:  # noqa: BLE001 - the bound is an optimisation; without it every prompt is tokenized
        return None


class PolicyServer:
    """What the policy app's handlers share: the policy and its limits, the generation batchers (the base
    model's and one per loaded LoRA adapter) and the worker threads that tokenize and build answers.

    The app keeps it as ``app.state.policy_server``; routes reach it through ``Depends(policy_server)``.
    """

    def __init__(self, policy: TransformersPolicy, model_name: str, *, max_new_tokens: int,
                 max_batch_rows: int, max_request_rows: int, adapter_dirs: Sequence[str | Path] | None,
                 max_adapters: int, prompt_settings: dict[str, Any] | None,
                 run_settings: dict[str, Any] | None) -> None:
        self.policy, self.tokenizer, self.model_name = policy, policy.tokenizer, model_name
        self.max_new_tokens, self.max_batch_rows = max_new_tokens, max_batch_rows
        self.max_request_rows, self.max_adapters = max_request_rows, max_adapters
        self.adapter_dirs = adapter_dirs
        self.prompt_settings, self.run_settings = prompt_settings, run_settings
        self.batcher = GenerationBatcher(policy, max_batch_rows)
        self.adapters: dict[str, GenerationBatcher] = {}  # LoRA adapters loaded at run time, by name
        self.created = int(time.time())
        self.context = int(getattr(policy.model.config, "max_position_embeddings", 0) or 0)
        # A text prompt longer than this many characters cannot fit the context whatever it says (every
        # token covers at most the longest vocabulary entry; 4x leaves room for normalisers): refused
        # without spending seconds of CPU tokenizing it.
        longest = _longest_token_chars(self.tokenizer)
        self.text_limit = self.context * longest * 4 if self.context and longest else None
        self._cpu: list[ThreadPoolExecutor] = []

    async def start(self) -> None:
        # Two threads for tokenizing and building answers: a large prompt occupies one, never the loop.
        self._cpu.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentgym-policy-cpu"))
        await self.batcher.start()

    async def stop(self) -> None:
        for worker in [self.batcher, *self.adapters.values()]:
            await worker.stop()
        self._cpu.pop().shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, work: Callable[[], _T]) -> _T:
        """``work()`` run in a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu[-1], work)

    def model_entries(self) -> list[dict[str, Any]]:
        """``GET /v1/models``'s ``data``: the base model, then each loaded adapter."""
        entries = []
        for name in [self.model_name, *self.adapters]:
            entry = {"id": name, "object": "model", "created": self.created, "owned_by": "agentgym",
                     "max_model_len": self.context or None,
                     "parent": None if name == self.model_name else self.model_name}
            carried = {"prompt": self.prompt_settings, "run": self.run_settings}
            if any(value is not None for value in carried.values()):
                entry["agentgym"] = {key: value for key, value in carried.items() if value is not None}
            entries.append(entry)
        return entries

    async def load_adapter(self, name: str, path: str) -> None:
        """Serve the adapter in ``path`` as model ``name`` (replacing one loaded under that name)."""
        folder = allowed_adapter_dir(path, self.adapter_dirs)
        if name == self.model_name:
            raise RequestError(f"lora_name {name!r} is the base model's name; give the adapter "
                               "another", param="lora_name")
        if name not in self.adapters and len(self.adapters) >= self.max_adapters:
            raise RequestError(f"this server holds {len(self.adapters)} adapters, its limit; unload one "
                               "first (POST /v1/unload_lora_adapter)", param="lora_name")
        try:
            adapted = await asyncio.to_thread(adapter_policy, self.policy, folder)
        except ConfigError as exc:
            raise RequestError(str(exc), param="lora_path") from None
        worker = GenerationBatcher(adapted, self.max_batch_rows)
        await worker.start()
        old = self.adapters.pop(name, None)
        self.adapters[name] = worker
        if old is not None:
            await old.stop()

    async def unload_adapter(self, name: str) -> None:
        worker = self.adapters.pop(name, None)
        if worker is None:
            raise RequestError(f"The lora adapter '{name}' cannot be found.", 404, "not_found", "lora_name")
        await worker.stop()

    def worker_for(self, name: str) -> GenerationBatcher:
        """The batcher generating for model ``name``; 404 for a model this server does not serve."""
        if name in self.adapters:
            return self.adapters[name]
        if name != self.model_name:
            raise RequestError(f"The model '{name}' does not exist; this server serves '{self.model_name}'",
                               404, "model_not_found", "model")
        return self.batcher

    def check_rows(self, prompts: int, n: int) -> None:
        if prompts * n > self.max_request_rows:
            raise RequestError(f"this request asks for {prompts} prompt(s) x n={n} = {prompts * n} "
                               f"sequences; this server generates at most {self.max_request_rows} per "
                               "request (serve-policy --max-request-rows): send fewer prompts or a smaller n",
                               param="n")

    def sampling(self, body: CompletionRequest | ChatRequest, cap: int | None, prompt_len: int,
                 top_logprobs: int) -> SamplingParams:
        """The request's sampling parameters, after checking its token budget against the limits."""
        wanted = self.max_new_tokens if cap is None else cap
        if wanted > self.max_new_tokens:
            raise RequestError(f"max_tokens={wanted} is above this server's limit of {self.max_new_tokens} "
                               "(serve-policy --max-new-tokens)", param="max_tokens")
        if self.context and prompt_len + wanted > self.context:
            raise RequestError(f"the prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds the "
                               f"model's context length of {self.context} tokens; shorten the prompt or "
                               "lower max_tokens", param="max_tokens")
        return SamplingParams(max_new_tokens=wanted, temperature=body.temperature, top_p=body.top_p,
                              top_k=min(max(body.top_k, 0), self.policy.vocab_size),
                              stop_strings=body.stop_strings, num_top_logprobs=top_logprobs, seed=body.seed)

    async def generate(self, prompts: list[list[int]], params: SamplingParams, n: int,
                       worker: GenerationBatcher) -> list[Generation]:
        """``n`` generations of each prompt, prompt-major."""
        rows = [p for p in prompts for _ in range(n)]
        try:
            # n samples of one prompt must differ: each gets its own seed when the request is seeded.
            if params.seed is not None and n > 1 and params.temperature > 0:
                per_row = await asyncio.gather(*(
                    worker.generate([row], replace(params, seed=params.seed + i))
                    for i, row in enumerate(rows)))
                return [g[0] for g in per_row]
            return await worker.generate(rows, params)
        except ConfigError as exc:
            raise RequestError(str(exc)) from None

    def prompt_ids(self, item: str | list[int]) -> list[int]:
        """Token ids of one prompt (runs in a worker thread: tokenizing a long text takes seconds)."""
        if isinstance(item, str):
            if self.text_limit is not None and len(item) > self.text_limit:
                raise RequestError(f"a prompt of {len(item)} characters cannot fit the model's context of "
                                   f"{self.context} tokens; shorten it", param="prompt")
            ids = list(self.tokenizer.encode(item, add_special_tokens=False))
        else:
            ids = list(item)
        if not ids:
            raise RequestError("a prompt is empty; send at least one token", param="prompt")
        vocab = self.policy.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"prompt token ids must be in [0, {vocab}) for this model", param="prompt")
        return ids

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of a chat request's messages (runs in a worker thread)."""
        try:
            # as a local model's prompt is rendered: tools in the Hermes form for a template without them
            rendered = render_messages(self.tokenizer, messages, tools)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            raise RequestError(f"the chat template could not render these messages: {exc}",
                               param="messages") from None
        return self.prompt_ids(rendered)


def create_policy_app(policy: TransformersPolicy, model_name: str, *, max_new_tokens: int = 512,
                      max_batch_rows: int = 64, token: str | None = None,
                      max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                      max_request_rows: int = DEFAULT_MAX_REQUEST_ROWS,
                      adapter_dirs: Sequence[str | Path] | None = None,
                      max_adapters: int = DEFAULT_MAX_ADAPTERS,
                      prompt_settings: dict[str, Any] | None = None,
                      run_settings: dict[str, Any] | None = None) -> PolicyGuard:
    """The ASGI app serving ``policy`` as model ``model_name`` (a FastAPI app behind ``PolicyGuard``).

    Args:
        policy: the backend (its tokenizer must have a chat template for the chat route).
        model_name: the id clients pass as ``model``.
        max_new_tokens: cap on ``max_tokens`` (and the default for chat requests that give none).
        max_batch_rows: most sequences one batched generate call takes.
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413.
        max_request_rows: most sequences (prompts × n) one request may ask for; more get 400.
        adapter_dirs: directories LoRA adapters may be loaded from; empty: adapter loading is off;
            None: any directory (for in-process use, where the caller is the only client).
        max_adapters: most adapters loaded at once (each is a copy of the weights).
        prompt_settings: the prompt settings of the run the model comes from, listed in
            ``GET /v1/models`` entries as ``agentgym.prompt`` (None: not listed).
        run_settings: the env and held-out task settings of that run (``run_settings`` of
            ``agentgym.eval.policies``), listed as ``agentgym.run`` (None: not listed).

    Raises:
        ConfigError: a limit below 1.

    Example:
        >>> from agentgym.backends.tiny import TinyModelConfig
        >>> app = create_policy_app(TransformersPolicy.from_pretrained(TinyModelConfig(num_layers=1)), "tiny")
        >>> sorted(r.path for r in app.routes if r.path.startswith("/v1"))  # doctest: +NORMALIZE_WHITESPACE
        ['/v1/chat/completions', '/v1/completions', '/v1/load_lora_adapter', '/v1/models',
         '/v1/unload_lora_adapter']
    """
    for label, value in (("max_body_bytes", max_body_bytes), ("max_request_rows", max_request_rows),
                         ("max_adapters", max_adapters), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{label} must be an integer >= 1, got {value!r}")
    server = PolicyServer(policy, model_name, max_new_tokens=max_new_tokens, max_batch_rows=max_batch_rows,
                          max_request_rows=max_request_rows, adapter_dirs=adapter_dirs,
                          max_adapters=max_adapters, prompt_settings=prompt_settings,
                          run_settings=run_settings)
    app = FastAPI(title="agentgym policy server (OpenAI-compatible)", lifespan=_lifespan)
    app.state.policy_server = server
    app.state.batcher = server.batcher
    keep_integer_bounds(app)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(RequestError, _refused)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _failed)
    _add_routes(app)
    return PolicyGuard(app, token=token, max_body_bytes=max_body_bytes)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    server: PolicyServer = app.state.policy_server
    await server.start()
    yield
    await server.stop()


async def policy_server(request: Request) -> PolicyServer:
    """The ``PolicyServer`` of the app serving ``request`` (a FastAPI dependency; ``async`` so that FastAPI
    calls it on the event loop, not in a worker thread)."""
    return request.app.state.policy_server


Served = Annotated[PolicyServer, Depends(policy_server)]


# --- error answers -----------------------------------------------------------------------------


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response("the request body is not valid JSON; send a JSON object with "
                              "'Content-Type: application/json'", 400, "invalid_json")
    first = max(errors, key=_telling) if errors else {"msg": str(exc), "loc": ()}
    param = ".".join(str(p) for p in first.get("loc", ())[1:] if not _is_union_tag(p)) or None
    return error_response(f"{first.get('msg')} ({param or 'body'})", 400, "invalid_request", param)


async def _refused(_request: Request, exc: RequestError) -> JSONResponse:
    return error_response(str(exc), exc.status, exc.code, exc.param)


async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = {404: "no such route; this server serves /v1/models, /v1/completions, /v1/chat/completions",
               405: "this route does not take that method"}.get(exc.status_code, str(exc.detail))
    return error_response(message, exc.status_code, headers=exc.headers)


async def _failed(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(f"the server failed on this request ({type(exc).__name__}); its log has the "
                          "details", 500, "internal_error")


# --- routes ------------------------------------------------------------------------------------

_COMPLETION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {"schema": {"type": "string"}}},
          "description": "The completion; server-sent events with stream=true."},
    **error_responses(400, 401, 404, 413)}


async def health(server: Served) -> dict[str, Any]:
    return {"status": "ok", "model": server.model_name, "batches": server.batcher.batches}


async def models(server: Served) -> dict[str, Any]:
    return {"object": "list", "data": server.model_entries()}


async def load_lora_adapter(body: LoraLoadRequest, server: Served) -> Any:
    """vLLM's run-time LoRA loading: the adapter folded into a copy of the base weights, served as
    model ``lora_name`` from then on (loading a name again replaces it)."""
    await server.load_adapter(body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_lora_adapter(body: LoraAdapterRequest, server: Served) -> Any:
    await server.unload_adapter(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


async def completions(body: CompletionRequest, server: Served) -> Any:
    worker = server.worker_for(body.model)
    try:
        items = body.prompts()
    except ValueError as exc:
        raise RequestError(str(exc), param="prompt") from None
    server.check_rows(len(items), body.n)
    prompts = await server.off_loop(lambda: [server.prompt_ids(p) for p in items])
    params = server.sampling(body, body.max_tokens, max(map(len, prompts)), body.logprobs or 0)
    generations = await server.generate(prompts, params, body.n, worker)
    rid = f"cmpl-{uuid.uuid4().hex}"
    built = await server.off_loop(lambda: _completion_answer(server, rid, prompts, generations, body))
    return _sse(built) if body.stream else built


async def chat(body: ChatRequest, server: Served) -> Any:
    worker = server.worker_for(body.model)
    server.check_rows(1, body.n)
    try:
        messages = [m.for_template() for m in body.messages]
    except ValueError as exc:
        raise RequestError(str(exc), param="messages") from None
    # Templates render system, user and tool texts whole (assistant turns they may trim).
    verbatim = sum(len(m["content"]) for m in messages if m["role"] != "assistant")
    if server.text_limit is not None and verbatim > server.text_limit:
        raise RequestError(f"these messages hold {verbatim} characters, which cannot fit the model's "
                           f"context of {server.context} tokens; shorten them", param="messages")
    tools = body.tools if body.tools and body.tool_choice != "none" else None
    prompt = await server.off_loop(lambda: server.chat_prompt(messages, tools))
    top_logprobs = (body.top_logprobs or 0) if body.logprobs else 0
    params = server.sampling(body, body.token_cap, len(prompt), top_logprobs)
    generations = await server.generate([prompt], params, body.n, worker)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    built = await server.off_loop(lambda: _chat_answer(server, rid, prompt, generations, body))
    return _sse(built) if body.stream else built


def _add_routes(app: FastAPI) -> None:
    """The routes, in the order ``/openapi.json`` lists them.

    Added to the app itself, not through an included ``APIRouter``: recent FastAPI keeps an included
    router as one nested route, and what reads ``app.routes`` (the services' 405 ``Allow``) wants each.
    """
    app.get("/health")(health)
    app.get("/v1/models", responses=error_responses(401))(models)
    app.post("/v1/load_lora_adapter", responses={**TEXT_ANSWER, **error_responses(400, 401, 403, 413)}
             )(load_lora_adapter)
    app.post("/v1/unload_lora_adapter", responses={**TEXT_ANSWER, **error_responses(400, 401, 404, 413)}
             )(unload_lora_adapter)
    app.post("/v1/completions", responses=_COMPLETION_RESPONSES)(completions)
    app.post("/v1/chat/completions", responses=_COMPLETION_RESPONSES)(chat)


# --- answers (built in a worker thread: decoding every token's text takes a while) ---------------


def _completion_answer(server: PolicyServer, rid: str, prompts: list[list[int]],
                       generations: list[Generation], body: CompletionRequest) -> Any:
    """The JSON response, or the streamed events, of a completion request."""
    tokenizer = server.tokenizer
    choices = [_completion_choice(tokenizer, i, prompts[i // body.n], g, body)
               for i, g in enumerate(generations)]
    usage = _usage(prompts, generations)
    if body.stream:
        return _completion_chunks(rid, server.created, server.model_name, choices, usage,
                                  body.include_usage_in_stream)
    return JSONResponse({"id": rid, "object": "text_completion", "created": int(time.time()),
                         "model": server.model_name, "choices": choices, "usage": usage})


def _chat_answer(server: PolicyServer, rid: str, prompt: list[int], generations: list[Generation],
                 body: ChatRequest) -> Any:
    """The JSON response, or the streamed events, of a chat request."""
    choices = [_chat_choice(server.tokenizer, i, prompt, g, body) for i, g in enumerate(generations)]
    usage = _usage([prompt], generations)
    if body.stream:
        return _chat_chunks(rid, server.created, server.model_name, choices, usage,
                            body.include_usage_in_stream)
    return JSONResponse({"id": rid, "object": "chat.completion", "created": int(time.time()),
                         "model": server.model_name, "choices": choices, "usage": usage})


def _text_of(tokenizer: Any, generation: Generation,
             body: CompletionRequest | ChatRequest) -> tuple[str, str]:
    """The returned text (cut before the first stop string, or after it with
    ``include_stop_str_in_output``) and the finish reason."""
    text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    cuts = [(text.find(s), s) for s in body.stop_strings if s in text]
    if cuts:
        at, stop = min(cuts)
        return text[:at + (len(stop) if body.include_stop_str_in_output else 0)], "stop"
    return text, generation.finish_reason


def _piece(tokenizer: Any, token_id: int, as_id: bool = False) -> str:
    return f"token_id:{token_id}" if as_id else tokenizer.decode([token_id], skip_special_tokens=False)


def _completion_choice(tokenizer: Any, index: int, prompt: list[int], g: Generation,
                       body: CompletionRequest) -> dict[str, Any]:
    text, reason = _text_of(tokenizer, g, body)
    choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
    as_ids = body.return_tokens_as_token_ids
    if body.logprobs is not None:
        tokens = [_piece(tokenizer, t, as_ids) for t in g.token_ids]
        offsets, at = [], 0
        for text_piece in tokens:
            offsets.append(at)
            at += len(text_piece)
        choice["logprobs"] = {
            "tokens": tokens, "token_logprobs": list(g.logprobs), "text_offset": offsets,
            "top_logprobs": [{_piece(tokenizer, t, as_ids): lp for t, lp in pos} for pos in g.top_logprobs]
            if g.top_logprobs is not None else None,
        }
    if body.return_token_ids:
        choice["token_ids"], choice["prompt_token_ids"] = list(g.token_ids), prompt
    return choice


def _chat_choice(tokenizer: Any, index: int, prompt: list[int], g: Generation, body: ChatRequest
                 ) -> dict[str, Any]:
    text, reason = _text_of(tokenizer, g, body)
    as_ids = body.return_tokens_as_token_ids
    choice: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": text},
                              "logprobs": None, "finish_reason": reason}
    if body.logprobs:
        content = []
        for position, (token_id, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=True)):
            alternatives = g.top_logprobs[position] if g.top_logprobs is not None else []
            content.append({"token": _piece(tokenizer, token_id, as_ids), "logprob": lp,
                            "bytes": list(_piece(tokenizer, token_id).encode()),
                            "top_logprobs": [{"token": _piece(tokenizer, t, as_ids), "logprob": v,
                                              "bytes": list(_piece(tokenizer, t).encode())}
                                             for t, v in alternatives]})
        choice["logprobs"] = {"content": content}
    if body.return_token_ids:
        choice["token_ids"], choice["prompt_token_ids"] = list(g.token_ids), prompt
    return choice


def _telling(error: Any) -> tuple[int, bool]:
    """Rank of a validation error: in a union (``prompt``: text, ids, or batches of either) the telling
    error is the deepest one, and one that broke a bound rather than a member the value never meant to be."""
    return len(error.get("loc", ())), not str(error.get("type", "")).endswith("_type")


def _is_union_tag(part: Any) -> bool:
    """Whether a location part names a union member (``str``, ``list[int]``), not a field."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "list", "dict"))


def _usage(prompts: Sequence[list[int]], generations: Sequence[Generation]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prompts)
    completion = sum(len(g.token_ids) for g in generations)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def _sse(events: list[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for event in events:
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def _split_text(text: str, pieces: int) -> list[str]:
    """``text`` in about ``pieces`` consecutive chunks (the streamed deltas; they join to ``text``)."""
    if not text:
        return []
    size = max(1, -(-len(text) // max(pieces, 1)))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _completion_chunks(rid: str, created: int, model: str, choices: list[dict[str, Any]],
                       usage: dict[str, int], include_usage: bool) -> list[dict[str, Any]]:
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    events = []
    for c in choices:
        pieces = len(c["token_ids"]) if "token_ids" in c else len(c["text"])
        for text in _split_text(c["text"], pieces):
            events.append({**head, "choices": [{"index": c["index"], "text": text, "logprobs": None,
                                                "finish_reason": None}]})
        events.append({**head, "choices": [{"index": c["index"], "text": "", "logprobs": None,
                                            "finish_reason": c["finish_reason"]}]})
    if include_usage:
        events.append({**head, "choices": [], "usage": usage})
    return events


def _chat_chunks(rid: str, created: int, model: str, choices: list[dict[str, Any]],
                 usage: dict[str, int], include_usage: bool) -> list[dict[str, Any]]:
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    events = []
    for c in choices:
        delta_start = {"index": c["index"], "delta": {"role": "assistant", "content": ""},
                       "finish_reason": None}
        events.append({**head, "choices": [delta_start]})
        text = c["message"]["content"]
        tokens = c.get("logprobs") or {}
        for chunk in _split_text(text, len(tokens.get("content") or []) or len(text)):
            events.append({**head, "choices": [{"index": c["index"], "delta": {"content": chunk},
                                                "finish_reason": None}]})
        events.append({**head, "choices": [{"index": c["index"], "delta": {},
                                            "finish_reason": c["finish_reason"]}]})
    if include_usage:
        events.append({**head, "choices": [], "usage": usage})
    return events


def load_policy_app(model_dir: str, *, name: str, device: str = "auto", dtype: str = "float32", seed: int = 0,
                    **app_options: Any) -> PolicyGuard:
    """Load the model in ``model_dir`` (a Hugging Face directory, an ``agentgym train`` run folder's
    ``model/``, a packaged model's name or a ``.gguf`` file, converted once: ``agentgym.backends.gguf``) and
    build its app (``create_policy_app`` with ``app_options``), served as model ``name``.

    Raises:
        ConfigError: the directory is not a usable model (missing or malformed files, no tokenizer or
            chat template), or an unknown dtype or device; one line each.
    """
    from agentgym.backends.builder import make_policy
    from agentgym.backends.config import ModelConfig
    from agentgym.backends.gguf import model_dir as resolve_model_dir

    model_dir = str(resolve_model_dir(model_dir))
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        raise ConfigError(f"{model_dir} is not a model directory (no config.json); give a Hugging Face model "
                          "directory or an `agentgym train` run folder")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{config} is not valid JSON ({exc}); restore the model's config.json") from None
    try:
        cfg = ModelConfig(path=model_dir, device=device, dtype=dtype)  # type: ignore[arg-type]
        policy = make_policy(cfg, seed=seed)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable weights, tokenizer or config: the directory's fault
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"cannot load the model in {model_dir}: {type(exc).__name__}: {first}") from None
    return create_policy_app(policy, name, **app_options)  # type: ignore[arg-type]
