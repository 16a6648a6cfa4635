"""The lifecycle phase of a daemon process (issue 25, :mod:`iop_edge.runtime.lifecycle`): the
moves it allows, and that a restart may begin in ``ready`` only — a stop never becomes a restart."""

from __future__ import annotations

import pytest

from iop_edge.runtime.lifecycle import Lifecycle, LifecycleError, Phase


def at(*moves: Phase) -> Lifecycle:
    """A lifecycle moved through ``moves`` from ``starting``."""
    lifecycle = Lifecycle()
    for phase in moves:
        lifecycle.enter(phase)
    return lifecycle


def test_a_process_starts_then_serves_hands_over_drains_and_stops() -> None:
    lifecycle = Lifecycle()
    assert (lifecycle.phase, repr(lifecycle)) == (Phase.STARTING, "<Lifecycle starting>")
    assert lifecycle.enter(Phase.READY) is Phase.STARTING
    assert lifecycle.enter(Phase.HANDING_OVER) is Phase.READY
    assert lifecycle.enter(Phase.READY) is Phase.HANDING_OVER  # the new process failed
    lifecycle.enter(Phase.HANDING_OVER)
    assert lifecycle.enter(Phase.DRAINING) is Phase.HANDING_OVER
    assert not lifecycle.stopping
    assert lifecycle.enter(Phase.STOPPING) is Phase.DRAINING
    assert lifecycle.stopping
    assert lifecycle.enter(Phase.STOPPING) is Phase.STOPPING  # a second stop changes nothing


@pytest.mark.parametrize(
    "moves",
    [
        (),
        (Phase.READY,),
        (Phase.READY, Phase.HANDING_OVER),
        (Phase.READY, Phase.HANDING_OVER, Phase.DRAINING),
    ],
)
def test_a_stop_may_begin_in_any_phase(moves: tuple[Phase, ...]) -> None:
    assert at(*moves, Phase.STOPPING).phase is Phase.STOPPING


@pytest.mark.parametrize("phase", [Phase.READY, Phase.HANDING_OVER, Phase.DRAINING])
def test_nothing_leaves_stopping(phase: Phase) -> None:
    """A stop never becomes a restart, nor anything else: the move is a bug, and says so."""
    lifecycle = at(Phase.READY, Phase.STOPPING)
    with pytest.raises(LifecycleError, match=f"cannot go from stopping to {phase.value}"):
        lifecycle.enter(phase)
    assert lifecycle.phase is Phase.STOPPING


@pytest.mark.parametrize(
    ("moves", "phase"),
    [
        ((), Phase.HANDING_OVER),  # no restart before the process is ready
        ((), Phase.DRAINING),
        ((Phase.READY,), Phase.DRAINING),  # drains only after a handover
        ((Phase.READY,), Phase.STARTING),
        ((Phase.READY, Phase.HANDING_OVER, Phase.DRAINING), Phase.READY),
    ],
)
def test_the_other_moves_are_refused(moves: tuple[Phase, ...], phase: Phase) -> None:
    with pytest.raises(LifecycleError):
        at(*moves).enter(phase)


def test_a_restart_may_begin_only_when_ready_and_the_refusal_says_why() -> None:
    refusals = {
        phase: at(*moves).restart_refusal()
        for phase, moves in [
            (Phase.STARTING, ()),
            (Phase.READY, (Phase.READY,)),
            (Phase.HANDING_OVER, (Phase.READY, Phase.HANDING_OVER)),
            (Phase.DRAINING, (Phase.READY, Phase.HANDING_OVER, Phase.DRAINING)),
            (Phase.STOPPING, (Phase.STOPPING,)),
        ]
    }
    assert refusals == {
        Phase.STARTING: "the daemon is starting: it runs the program and config it has just "
        "loaded; ask again once it is ready to restart it",
        Phase.READY: None,
        Phase.HANDING_OVER: "a handover is already in progress",
        Phase.DRAINING: "this process has handed over to a new one and drains; restart that one",
        Phase.STOPPING: "the daemon is stopping: it drains and exits, and a new process would "
        "keep serving after it; nothing was restarted",
    }
