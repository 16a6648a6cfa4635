"""The schedulers show their live counts when printed (a debugger, a log line)."""

from __future__ import annotations

from iop_edge.admission import AdmissionScheduler, MonotonicClock
from iop_edge.pool import PoolPolicy, PoolScheduler, ProviderPolicy

POLICY = PoolPolicy(
    max_queue=4,
    queue_timeout_ms=100,
    providers=(
        ProviderPolicy(
            node_id="n",
            provider_id="p",
            capacity=1,
            long_context_capacity=1,
            priority=0,
            enabled=True,
        ),
    ),
    groups={"m": (("n", "p"),)},
)


def test_the_core_and_its_glue_print_their_live_counts() -> None:
    core = PoolScheduler(POLICY)
    core.submit("m", long_context=False, now=0.0)
    core.submit("m", long_context=False, now=0.0)
    assert repr(core) == (
        "<PoolScheduler in_flight=1 queued=1/4 providers=1 submitted=2 admitted=1 rejected=0>"
    )
    glue = AdmissionScheduler(POLICY, clock=MonotonicClock())
    assert repr(glue) == (
        "<AdmissionScheduler in_flight=0 queued=0/4 providers=1 submitted=0 admitted=0 rejected=0>"
    )
