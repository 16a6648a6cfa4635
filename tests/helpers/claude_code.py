"""Requests in the shapes Claude Code sends (its public gateway docs and captured traffic):
system blocks with a billing header and ``cache_control``, many tools with JSON-schema inputs,
``<system-reminder>`` text blocks, thinking blocks with signatures in the history, tool results
as strings, as blocks, as errors and with images, ``metadata.user_id``, ``thinking`` enabled,
``context_management``."""

from __future__ import annotations

from typing import Any

EPHEMERAL = {"type": "ephemeral"}
BILLING = "x-anthropic-billing-header: cc_version=2.0.14.3f1; cc_entrypoint=cli; cch=8a61f;"
IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."
INSTRUCTIONS = "\nYou are an interactive CLI tool that helps users with software engineering tasks."
REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use this context.\n"
    "</system-reminder>\n"
)
SIGNATURE = "EqQBCkYIBxgCKkDk3mU2sVZ1l5Vd1Yz9xXr0N3dF0m0VhQ3p7Sc0tTq4pB2wZlJ9oGg1fQ=="
PNG = (  # (a 1×1 PNG)
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5Er"
    "kJggg=="
)
USER_ID = "user_2f9c0b6a_account_5d1e_session_7a2b9c4e-1f0d-4e8a-9b3c-6d5e4f3a2b1c"


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


TOOLS: list[dict[str, Any]] = [
    {
        "name": "Bash",
        "description": "Executes a given bash command in a persistent shell session.",
        "input_schema": _schema(
            {
                "command": {"type": "string", "description": "The command to execute"},
                "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            },
            ["command"],
        ),
    },
    {
        "name": "Read",
        "description": "Reads a file from the local filesystem.",
        "input_schema": _schema(
            {
                "file_path": {"type": "string"},
                "offset": {"type": "number"},
                "limit": {"type": "number"},
            },
            ["file_path"],
        ),
    },
    {
        "name": "Edit",
        "description": "Performs exact string replacements in files.",
        "input_schema": _schema(
            {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean", "default": False},
            },
            ["file_path", "old_string", "new_string"],
        ),
    },
    {
        "name": "TodoWrite",
        "description": "Create and manage a structured task list.",
        "input_schema": _schema(
            {
                "todos": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "minLength": 1},
                            "status": {
                                "type": "string",
                                "enum": ["pending", "in_progress", "completed"],
                            },
                        },
                        "required": ["content", "status"],
                    },
                }
            },
            ["todos"],
        ),
        "cache_control": EPHEMERAL,
    },
]


def turn_with_history() -> dict[str, Any]:
    """A third turn: the user asked, the model thought, said something and read two files (one
    result an error, one an image), and the user follows up."""
    return {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": BILLING},
            {"type": "text", "text": IDENTITY, "cache_control": EPHEMERAL},
            {"type": "text", "text": INSTRUCTIONS, "cache_control": EPHEMERAL},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": REMINDER},
                    {"type": "text", "text": "Why does the build fail?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "The user wants the build log. I should read it.",
                        "signature": SIGNATURE,
                    },
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                    {"type": "text", "text": "Let me look at the log and the screenshot."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01A09q90qw90lq917835lq9",
                        "name": "Read",
                        "input": {"file_path": "/repo/build.log"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_01B",
                        "name": "Read",
                        "input": {"file_path": "/repo/shot.png"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                        "content": "<tool_use_error>File does not exist.</tool_use_error>",
                        "is_error": True,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01B",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": PNG,
                                },
                            }
                        ],
                    },
                    {"type": "text", "text": "It is in dist/ instead.", "cache_control": EPHEMERAL},
                ],
            },
        ],
        "tools": TOOLS,
        "metadata": {"user_id": USER_ID},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "temperature": 1,
        "stream": True,
    }


def expected_chat() -> dict[str, Any]:
    """The chat body :func:`turn_with_history` translates to."""
    return {
        "model": "claude-sonnet-4-5-20250929",
        "messages": [
            {"role": "system", "content": f"{IDENTITY}\n\n{INSTRUCTIONS}"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": REMINDER},
                    {"type": "text", "text": "Why does the build fail?"},
                ],
            },
            {
                "role": "assistant",
                "content": "Let me look at the log and the screenshot.",
                "reasoning_content": "The user wants the build log. I should read it.",
                "tool_calls": [
                    {
                        "id": "toolu_01A09q90qw90lq917835lq9",
                        "type": "function",
                        "function": {
                            "name": "Read",
                            "arguments": '{"file_path":"/repo/build.log"}',
                        },
                    },
                    {
                        "id": "toolu_01B",
                        "type": "function",
                        "function": {"name": "Read", "arguments": '{"file_path":"/repo/shot.png"}'},
                    },
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_01A09q90qw90lq917835lq9",
                "content": "Error: <tool_use_error>File does not exist.</tool_use_error>",
            },
            {"role": "tool", "tool_call_id": "toolu_01B", "content": ""},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    {"type": "text", "text": "It is in dist/ instead."},
                ],
            },
        ],
        "max_tokens": 32000,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 1,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool["description"],
                    "parameters": tool["input_schema"],
                },
            }
            for tool in TOOLS
        ],
        "user": USER_ID,
    }
