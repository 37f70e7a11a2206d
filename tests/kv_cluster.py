"""In-process KV routing cluster for tests: worker runtimes and a router runtime sharing the
``mem`` discovery store of this process, each worker with a ``KvEventPublisher``."""

from __future__ import annotations

import asyncio
import math
import random

from runtime_util import unique_ns, wait_until

from dynamo._core import DistributedRuntime, KvEventPublisher, KvRouter, KvRouterConfig


def _handler(worker: int):
    async def handler(request):
        extra = (request.get("extra_args") or {}) if isinstance(request, dict) else {}
        for i in range(int(extra.get("n", 2))):
            yield {"i": i, "worker": worker}
            if extra.get("delay"):
                await asyncio.sleep(float(extra["delay"]))

    return handler


class Cluster:
    """``n`` workers serving ``{ns}.backend.generate`` and one ``KvRouter``."""

    def __init__(
        self,
        n: int,
        block_size: int = 4,
        config: KvRouterConfig | None = None,
        events: bool = True,
    ):
        self.n = n
        self.block_size = block_size
        self.config = config or KvRouterConfig()
        self.events = events
        self.rng = random.Random(1234)

    async def start(self, router: bool = True) -> Cluster:
        """Start the workers and, unless ``router`` is false, the router (``start_router``
        then starts it later: a router that joins workers which already cached blocks)."""
        loop = asyncio.get_running_loop()
        self.ns = unique_ns()
        path = f"{self.ns}.backend.generate"
        self.runtimes = [DistributedRuntime(loop, "mem", "tcp") for _ in range(self.n)]
        self.endpoints = [rt.endpoint(path) for rt in self.runtimes]
        self.ids = [ep.connection_id() for ep in self.endpoints]
        self.tasks = [
            asyncio.ensure_future(ep.serve_endpoint(_handler(wid)))
            for ep, wid in zip(self.endpoints, self.ids, strict=True)
        ]
        self.pubs = [
            KvEventPublisher(ep, kv_block_size=self.block_size, enable_local_indexer=True)
            for ep in self.endpoints
        ]
        self.router_rt = DistributedRuntime(loop, "mem", "tcp")
        self.router = None
        if router:
            await self.start_router()
        return self

    async def start_router(self) -> None:
        path = f"{self.ns}.backend.generate"
        self.router = KvRouter(self.router_rt.endpoint(path), self.block_size, self.config)
        await wait_until(lambda: len(self.router._workers()) == self.n)
        if self.events:
            await wait_until(lambda: all(p._subscriber_count() >= 1 for p in self.pubs))

    async def stop(self) -> None:
        for rt in [*self.runtimes, self.router_rt]:
            rt.shutdown()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)

    def prompt(self, blocks: int) -> list[int]:
        """A fresh prompt of ``blocks`` full blocks (random ids: no accidental sharing)."""
        return [self.rng.randrange(1, 2**31) for _ in range(blocks * self.block_size)]

    async def overlaps(self, tokens: list[int]) -> dict[int, int]:
        scores = await self.router.get_overlap_scores(tokens)
        return {w["worker_id"]: w["device_overlap_blocks"] for w in scores["workers"]}

    async def store(self, worker: int, tokens: list[int], blocks: int) -> None:
        """Worker ``worker`` caches the first ``blocks`` blocks of ``tokens``; waits until
        the router saw it."""
        if blocks == 0:
            return
        bs = self.block_size
        hashes = [self.rng.randrange(-(2**63), 2**63) for _ in range(blocks)]
        self.pubs[worker].publish_stored(tokens[: blocks * bs], [bs] * blocks, hashes)
        wid = self.ids[worker]

        async def seen() -> bool:
            return (await self.overlaps(tokens)).get(wid, 0) >= blocks

        for _ in range(500):
            if await seen():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("router did not see the stored blocks")

    async def costs(self, tokens: list[int], overrides: dict | None = None) -> dict[int, float]:
        """Brute-force model of the cost formula, from the router's reported loads."""
        o = overrides or {}
        credit = o.get("overlap_score_credit", self.config.overlap_score_credit)
        scale = o.get("prefill_load_scale", self.config.prefill_load_scale)
        w_req = self.config.decode_active_request_weight
        bs = self.block_size
        isl = len(tokens)
        overlaps = await self.overlaps(tokens)
        loads = await self.router.get_potential_loads(tokens)
        out = {}
        for load in loads:
            wid = load["worker_id"]
            ov = overlaps.get(wid, 0)
            uncached = max(0, isl - ov * bs)
            active_prefill = load["potential_prefill_tokens"] - uncached
            raw = (active_prefill + isl) / bs
            out[wid] = (
                scale * max(0.0, raw - credit * ov)
                + load["potential_decode_blocks"]
                + w_req * load["active_requests"]
            )
        return out


def softmax_probs(costs: dict[int, float], temperature: float) -> dict[int, float]:
    """Selection probabilities at ``temperature`` > 0 (range-normalised softmax)."""
    lo, hi = min(costs.values()), max(costs.values())
    if hi == lo:
        return {w: 1 / len(costs) for w in costs}
    weights = {w: math.exp(-(c - lo) / ((hi - lo) * temperature)) for w, c in costs.items()}
    total = sum(weights.values())
    return {w: v / total for w, v in weights.items()}


def chi_square(counts: dict[int, int], probs: dict[int, float]) -> float:
    n = sum(counts.values())
    return sum((counts.get(w, 0) - n * p) ** 2 / (n * p) for w, p in probs.items() if p > 0)
