"""The error codes are closed sets that the status tables and the scheduler agree on (issue 11):
mypy checks every code written in the package against the Literal types; these tests check the
tables cover them, so a new reason cannot reach a client without a status."""

from __future__ import annotations

from typing import get_args

import orjson
import pytest

from iop_edge.api.errors import ADMISSION_STATUS, describe
from iop_edge.envelope import envelope, error_type
from iop_edge.errors import AdmissionError, AdmissionReason
from iop_edge.pool import RejectReason


def test_every_rejection_reason_of_the_scheduler_has_a_status():
    reasons = set(get_args(AdmissionReason))
    assert {reason.value for reason in RejectReason} == reasons
    assert set(ADMISSION_STATUS) == reasons


@pytest.mark.parametrize("reason", get_args(AdmissionReason))
def test_an_admission_error_is_described_by_the_table(reason):
    assert describe(AdmissionError(reason, "no")) == (ADMISSION_STATUS[reason], reason, None)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "invalid_request_error"),
        (408, "invalid_request_error"),
        (429, "rate_limit_error"),
        (499, "invalid_request_error"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "server_error"),
    ],
)
def test_one_envelope_gives_each_status_one_type(status, kind):
    assert error_type(status) == kind
    body = orjson.loads(envelope("m", "c", status=status, param="p"))
    assert body == {"error": {"message": "m", "type": kind, "param": "p", "code": "c"}}
