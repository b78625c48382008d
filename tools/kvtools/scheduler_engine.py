"""The engine loop around a real vLLM scheduler, with a fake model runner.

:class:`Engine` plays vLLM's engine core for :mod:`kvtools.scheduler_traces`:
each engine step lets requests arrive (and now and then aborts one), calls
``schedule()``, answers with a ``ModelRunnerOutput`` (a sampled token for
each request past its prompt, plus the accepted part of its draft tokens
under speculative decoding) and calls ``update_from_output``; synchronous
scheduling then hands the drafter's next proposals to the scheduler, as the
engine core does after a step. Asynchronous scheduling keeps two steps in
flight, filling the queue before taking the oldest step's output, as the
engine core's batch queue does (``EngineCore.step_with_batch_queue``).
Everything random comes from one seeded generator, so a run is reproducible.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from typing import Any, Final

from .scheduler_recorder import Recorder
from .scheduler_rig import Rig

VOCAB: Final = 8
"""Prompt and output tokens are drawn from ``0 .. VOCAB - 1``: few enough that
decoded blocks repeat too."""
STOP: Final = VOCAB
"""The stop token (never in a prompt)."""
BATCH_QUEUE: Final = 2
"""Steps in flight under asynchronous scheduling (vLLM's ``max_concurrent_batches``)."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One recorded run.

    Attributes:
        name: The file stem (``<shape>-<sync|async>``).
        shape: A shape of :mod:`kvref.shapes`.
        asynchronous: ``AsyncScheduler``.
        seed: Seeds the workload (arrivals, prompts, sampled tokens, aborts).
        block_size: Base block size of the shape.
        window: Sliding window (tokens).
        num_blocks: Pool size, the null block included: small, so requests get preempted.
        max_model_len: Longest request.
        token_budget: Tokens per step (chunked prefill splits longer prompts).
        max_num_seqs: Requests running at once.
        calls: Arrivals stop once this many manager calls were recorded.
        events: KV-cache events on.
        log_stats: Scheduler statistics on.
        spec_tokens: Draft tokens per step (0: no speculative decoding).
        drafter: ``eagle`` or ``ngram`` (:class:`kvtools.scheduler_rig.RigSettings`).
    """

    name: str
    shape: str
    asynchronous: bool
    seed: int
    block_size: int = 4
    window: int = 8
    num_blocks: int = 28
    max_model_len: int = 48
    token_budget: int = 16
    max_num_seqs: int = 4
    calls: int = 220
    events: bool = False
    log_stats: bool = False
    spec_tokens: int = 0
    drafter: str = "ngram"


class Engine:
    """The engine loop around the scheduler: arrivals, aborts, a fake model runner."""

    MAX_STEPS: Final = 2000

    def __init__(self, rig: Rig, scenario: Scenario, recorder: Recorder) -> None:
        """Drive ``rig``'s scheduler through ``scenario``; ``recorder`` counts
        the calls (arrivals stop at ``scenario.calls``)."""
        self.rig = rig
        self.scheduler = rig.scheduler
        self.scenario = scenario
        self.recorder = recorder
        self.rng = random.Random(scenario.seed)
        bs = scenario.block_size
        self.prefixes = [tuple(self.rng.randrange(VOCAB) for _ in range(n * bs)) for n in (2, 3, 4)]
        self.steps = 0
        self.added = 0
        self.queue: deque[tuple[Any, Any]] = deque()
        self._counts: dict[str, int] = {}

    def preemptions(self) -> int:
        """Preemptions seen over the run (requests' ``num_preemptions``, summed)."""
        return sum(self._counts.values())

    def run(self) -> None:
        """Step until the arrivals stopped and every request finished."""
        while True:
            arriving = self.recorder.calls < self.scenario.calls
            if arriving:
                self._arrivals()
            elif not self.scheduler.has_requests() and not self.queue:
                return
            if self.steps >= self.MAX_STEPS:
                raise RuntimeError(f"{self.scenario.name}: not drained after {self.MAX_STEPS} engine steps")
            self.steps += 1
            if self.scenario.asynchronous:
                self._step_async()
            else:
                self._step_sync()
            for rid, req in self.scheduler.requests.items():
                self._counts[rid] = int(req.num_preemptions)

    def _step_sync(self) -> None:
        if not self.scheduler.has_requests():
            return
        out = self.scheduler.schedule()
        model_output = self._model(out)
        self.scheduler.update_from_output(out, model_output)
        if self.scenario.spec_tokens and out.total_num_scheduled_tokens > 0:
            # The engine hands the drafter's proposals over after the step (synchronous only).
            drafts = [self._tokens(self.scenario.spec_tokens) for _ in model_output.req_ids]
            outputs = self.rig.vllm["outputs"]
            self.scheduler.update_draft_token_ids(outputs.DraftTokenIds(list(model_output.req_ids), drafts))

    def _step_async(self) -> None:
        """One call of vLLM's ``EngineCore.step_with_batch_queue``: fill the queue first."""
        if self.scheduler.has_requests():
            out = self.scheduler.schedule()
            self.queue.appendleft((out, self._model(out)))
            if len(self.queue) < BATCH_QUEUE and self.scheduler.has_requests():
                return
        elif not self.queue:
            return
        out, model_output = self.queue.pop()
        self.scheduler.update_from_output(out, model_output)

    def _model(self, out: Any) -> Any:
        """The fake model runner: for each request past its prompt, some of its
        draft tokens accepted (a placeholder draft, -1, stands for a token the
        worker drafted) and one sampled token."""
        rids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in rids:
            req = self.scheduler.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])
                continue
            drafts = list(out.scheduled_spec_decode_tokens.get(rid, ()))
            accepted = drafts[: self.rng.randint(0, len(drafts))] if drafts else []
            tokens = [t if t >= 0 else self._tokens(1)[0] for t in accepted]
            sampled.append([*tokens, *self._tokens(1)])
        outputs = self.rig.vllm["outputs"]
        fields = {f.name for f in dataclasses.fields(outputs.ModelRunnerOutput)}
        extra = {"req_id_to_index": {r: i for i, r in enumerate(rids)}} if "req_id_to_index" in fields else {}
        return outputs.ModelRunnerOutput(req_ids=rids, sampled_token_ids=sampled, **extra)  # 0.34.0: no index map

    def _tokens(self, n: int) -> list[int]:
        return [STOP if self.rng.random() < 0.08 else self.rng.randrange(VOCAB) for _ in range(n)]

    def _arrivals(self) -> None:
        roll = self.rng.random()
        for _ in range(2 if roll < 0.15 else 1 if roll < 0.55 else 0):
            self._add()
        live = sorted(self.scheduler.requests)
        if live and self.rng.random() < 0.03:
            status = self.rig.vllm["request"].RequestStatus.FINISHED_ABORTED
            self.scheduler.finish_requests(self.rng.choice(live), status)

    def _add(self) -> None:
        rng, bs, sc = self.rng, self.scenario.block_size, self.scenario
        max_tokens = rng.randint(1, 12)
        if rng.random() < 0.7:
            base = rng.choice(self.prefixes)
            prompt = list(base[: rng.randint(bs, len(base))])
            prompt += [rng.randrange(VOCAB) for _ in range(rng.randint(0, bs + 2))]
        else:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3 * bs))]
        prompt = prompt[: sc.max_model_len - max_tokens]
        self.added += 1
        mods = self.rig.vllm
        sampling = mods["sampling"].SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP])
        request = mods["request"].Request(
            request_id=f"r{self.added}",
            prompt_token_ids=prompt,
            sampling_params=sampling,
            pooling_params=None,
            block_hasher=self.rig.hasher,
            **self.rig.api.request_args,
        )
        self.scheduler.add_request(request)
