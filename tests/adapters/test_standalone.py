"""The adapters stand alone (issue 26): a process that is not the edge — the node agent to come
— builds them from a :class:`~iop_edge.config.payload.NodeConfigPayload`, runs calls and health
checks through them, and loads nothing of the edge's HTTP surface, admission, scheduler or
supervisor.

Each check runs in a fresh interpreter, so what it loaded is exactly what the adapters need.
The node side of the second one gets its payload as JSON (the mapping ``iop-edge config
payload`` prints), and talks to a fake upstream of :mod:`iop_edge.testing` in this process
over a real socket.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

from iop_edge.config import parse_config
from iop_edge.config.payload import node_payload
from iop_edge.testing.fake_openai import FakeOpenAI

EDGE_ONLY = (
    "iop_edge.api",
    "iop_edge.admission",
    "iop_edge.pool.scheduler",
    "iop_edge.supervisor",
    "iop_edge.daemon",
)
"""What a process running adapters alone must never load (a module or a package and its own)."""

REPORT = textwrap.dedent(
    """
    import json, sys
    EDGE_ONLY = {edge_only!r}
    loaded = sorted(
        m for m in sys.modules
        if any(m == name or m.startswith(name + ".") for name in EDGE_ONLY)
    )
    print(json.dumps({{"loaded": loaded, "result": RESULT}}))
    """
)


def run_alone(body: str, stdin: str = "") -> dict[str, Any]:
    """Run ``body`` (which sets ``RESULT``) in a fresh interpreter; what it printed: the
    ``result`` and the edge-only modules it ``loaded``."""
    script = body + REPORT.format(edge_only=EDGE_ONLY)
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_importing_every_adapter_module_loads_nothing_of_the_edge() -> None:
    """The registry and every module of ``iop_edge.adapters`` import without the HTTP surface,
    admission, the scheduler, the supervisor or the daemon."""
    body = textwrap.dedent(
        """
        import importlib, pkgutil
        import iop_edge.adapters
        import iop_edge.adapters.registry
        names = sorted(
            info.name for info in pkgutil.iter_modules(
                iop_edge.adapters.__path__, "iop_edge.adapters."
            )
        )
        for name in names:
            importlib.import_module(name)
        RESULT = names
        """
    )
    report = run_alone(body)
    assert "iop_edge.adapters.registry" in report["result"]
    assert "iop_edge.adapters.deadlines" in report["result"]
    assert report["loaded"] == []


NODE = textwrap.dedent(
    """
    import asyncio, sys
    from iop_edge.adapters import AdapterSet, UpstreamCall
    from iop_edge.config.payload import NodeConfigPayload

    async def main():
        payload = NodeConfigPayload.model_validate_json(sys.stdin.read())
        adapters = AdapterSet.from_payload(payload)
        try:
            call = UpstreamCall(
                endpoint="chat/completions",
                body={"model": "m", "messages": [{"role": "user", "content": "hello node"}]},
                target="fake-model",
                stream=False,
                headers={},
                request_id="node-1",
            )
            reply = await adapters.for_provider("p1").complete(call)
            probe = await adapters.probe("p1")
        finally:
            await adapters.aclose()
        return {"status": reply.status, "body": reply.body.decode(), "probe": list(probe)}

    RESULT = asyncio.run(main())
    """
)


async def test_a_process_builds_the_adapters_from_a_payload_and_runs_them_alone() -> None:
    """A node payload mapped from a parsed config, handed over as JSON: the process builds its
    adapters from it, runs one chat call against a fake upstream on a real socket and that
    provider's health check, through the adapters' public API alone — and never loads the
    edge's modules."""
    async with FakeOpenAI() as fake:
        config = parse_config(
            {
                "models": [{"id": "m", "context_window_tokens": 4096, "providers": ["p1"]}],
                "nodes": [
                    {
                        "id": "n1",
                        "adapters": [
                            {"name": "a", "type": "openai_compat", "base_url": fake.base_url}
                        ],
                        "providers": [
                            {
                                "id": "p1",
                                "type": "openai_compat",
                                "category": "api",
                                "adapter": "a",
                                "models": ["fake-model"],
                            }
                        ],
                    }
                ],
            }
        )
        # the mapping of `iop-edge config payload`, in the payload's own JSON form
        payload = node_payload(config, "n1").model_dump_json()
        report = await asyncio.to_thread(run_alone, NODE, payload)
        assert fake.total_requests == 1
        [request] = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    result = report["result"]
    assert result["status"] == 200
    answer = json.loads(result["body"])
    assert answer["choices"][0]["message"]["content"] == "hello node"
    assert result["probe"] == [True, None]
    assert request.json["model"] == "fake-model"
    assert report["loaded"] == []
