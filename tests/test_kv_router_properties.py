"""Property tests of the KV router's decisions against a brute-force Python model of the cost
formula (``kv_cluster.Cluster.costs``), driving a real ``KvRouter`` over in-process workers
whose KV events are injected through ``KvEventPublisher``."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_cluster import Cluster, chi_square, softmax_probs

from dynamo._core import KvRouterConfig

N_WORKERS = 4
#: chi-square critical value for 3 degrees of freedom at p = 1e-6. The draws come from the
#: router's own unseeded generator, so a correct sampler still fails a test at this level
#: once in a million runs (at p = 0.001 four such tests failed about one suite run in 250,
#: and did fail CI once). The sample sizes keep the power: drawing uniformly instead of by
#: the softmax at temperature 2 gives an expected statistic of ~0.036 * n (~108 at
#: n = 3,000), the softmax at half the temperature ~0.03 * n.
CHI2_3DOF_P1E6 = 30.66
SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Driver:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.c = Cluster(N_WORKERS, config=KvRouterConfig())
        self.run(self.c.start())
        self.next_id = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.c.stop())
        self.loop.close()

    async def setup_state(self, overlaps: list[int], bookings: int, blocks: int = 6):
        """A fresh prompt cached to ``overlaps[i]`` blocks on worker i, plus ``bookings``
        booked requests on other prompts. Returns (prompt, booked request ids)."""
        c = self.c
        prompt = c.prompt(blocks)
        for i, ov in enumerate(overlaps):
            await c.store(i, prompt, ov)
        ids = []
        for _ in range(bookings):
            self.next_id += 1
            rid = f"bk{self.next_id}"
            await c.router.best_worker(c.prompt(c.rng.randrange(1, 5)), request_id=rid)
            ids.append(rid)
        return prompt, ids

    async def release(self, ids: list[str]) -> None:
        for rid in ids:
            await self.c.router.free(rid)


@pytest.fixture(scope="module")
def driver():
    d = Driver()
    yield d
    d.close()


def argmin_set(costs: dict[int, float]) -> set[int]:
    lo = min(costs.values())
    return {w for w, c in costs.items() if c <= lo + 1e-9}


overlaps_st = st.lists(st.integers(0, 6), min_size=N_WORKERS, max_size=N_WORKERS)


@SETTINGS
@given(overlaps=overlaps_st, bookings=st.integers(0, 6))
def test_choice_minimises_cost_at_zero_temperature(driver, overlaps, bookings) -> None:
    async def body():
        prompt, ids = await driver.setup_state(overlaps, bookings)
        try:
            costs = await driver.c.costs(prompt)
            assert set(costs) == set(driver.c.ids)
            for _ in range(5):
                wid, _, overlap = await driver.c.router.best_worker(prompt)
                assert wid in argmin_set(costs), (costs, wid)
                assert overlap == overlaps[driver.c.ids.index(wid)]
        finally:
            await driver.release(ids)

    driver.run(body())


def test_ties_are_spread_uniformly(driver) -> None:
    async def body():
        prompt = driver.c.prompt(3)
        costs = await driver.c.costs(prompt)
        assert len(set(costs.values())) == 1
        counts: dict[int, int] = {}
        for _ in range(2000):
            wid, _, _ = await driver.c.router.best_worker(prompt)
            counts[wid] = counts.get(wid, 0) + 1
        probs = {w: 1 / N_WORKERS for w in driver.c.ids}
        assert chi_square(counts, probs) < CHI2_3DOF_P1E6, counts

    driver.run(body())


@SETTINGS
@given(steps=st.lists(st.integers(1, 2), min_size=1, max_size=4), bookings=st.integers(1, 3))
def test_cost_is_monotone_in_overlap_and_load(driver, steps, bookings) -> None:
    async def body():
        c = driver.c
        prompt = c.prompt(8)
        w0 = c.ids[0]
        # More cached blocks never raise the cost.
        previous = (await c.costs(prompt))[w0]
        cached = 0
        for step in steps:
            cached += step
            await c.store(0, prompt, cached)
            now = (await c.costs(prompt))[w0]
            assert now <= previous + 1e-9
            previous = now
        # More booked load never lowers any worker's cost.
        before = await c.costs(prompt)
        ids = []
        for _ in range(bookings):
            driver.next_id += 1
            rid = f"mono{driver.next_id}"
            await c.router.best_worker(c.prompt(2), request_id=rid)
            ids.append(rid)
            after = await c.costs(prompt)
            assert all(after[w] >= before[w] - 1e-9 for w in before)
            assert sum(after.values()) > sum(before.values())
            before = after
        await driver.release(ids)

    driver.run(body())


@SETTINGS
@given(
    overlaps=overlaps_st,
    bookings=st.integers(0, 4),
    override=st.sampled_from(
        [
            {"overlap_score_credit": 0.0},
            {"overlap_score_credit": 3.0},
            {"prefill_load_scale": 0.0},
            {"prefill_load_scale": 4.0},
        ]
    ),
)
def test_overrides_apply_only_to_their_request(driver, overlaps, bookings, override) -> None:
    async def body():
        prompt, ids = await driver.setup_state(overlaps, bookings)
        try:
            with_override = await driver.c.costs(prompt, override)
            default = await driver.c.costs(prompt)
            wid, _, _ = await driver.c.router.best_worker(prompt, router_config_override=override)
            assert wid in argmin_set(with_override)
            wid, _, _ = await driver.c.router.best_worker(prompt)
            assert wid in argmin_set(default)
        finally:
            await driver.release(ids)

    driver.run(body())


TAINTS = ["gpu-a", "gpu-b", "big"]


@SETTINGS
@given(
    worker_taints=st.lists(
        st.sets(st.sampled_from(TAINTS)), min_size=N_WORKERS, max_size=N_WORKERS
    ),
    required=st.sets(st.sampled_from(TAINTS), max_size=2),
    overlaps=overlaps_st,
)
def test_required_taints_are_never_violated(driver, worker_taints, required, overlaps) -> None:
    from dynamo._core import RoutingConstraints

    async def body():
        c = driver.c
        for wid, taints in zip(c.ids, worker_taints, strict=True):
            c.router._set_worker_taints(wid, taints)
        try:
            prompt, _ = await driver.setup_state(overlaps, 0)
            eligible = {w for w, t in zip(c.ids, worker_taints, strict=True) if required <= t}
            constraints = RoutingConstraints(required_taints=required)
            for _ in range(4):
                if not eligible:
                    with pytest.raises(Exception):  # noqa: B017 - any routing error
                        await c.router.best_worker(prompt, routing_constraints=constraints)
                    break
                wid, _, _ = await c.router.best_worker(prompt, routing_constraints=constraints)
                assert wid in eligible
                costs = await c.costs(prompt)
                assert wid in argmin_set({w: costs[w] for w in eligible})
        finally:
            for wid in c.ids:
                c.router._set_worker_taints(wid, set())

    driver.run(body())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampling_matches_softmax(driver, temperature) -> None:
    async def body():
        prompt, _ = await driver.setup_state([0, 2, 4, 6], 0)
        costs = await driver.c.costs(prompt)
        probs = softmax_probs(costs, temperature)
        counts: dict[int, int] = {}
        n = 3000
        override = {"router_temperature": temperature}
        for _ in range(n):
            wid, _, _ = await driver.c.router.best_worker(prompt, router_config_override=override)
            counts[wid] = counts.get(wid, 0) + 1
        assert chi_square(counts, probs) < CHI2_3DOF_P1E6, (counts, probs)
        # Every worker with non-negligible probability was drawn.
        assert all(counts.get(w, 0) > 0 for w, p in probs.items() if p * n > 20)

    driver.run(body())
