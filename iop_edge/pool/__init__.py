"""The provider pool's admission scheduler, as a pure sans-IO state machine.

Nothing here does I/O, awaits, or reads a clock: :class:`PoolScheduler` takes ``now`` and
returns decisions; :mod:`iop_edge.admission` is the asyncio shell around it.
"""

from iop_edge.errors import RETRY_CLASSES, FailureKind, RetryClass
from iop_edge.pool.decisions import (
    Decision,
    Dispatch,
    Failover,
    PendingRequest,
    Rejection,
    RejectReason,
    RequestState,
    SlotLease,
    Submission,
)
from iop_edge.pool.fair import (
    ANONYMOUS,
    FairQueue,
    FairShareMode,
    PrincipalBook,
    Share,
    service_key,
)
from iop_edge.pool.health import OK, Failure, Health, HealthEvent, Outcome
from iop_edge.pool.policy import (
    STORE_DOWN_MODES,
    HealthPolicy,
    PoolPolicy,
    ProviderKey,
    ProviderPolicy,
    SharedPolicy,
    StoreDownMode,
    may_retry,
)
from iop_edge.pool.scheduler import PROBE, Notice, PoolScheduler
from iop_edge.pool.statistics import (
    REJECTION_COUNTERS,
    GroupStatistics,
    PoolStatistics,
    PrincipalStatistics,
    ProviderStatistics,
)

__all__ = [
    "ANONYMOUS",
    "OK",
    "PROBE",
    "REJECTION_COUNTERS",
    "RETRY_CLASSES",
    "STORE_DOWN_MODES",
    "Decision",
    "Dispatch",
    "Failover",
    "Failure",
    "FailureKind",
    "FairQueue",
    "FairShareMode",
    "GroupStatistics",
    "Health",
    "HealthEvent",
    "HealthPolicy",
    "Notice",
    "Outcome",
    "PendingRequest",
    "PoolPolicy",
    "PoolScheduler",
    "PoolStatistics",
    "PrincipalBook",
    "PrincipalStatistics",
    "ProviderKey",
    "ProviderPolicy",
    "ProviderStatistics",
    "RejectReason",
    "Rejection",
    "RequestState",
    "RetryClass",
    "Share",
    "SharedPolicy",
    "SlotLease",
    "StoreDownMode",
    "Submission",
    "may_retry",
    "service_key",
]
