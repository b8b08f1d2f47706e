"""``GenerationBatcher``: concurrent generation requests coalesced into few batched ``generate`` calls.

``agentgym serve-policy`` (``openai_server``) sends every request's prompts through one batcher, so an
evaluation with 32 concurrent episodes over HTTP gets batched generation, as it would in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.rollout.policy import Generation, SamplingParams


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
    every job waiting (up to ``max_batch_rows``), groups them by sampling parameters and runs each group
    in a worker thread (the event loop keeps accepting requests meanwhile). The policy is only ever
    called from one thread at a time.
    """

    def __init__(self, policy: TransformersPolicy, max_batch_rows: int = 64,
                 batch_wait_s: float = 0.005) -> None:
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
            with contextlib.suppress(asyncio.CancelledError):  # the cancellation just asked for
                await self._worker

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
        for job, generation in zip(jobs, generations, strict=True):
            if not job.future.done():
                job.future.set_result(generation)
