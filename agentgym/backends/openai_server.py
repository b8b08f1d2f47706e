"""``agentgym serve-policy``: an OpenAI-compatible HTTP server over a ``TransformersPolicy``.

Routes: ``GET /v1/models``, ``POST /v1/completions`` (text or token-id prompts, batches),
``POST /v1/chat/completions`` (the model's chat template, ``tools`` passed to it), ``GET /health``,
and vLLM's run-time LoRA routes ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``
(``{"lora_name", "lora_path"}``; the adapter is then served as model ``lora_name``), so the trainer's
``vllm-server`` backend can be run against this server.
Supported: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (vLLM extension), ``n``, ``stop``
(up to 4 strings, cut from the returned text), ``seed``, log-probs (``logprobs``/``top_logprobs``),
``max_tokens``/``max_completion_tokens``, ``return_token_ids`` (vLLM extension: every choice then
carries ``token_ids`` — the generated ids, never re-tokenized, including the end-of-turn token when
one was sampled — and ``prompt_token_ids``), and ``stream``. Streaming is the cheap kind: the answer
is generated first and then sent as server-sent events, one token per chunk.

Concurrent requests are batched: requests that arrive while a batch is generating are collected
and generated together (one batched ``generate`` per distinct set of sampling parameters), so an
evaluation with 32 concurrent episodes gets batched generation over HTTP too. A request with a
``seed`` is generated in a batch of its own, so its result does not depend on other requests.

Errors use OpenAI's body shape ``{"error": {"message", "type", "param", "code"}}``: 400 for a
request the server cannot serve (validation, prompt too long, unsupported option), 404 for an
unknown model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel

from agentgym.backends.openai_wire import ChatRequest, CompletionRequest
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.errors import ConfigError
from agentgym.rollout.policy import Generation, SamplingParams


class RequestError(Exception):
    """A request this server cannot serve; answered with ``status`` and OpenAI's error body."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def _error_response(message: str, status: int, code: str | None = None, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


# --- batching ----------------------------------------------------------------------------------


class LoraAdapterRequest(BaseModel):
    """Body of vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``."""

    lora_name: str
    lora_path: str | None = None


def adapter_policy(policy: TransformersPolicy, adapter_dir: str) -> TransformersPolicy:
    """A policy whose weights are ``policy``'s with the PEFT adapter in ``adapter_dir`` folded in (a copy).

    Raises:
        ConfigError: not an adapter directory, or an adapter for another model.
    """
    import copy

    from agentgym.backends.lora import merged_from_adapter

    model = copy.deepcopy(policy.model)
    model.load_state_dict(merged_from_adapter(policy.model, adapter_dir))
    return TransformersPolicy(model, policy.tokenizer)


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    group: Any
    """Jobs with equal ``group`` may share a generate call."""
    future: asyncio.Future[Generation] = field(repr=False, default=None)  # type: ignore[assignment]


class GenerationBatcher:
    """Collects generation jobs from concurrent requests and runs them as few batched ``generate`` calls.

    One worker task takes the first job, waits ``batch_wait_s`` for others sent at the same time, takes
    every job waiting (up to ``max_batch_rows``), groups them by sampling parameters and runs each group in a worker thread (the event loop keeps accepting
    requests meanwhile). The policy is only ever called from one thread at a time.
    """

    def __init__(self, policy: TransformersPolicy, max_batch_rows: int = 64, batch_wait_s: float = 0.005) -> None:
        self.policy = policy
        self.max_batch_rows = max_batch_rows
        self.batch_wait_s = batch_wait_s
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0
        """Generate calls made so far (tests and /health read it)."""

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass

    async def generate(self, prompts: Sequence[list[int]], params: SamplingParams) -> list[Generation]:
        """Generate one continuation per prompt; seeded requests get a batch of their own."""
        if self._queue is None:
            raise RuntimeError("GenerationBatcher.start() was not awaited")
        loop = asyncio.get_running_loop()
        # Greedy output does not depend on the batch, so greedy requests always share batches.
        group = (replace(params, seed=None), None) if params.temperature == 0 or params.seed is None \
            else (params, uuid.uuid4().hex)
        if params.temperature == 0:
            params = replace(params, seed=None)
        jobs = [_Job(list(p), params, group, loop.create_future()) for p in prompts]
        for job in jobs:
            self._queue.put_nowait(job)
        return list(await asyncio.gather(*(job.future for job in jobs)))

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            jobs = [await self._queue.get()]
            # Requests sent together reach the loop a few hundred microseconds apart: a short wait lets
            # them join this batch instead of waiting for the next one.
            await asyncio.sleep(self.batch_wait_s)
            while not self._queue.empty() and len(jobs) < self.max_batch_rows:
                jobs.append(self._queue.get_nowait())
            groups: dict[Any, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.group, []).append(job)
            for members in groups.values():
                await self._generate(members)

    async def _generate(self, jobs: list[_Job]) -> None:
        params = jobs[0].params
        try:
            generations = await asyncio.to_thread(self.policy.generate, [j.prompt_ids for j in jobs], params)
        except Exception as exc:  # noqa: BLE001 - every waiting request must hear about it
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        self.batches += 1
        for job, generation in zip(jobs, generations):
            if not job.future.done():
                job.future.set_result(generation)


# --- the app -----------------------------------------------------------------------------------


def create_policy_app(policy: TransformersPolicy, model_name: str, *, max_new_tokens: int = 512,
                      max_batch_rows: int = 64) -> FastAPI:
    """The FastAPI app serving ``policy`` as model ``model_name``.

    Args:
        policy: the backend (its tokenizer must have a chat template for the chat route).
        model_name: the id clients pass as ``model``.
        max_new_tokens: cap on ``max_tokens`` (and the default for chat requests that give none).
        max_batch_rows: most sequences one batched generate call takes.

    Example:
        >>> from agentgym.backends.tiny import TinyModelConfig
        >>> app = create_policy_app(TransformersPolicy.from_pretrained(TinyModelConfig(num_layers=1)), "tiny")
        >>> sorted(r.path for r in app.routes if r.path.startswith("/v1"))
        ['/v1/chat/completions', '/v1/completions', '/v1/load_lora_adapter', '/v1/models', '/v1/unload_lora_adapter']
    """
    tokenizer = policy.tokenizer
    batcher = GenerationBatcher(policy, max_batch_rows)
    adapters: dict[str, GenerationBatcher] = {}  # LoRA adapters loaded at run time, by name
    created = int(time.time())
    context = int(getattr(policy.model.config, "max_position_embeddings", 0) or 0)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        yield
        for worker in [batcher, *adapters.values()]:
            await worker.stop()

    app = FastAPI(title="agentgym policy server (OpenAI-compatible)", lifespan=lifespan)
    app.state.batcher = batcher

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"msg": str(exc), "loc": ()}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return _error_response(f"{first.get('msg')} ({param or 'body'})", 400, "invalid_request", param)

    @app.exception_handler(RequestError)
    async def _refused(_request: Request, exc: RequestError) -> JSONResponse:
        return _error_response(str(exc), exc.status, exc.code, exc.param)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "batches": batcher.batches}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "agentgym",
                                            "max_model_len": context or None,
                                            "parent": None if name == model_name else model_name}
                                           for name in [model_name, *adapters]]}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoraAdapterRequest) -> Any:
        """vLLM's run-time LoRA loading: the adapter folded into a copy of the base weights, served as
        model ``lora_name`` from then on (loading a name again replaces it)."""
        if not body.lora_path:
            raise RequestError("lora_path is required", param="lora_path")
        try:
            adapted = await asyncio.to_thread(adapter_policy, policy, body.lora_path)
        except ConfigError as exc:
            raise RequestError(str(exc), param="lora_path") from None
        worker = GenerationBatcher(adapted, max_batch_rows)
        await worker.start()
        old = adapters.pop(body.lora_name, None)
        adapters[body.lora_name] = worker
        if old is not None:
            await old.stop()
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: LoraAdapterRequest) -> Any:
        worker = adapters.pop(body.lora_name, None)
        if worker is None:
            raise RequestError(f"The lora adapter '{body.lora_name}' cannot be found.", 404, "not_found", "lora_name")
        await worker.stop()
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    def check_model(name: str) -> GenerationBatcher:
        if name in adapters:
            return adapters[name]
        if name != model_name:
            raise RequestError(f"The model '{name}' does not exist; this server serves '{model_name}'",
                               404, "model_not_found", "model")
        return batcher

    def sampling(body: CompletionRequest | ChatRequest, cap: int | None, prompt_len: int,
                 top_logprobs: int) -> SamplingParams:
        wanted = max_new_tokens if cap is None else cap
        if wanted > max_new_tokens:
            raise RequestError(f"max_tokens={wanted} is above this server's limit of {max_new_tokens} "
                               "(serve-policy --max-new-tokens)", param="max_tokens")
        if context and prompt_len + wanted > context:
            raise RequestError(f"the prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds the "
                               f"model's context length of {context} tokens; shorten the prompt or lower max_tokens",
                               param="max_tokens")
        return SamplingParams(max_new_tokens=wanted, temperature=body.temperature, top_p=body.top_p,
                              top_k=max(body.top_k, 0), stop_strings=body.stop_strings,
                              num_top_logprobs=top_logprobs, seed=body.seed)

    async def run(prompts: list[list[int]], params: SamplingParams, n: int, batcher: GenerationBatcher
                  ) -> list[Generation]:
        rows = [p for p in prompts for _ in range(n)]
        try:
            # n samples of one prompt must differ: each gets its own seed when the request is seeded.
            if params.seed is not None and n > 1 and params.temperature > 0:
                per_row = await asyncio.gather(*(batcher.generate([row], replace(params, seed=params.seed + i))
                                                 for i, row in enumerate(rows)))
                return [g[0] for g in per_row]
            return await batcher.generate(rows, params)
        except ConfigError as exc:
            raise RequestError(str(exc)) from None

    def prompt_ids(item: str | list[int]) -> list[int]:
        ids = list(tokenizer.encode(item, add_special_tokens=False)) if isinstance(item, str) else list(item)
        if not ids:
            raise RequestError("a prompt is empty; send at least one token", param="prompt")
        vocab = policy.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"prompt token ids must be in [0, {vocab}) for this model", param="prompt")
        return ids

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        worker = check_model(body.model)
        try:
            prompts = [prompt_ids(p) for p in body.prompts()]
        except ValueError as exc:
            raise RequestError(str(exc), param="prompt") from None
        params = sampling(body, body.max_tokens, max(map(len, prompts)), body.logprobs or 0)
        generations = await run(prompts, params, body.n, worker)
        choices = [completion_choice(i, prompts[i // body.n], g, body) for i, g in enumerate(generations)]
        usage = _usage(prompts, generations)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:
            return _sse(_completion_chunks(rid, created, model_name, choices, usage, body.include_usage_in_stream))
        return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model_name,
                "choices": choices, "usage": usage}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> Any:
        worker = check_model(body.model)
        try:
            messages = [m.for_template() for m in body.messages]
        except ValueError as exc:
            raise RequestError(str(exc), param="messages") from None
        extra = {"tools": body.tools} if body.tools else {}
        try:
            rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **extra)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            raise RequestError(f"the chat template could not render these messages: {exc}",
                               param="messages") from None
        if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
            rendered = rendered["input_ids"]
        prompt = prompt_ids(list(rendered))
        params = sampling(body, body.token_cap, len(prompt), (body.top_logprobs or 0) if body.logprobs else 0)
        generations = await run([prompt], params, body.n, worker)
        choices = [chat_choice(i, prompt, g, body) for i, g in enumerate(generations)]
        usage = _usage([prompt], generations)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if body.stream:
            return _sse(_chat_chunks(rid, created, model_name, choices, usage, body.include_usage_in_stream))
        return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model_name,
                "choices": choices, "usage": usage}

    # --- response pieces (closures over the tokenizer) -------------------------------------------

    def text_of(generation: Generation, body: CompletionRequest | ChatRequest) -> tuple[str, str]:
        """The returned text (cut before the first stop string, or after it with
        ``include_stop_str_in_output``) and the finish reason."""
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        cuts = [(text.find(s), s) for s in body.stop_strings if s in text]
        if cuts:
            at, stop = min(cuts)
            return text[:at + (len(stop) if body.include_stop_str_in_output else 0)], "stop"
        return text, generation.finish_reason

    def piece(token_id: int, as_id: bool = False) -> str:
        return f"token_id:{token_id}" if as_id else tokenizer.decode([token_id], skip_special_tokens=False)

    def completion_choice(index: int, prompt: list[int], g: Generation, body: CompletionRequest) -> dict[str, Any]:
        text, reason = text_of(g, body)
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        as_ids = body.return_tokens_as_token_ids
        if body.logprobs is not None:
            tokens = [piece(t, as_ids) for t in g.token_ids]
            offsets, at = [], 0
            for token in tokens:
                offsets.append(at)
                at += len(token)
            choice["logprobs"] = {
                "tokens": tokens, "token_logprobs": list(g.logprobs), "text_offset": offsets,
                "top_logprobs": [{piece(t, as_ids): lp for t, lp in pos} for pos in g.top_logprobs]
                if g.top_logprobs is not None else None,
            }
        if body.return_token_ids:
            choice["token_ids"], choice["prompt_token_ids"] = list(g.token_ids), prompt
        return choice

    def chat_choice(index: int, prompt: list[int], g: Generation, body: ChatRequest) -> dict[str, Any]:
        text, reason = text_of(g, body)
        as_ids = body.return_tokens_as_token_ids
        choice: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": reason}
        if body.logprobs:
            content = []
            for position, (token, lp) in enumerate(zip(g.token_ids, g.logprobs)):
                text_piece = piece(token, as_ids)
                alternatives = g.top_logprobs[position] if g.top_logprobs is not None else []
                content.append({"token": text_piece, "logprob": lp, "bytes": list(piece(token).encode()),
                                "top_logprobs": [{"token": piece(t, as_ids), "logprob": v,
                                                  "bytes": list(piece(t).encode())} for t, v in alternatives]})
            choice["logprobs"] = {"content": content}
        if body.return_token_ids:
            choice["token_ids"], choice["prompt_token_ids"] = list(g.token_ids), prompt
        return choice

    return app


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
        delta_start = {"index": c["index"], "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        events.append({**head, "choices": [delta_start]})
        text = c["message"]["content"]
        tokens = c.get("logprobs") or {}
        for chunk in _split_text(text, len(tokens.get("content") or []) or len(text)):
            events.append({**head, "choices": [{"index": c["index"], "delta": {"content": chunk},
                                                "finish_reason": None}]})
        events.append({**head, "choices": [{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}]})
    if include_usage:
        events.append({**head, "choices": [], "usage": usage})
    return events


def serve_policy(model_dir: str, *, host: str = "127.0.0.1", port: int = 8001, name: str | None = None,
                 device: str = "auto", dtype: str = "float32", seed: int = 0, max_new_tokens: int = 512,
                 log_level: str = "warning", sock: Any = None) -> None:
    """Load the model in ``model_dir`` (a Hugging Face directory, or an ``agentgym train`` run folder's
    ``model/``) and serve it until interrupted; on ``sock`` (a listening socket, e.g. from
    ``agentgym.cli.serving.bind``) when given, else on ``host:port``.

    Raises:
        ConfigError: the directory is not a usable model (missing files, tokenizer or chat template).
    """
    import uvicorn

    from agentgym.backends.builder import make_policy
    from agentgym.backends.config import ModelConfig

    policy = make_policy(ModelConfig(path=model_dir, device=device, dtype=dtype), seed=seed)  # type: ignore[arg-type]
    served = name or model_dir.rstrip("/").split("/")[-1]
    app = create_policy_app(policy, served, max_new_tokens=max_new_tokens)  # type: ignore[arg-type]
    if sock is None:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
    else:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False)).run(sockets=[sock])
