"""The schedulers and the supervisor show their live state when printed (a debugger, a log
line)."""

from __future__ import annotations

from pathlib import Path

from iop_edge.admission import AdmissionScheduler, MonotonicClock
from iop_edge.config import load_config
from iop_edge.pool import PoolPolicy, PoolScheduler, ProviderPolicy
from iop_edge.runtime.logs import get_logger
from iop_edge.supervisor import Supervisor, status_line

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


def test_the_supervisor_prints_its_status_line(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    text = "models: [{id: m, context_window_tokens: 10, providers: [p]}]\n"
    text += "nodes: [{id: n, adapters: [{name: a, type: cli, command: cat}],"
    text += " providers: [{id: p, type: cli, category: cli, adapter: a, models: [m]}]}]\n"
    path.write_text(text)
    supervisor = Supervisor(
        path, load_config(text), apply=lambda config: None, env={}, log=get_logger()
    )
    assert repr(supervisor) == f"<Supervisor {path} {status_line(supervisor)}; 0 refresh(es) run>"
    assert "serving config" in repr(supervisor)
