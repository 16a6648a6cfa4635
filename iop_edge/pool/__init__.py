"""The provider pool's admission scheduler, as a pure sans-IO state machine.

Nothing here does I/O, awaits, or reads a clock: :class:`PoolScheduler` takes ``now`` and
returns decisions; :mod:`iop_edge.admission` is the asyncio shell around it.
"""

from iop_edge.pool.decisions import (
    Decision,
    Dispatch,
    PendingRequest,
    Rejection,
    RejectReason,
    RequestState,
    SlotLease,
    Submission,
)
from iop_edge.pool.policy import PoolPolicy, ProviderKey, ProviderPolicy
from iop_edge.pool.scheduler import PoolScheduler
from iop_edge.pool.statistics import REJECTION_COUNTERS, PoolStatistics, ProviderStatistics

__all__ = [
    "REJECTION_COUNTERS",
    "Decision",
    "Dispatch",
    "PendingRequest",
    "PoolPolicy",
    "PoolScheduler",
    "PoolStatistics",
    "ProviderKey",
    "ProviderPolicy",
    "ProviderStatistics",
    "RejectReason",
    "Rejection",
    "RequestState",
    "SlotLease",
    "Submission",
]
