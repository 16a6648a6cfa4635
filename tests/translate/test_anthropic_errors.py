"""The edge's errors in Anthropic's shape (anthropic_errors)."""

from __future__ import annotations

import ast
from typing import get_args

import orjson
import pytest

from iop_edge.api.errors import ADMISSION_STATUS
from iop_edge.errors import AdapterCode, AdmissionReason, AuthCode, RequestCode
from iop_edge.translate.anthropic_errors import (
    ANTHROPIC_ERRORS,
    SURFACE_CODES,
    AnthropicErrorType,
    anthropic_error,
    error_body,
    upstream_error_type,
)
from tests.helpers.imports import PACKAGE_DIR

EDGE_CODES = {
    *get_args(AdmissionReason),
    *get_args(AdapterCode),
    *get_args(AuthCode),
    *get_args(RequestCode),
}
#: Anthropic's documented status of each error type.
STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def test_every_code_of_the_edge_has_exactly_one_row():
    assert set(ANTHROPIC_ERRORS) == EDGE_CODES | set(SURFACE_CODES)
    assert set(ADMISSION_STATUS) <= set(ANTHROPIC_ERRORS)


def surface_codes_in_source() -> set[str]:
    """Every ``record.status, record.code = <status>, "<code>"`` of the HTTP surface that
    answers a request (the request-line-only codes set after the answer are left out)."""
    codes = set()
    for path in (PACKAGE_DIR / "api").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Tuple)
                and len(node.value.elts) == 2
                and isinstance(node.value.elts[1], ast.Constant)
                and isinstance(node.value.elts[1].value, str)
                and any(
                    isinstance(t, ast.Tuple)
                    and any(isinstance(e, ast.Attribute) and e.attr == "code" for e in t.elts)
                    for t in node.targets
                )
            ):
                codes.add(node.value.elts[1].value)
    return codes


def test_the_surfaces_own_codes_are_rows_or_named_as_never_answered():
    """A code the HTTP surface answers that the table lacks would fall back to api_error 500
    unseen; the ones the docstring names as never answered are request-line codes."""
    record_only = {"relayed", "client_gone", "client_stalled"}
    found = surface_codes_in_source()
    assert {"unknown_url", "method_not_allowed", "internal_error"} <= found
    assert found - record_only <= set(ANTHROPIC_ERRORS)


def test_each_type_has_anthropics_status_and_each_status_is_anthropics():
    for code, (kind, status) in ANTHROPIC_ERRORS.items():
        if code in ("method_not_allowed", "client_gone"):
            continue  # (HTTP's own statuses, kept: 405 with Allow; 499 is never sent)
        assert STATUS_OF_TYPE[kind] == status, code
    assert set(STATUS_OF_TYPE) == set(get_args(AnthropicErrorType))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("queue_full", ("overloaded_error", 529)),
        ("queue_timeout", ("overloaded_error", 529)),
        ("no_available_provider", ("overloaded_error", 529)),
        ("principal_queue_full", ("rate_limit_error", 429)),
        ("rate_limit_exceeded", ("rate_limit_error", 429)),
        ("invalid_api_key", ("authentication_error", 401)),
        ("origin_not_allowed", ("permission_error", 403)),
        ("model_not_found", ("not_found_error", 404)),
        ("request_too_large", ("request_too_large", 413)),
        ("context_length_exceeded", ("invalid_request_error", 400)),
        ("upstream_error", ("api_error", 500)),
        ("upstream_timeout", ("timeout_error", 504)),
        ("a_code_from_the_future", ("api_error", 500)),
    ],
)
def test_anthropic_error(code, expected):
    assert anthropic_error(code) == expected


def test_error_body_is_anthropics_error_object():
    status, body = error_body("queue_full", "The pool is busy.")
    assert status == 529
    assert orjson.loads(body) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "The pool is busy."},
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (422, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_upstream_error_type(status, kind):
    assert upstream_error_type(status) == kind
