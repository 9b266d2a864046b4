"""services.broker.metrics.observe_many updates a histogram as n observes do
(it reaches into prometheus_client's fields: this holds it to the pinned version)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from services.broker.metrics import observe_many


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("amount", [0.0, 0.0004, 0.005, 0.3, 2.5, 99.0])
@pytest.mark.parametrize("n", [1, 2, 17])
def test_observe_many_equals_n_observes(amount: float, n: int) -> None:
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", ["x"], registry=one_by_one).labels("1")
    b = Histogram("h", "h", ["x"], registry=at_once).labels("1")
    for _ in range(3):
        for _ in range(n):
            a.observe(amount)
        observe_many(b, amount, n)
    # (the sum is n additions against one multiplication: equal up to rounding)
    assert samples(one_by_one) == pytest.approx(samples(at_once), rel=1e-12)
    assert samples(at_once)[("h_count", (("x", "1"),))] == 3 * n
