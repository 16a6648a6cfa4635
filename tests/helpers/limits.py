"""The config bounds under test (issue 10, items 1, 6 and 9), shared by
``tests/config/test_limits.py`` (in process) and ``tests/config/test_limits_cli.py`` (the
``iop-edge`` command and the daemon as real processes): texts nested too deep, aliases that
expand too far, the sentences their problems end with, secrets and how a report shows them,
and a call bounded in real time so that a regression that blocks fails instead of hanging."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple

import pytest

from iop_edge.config.limits import INT_MAX, INT_MIN, MAX_DEPTH, MAX_NODES
from iop_edge.config.redact import REDACTED
from tests.helpers.config import MINIMAL_YAML

#: The line of the first key added after MINIMAL_YAML.
NEXT_LINE = 8
#: Deep enough to overflow Python's recursion limit in the old loader (issue 10 saw 500–1000),
#: below libyaml's own cap of 1000 levels (which refuses deeper text as a syntax error).
DEEP = 990
#: The integer-range sentence every integer problem ends with.
INT_RULE = f"integers must fit in 64 bits ({INT_MIN} to {INT_MAX})"
DEPTH_RULE = f"a config may nest at most {MAX_DEPTH} levels"
NODE_RULE = (
    f"expands to more than {MAX_NODES:,} YAML nodes, an alias counted at every use; a config "
    f"may expand to at most {MAX_NODES:,} (an alias bomb?)"
)
#: The secrets of the texts below; no report may quote one.
SECRETS = ("s3cret", "abc123", "sk-live-XYZ", "tok-abc-789")
#: A URL and CLI arguments holding them, and how a report shows each.
SECRET_URL = "https://user:s3cret@upstream.example/v1?api_key=abc123"
SHOWN_URL = f"https://user:{REDACTED}@upstream.example/v1?api_key={REDACTED}"
SECRET_ARGS = ["--api-key", "sk-live-XYZ", "--token=tok-abc-789", "--model", "m"]
SHOWN_ARGS = ["--api-key", REDACTED, f"--token={REDACTED}", "--model", "m"]

Args = TypeVarTuple("Args")
R = TypeVar("R")


def with_priority(value: Any) -> str:
    """MINIMAL_YAML with the provider's priority written as ``value`` (YAML text)."""
    return MINIMAL_YAML.replace("models: [echo]}", f"models: [echo], priority: {value}}}")


def nested_mapping(depth: int) -> str:
    """A flow mapping nested ``depth`` levels deep: ``{a: {a: ... 1}}``."""
    return "{a: " * depth + "1" + "}" * depth


def nested_list(depth: int) -> str:
    """A flow sequence nested ``depth`` levels deep: ``[[... 1]]``."""
    return "[" * depth + "1" + "]" * depth


def alias_bomb(levels: int) -> str:
    """The classic "billion laughs": each level is nine aliases of the level below, so the
    last one expands to 9**levels strings."""
    lines = ["x-lol0: &lol0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [
        f"x-lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 9) + "]" for i in range(1, levels)
    ]
    return "\n".join(lines) + "\n"


def call_within(seconds: float, fn: Callable[[*Args], R], *args: *Args) -> R:
    """``fn(*args)`` in a daemon thread: a regression that blocks fails the test instead of
    hanging the run (a thread cannot be killed; the caller unblocks it if it can)."""
    outcome: dict[str, R] = {}
    failure: dict[str, BaseException] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the test's thread
            failure["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} still running after {seconds} s")
    if "error" in failure:
        raise failure["error"]
    return outcome["value"]
