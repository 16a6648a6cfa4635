"""Requests in the shape Codex CLI sends to a Responses provider (``wire_api = "responses"``).

Facts read from Codex's public source (``openai/codex``, codex-rs: the Responses request body it
serialises, its conversation items and its tool specs), written here as data:

- the body always has ``model``, ``instructions`` (a string: its base prompt), ``input`` (the
  whole conversation: Codex keeps the state itself), ``tools``, ``tool_choice: "auto"``,
  ``parallel_tool_calls`` (false for a model Codex does not know), ``reasoning`` (``null``, or
  ``{"effort", "summary"}`` for a reasoning model, ``summary`` one of auto / concise / detailed),
  ``store: false``, ``stream: true``, ``include`` (``["reasoning.encrypted_content"]`` when it
  asks for reasoning, else empty) and ``prompt_cache_key`` (its conversation id); ``text``
  (``verbosity``, and an output schema as ``format`` ``json_schema`` named
  ``codex_output_schema`` with ``strict: true``) only when it has one of them;
- input items: ``message`` items (``role`` user or developer for its context — the permissions,
  the environment, the AGENTS.md instructions — and for the task; ``content`` of ``input_text``
  and ``input_image`` parts; earlier answers as ``assistant`` with ``output_text``), without ids;
  ``reasoning`` items sent back with their ``summary`` and ``encrypted_content``, and without their
  ``content`` when it holds ``reasoning_text`` (``"content": null`` when it had none);
  ``function_call`` (``name``, ``arguments`` as a JSON string, ``call_id``) and
  ``function_call_output`` (``call_id``, ``output`` a string, or ``input_text`` /
  ``input_image`` parts when a tool returned images);
- tools: ``{"type": "function", "name", "description", "strict": false, "parameters"}`` — the
  shell tool (``command`` an array of strings, ``workdir``, ``timeout_ms``), ``update_plan``,
  ``view_image``; it may add ``local_shell``, ``web_search`` or a ``custom`` (free-form)
  ``apply_patch`` tool for the OpenAI models it knows.
"""

from __future__ import annotations

from typing import Any

MODEL = "gpt-oss-120b"
CONVERSATION = "5f0e8a52-3c1d-4b7e-9a26-1d4c8e7f0b93"
INSTRUCTIONS = "You are a coding agent running in the Codex CLI, a terminal-based coding assistant."
ENVIRONMENT = (
    "<environment_context>\n  <cwd>/home/dev/repo</cwd>\n  <approval_policy>on-request"
    "</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n  <shell>bash</shell>\n"
    "</environment_context>"
)
PERMISSIONS = "<permissions instructions>Commands run in a sandbox.</permissions instructions>"
TASK = "List the Python files and tell me which one is the largest."
OPENAI_SEALED = "gAAAAABo9x3k2J7c1QmLw0zvP4YtR8sN6bUeD5fXhKqA1oIaGj0ZrTnVyWcM2lEuFd9sHpB=="
PNG_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQ"
    "GAhKmMIQAAAABJRU5ErkJggg=="
)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": _object(
            {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string"},
                "timeout_ms": {"type": "number"},
            },
            ["command"],
        ),
    },
    {
        "type": "function",
        "name": "update_plan",
        "description": "Updates the task plan.",
        "strict": False,
        "parameters": _object(
            {
                "explanation": {"type": "string"},
                "plan": {
                    "type": "array",
                    "items": _object(
                        {"step": {"type": "string"}, "status": {"type": "string"}},
                        ["step", "status"],
                    ),
                },
            },
            ["plan"],
        ),
    },
    {
        "type": "function",
        "name": "view_image",
        "description": "Attaches a local image to the conversation.",
        "strict": False,
        "parameters": _object({"path": {"type": "string"}}, ["path"]),
    },
]


def user(text: str, role: str = "user") -> dict[str, Any]:
    """A message item as Codex sends it (no id)."""
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def context() -> list[dict[str, Any]]:
    """The items Codex opens a conversation with, then the task."""
    return [user(PERMISSIONS, "developer"), user(ENVIRONMENT), user(TASK)]


def request(
    input_items: list[dict[str, Any]],
    *,
    reasoning: bool = True,
    schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Codex request body around ``input_items`` (``reasoning``: for a reasoning model, with
    effort and summary and the encrypted content included; ``schema``: an output schema)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "instructions": INSTRUCTIONS,
        "input": input_items,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"} if reasoning else None,
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"] if reasoning else [],
        "prompt_cache_key": CONVERSATION,
    }
    if schema is not None:
        body["text"] = {
            "format": {
                "type": "json_schema",
                "strict": True,
                "schema": schema,
                "name": "codex_output_schema",
            }
        }
    return body


def sent_back(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as Codex sends it back in the next request's input: without ``id`` and
    ``status``; a reasoning item with its ``summary`` and ``encrypted_content`` (``null`` when
    it had none), its ``content`` left out when it holds ``reasoning_text`` (else ``null``)."""
    kind = item["type"]
    if kind == "reasoning":
        back: dict[str, Any] = {"type": "reasoning", "summary": item.get("summary", [])}
        content = item.get("content")
        if not content or not any(part["type"] == "reasoning_text" for part in content):
            back["content"] = content
        back["encrypted_content"] = item.get("encrypted_content")
        return back
    if kind == "message":
        parts = [{"type": "output_text", "text": p["text"]} for p in item["content"]]
        return {"type": "message", "role": item["role"], "content": parts}
    if kind == "function_call":
        return {k: item[k] for k in ("type", "name", "arguments", "call_id")}
    raise AssertionError(f"Codex sends no {kind} item back")


def turn_with_history() -> dict[str, Any]:
    """A later turn: the context, OpenAI's reasoning (its sealed content, which no one else can
    read) and the reasoning of an earlier answer as summary, a shell call and its output, an
    image a tool returned, and the assistant's last words."""
    items = [
        *context(),
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "**Listing files**"}],
            "content": None,
            "encrypted_content": OPENAI_SEALED,
        },
        {
            "type": "function_call",
            "name": "shell",
            "arguments": '{"command":["bash","-lc","ls -S *.py"]}',
            "call_id": "call_Xk3",
        },
        {"type": "function_call_output", "call_id": "call_Xk3", "output": "big.py\nsmall.py\n"},
        {
            "type": "function_call",
            "name": "view_image",
            "arguments": '{"path":"plot.png"}',
            "call_id": "call_Yb7",
        },
        {
            "type": "function_call_output",
            "call_id": "call_Yb7",
            "output": [
                {"type": "input_text", "text": "plot.png"},
                {"type": "input_image", "image_url": PNG_URL},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "big.py is the largest."}],
        },
        user("Thanks. Now count its lines."),
    ]
    return request(items)


def expected_chat_messages() -> list[dict[str, Any]]:
    """The chat messages :func:`turn_with_history` translates into."""
    return [
        {"role": "system", "content": f"{INSTRUCTIONS}\n\n{PERMISSIONS}"},
        {"role": "user", "content": ENVIRONMENT},
        {"role": "user", "content": TASK},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "**Listing files**",
            "tool_calls": [
                {
                    "id": "call_Xk3",
                    "type": "function",
                    "function": {
                        "name": "shell",
                        "arguments": '{"command":["bash","-lc","ls -S *.py"]}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_Xk3", "content": "big.py\nsmall.py\n"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_Yb7",
                    "type": "function",
                    "function": {"name": "view_image", "arguments": '{"path":"plot.png"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_Yb7", "content": "plot.png"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]},
        {"role": "assistant", "content": "big.py is the largest."},
        {"role": "user", "content": "Thanks. Now count its lines."},
    ]
