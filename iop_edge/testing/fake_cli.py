"""A fake command-line agent: ``python -m iop_edge.testing.fake_cli [options]``.

It reads the whole prompt from stdin (until EOF), then answers on stdout in one of the
formats the ``cli`` adapter reads (SPEC §7):

- ``text``: the answer, as is, written a chunk at a time (as ``stream-json`` chunks it).
- ``json``: one object, ``{"result": answer, "usage": {"prompt_tokens", "completion_tokens"}}``
  (``--json-field content`` names the answer field ``content`` instead).
- ``stream-json``: one object per line, ``{"type": "content", "content": chunk}`` per chunk
  (one per word unless ``--chunks``), then ``{"type": "result", "usage": {...}}``.

The answer echoes the prompt (stripped) unless ``--reply`` fixes it. Token counts are
whitespace-separated words, as in the HTTP fakes. Faults, for the adapter's failure paths:

- ``--exit-code N --stderr MSG``: write MSG to stderr and exit N (after any answer it was
  told to write with ``--answer-then-exit``).
- ``--hang`` / ``--hang-after N``: block forever, after N chunks of a ``text`` or
  ``stream-json`` answer (``json`` writes nothing; ``--hang`` hangs before answering).
  ``--ignore-sigterm`` makes SIGTERM harmless, so only SIGKILL ends it.
- ``--sleep S``: sleep S seconds before answering; ``--chunk-delay S`` between chunks.
- ``--flood N``: write N bytes of ``x`` to stdout instead of an answer.
- ``--spawn-child``: fork a child in the same process group that sleeps for
  ``--child-lifetime`` seconds (default 600, a backstop against leaks, long enough that only
  a process-group kill ends it in a test); its pid is printed to stderr as
  ``fake-cli child pid N`` and written to ``--pid-file``. The child's stdout and stderr are
  /dev/null unless ``--child-keeps-stdout`` (then those pipes stay open until the child dies).

A directive ``[[fake-cli: --hang]]`` in the prompt adds its options (shell-quoted) to the
command line, so one configured provider can be told per request how to fail; it is removed
from the echoed answer.

Start-up is kept fast: only the standard library, and nothing heavier than ``argparse``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence

from iop_edge.testing.fake_behavior import split_reply  # standard library only: fast start

__all__ = ["DIRECTIVE_PREFIX", "main", "parse_options"]

DIRECTIVE_PREFIX = "[[fake-cli:"
"""Opens an options directive inside the prompt: ``[[fake-cli: --exit-code 3]]``."""

_FOREVER = 3600.0


def parse_options(argv: Sequence[str]) -> argparse.Namespace:
    """Parse the fake agent's command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m iop_edge.testing.fake_cli",
        description="A fake command-line agent for iop-edge tests.",
    )
    parser.add_argument(
        "--format",
        dest="output_format",
        choices=("text", "json", "stream-json"),
        default="text",
        help="answer format (default: text)",
    )
    parser.add_argument("--reply", help="fixed answer (default: echo the prompt)")
    parser.add_argument(
        "--json-field",
        choices=("result", "content"),
        default="result",
        help="answer field of the json format (default: result)",
    )
    parser.add_argument("--chunks", type=int, help="stream-json chunks (default: one per word)")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds before answering")
    parser.add_argument("--exit-code", type=int, default=0, help="exit status")
    parser.add_argument("--stderr", default="", help="message written to stderr")
    parser.add_argument(
        "--answer-then-exit",
        action="store_true",
        help="with --exit-code, write the answer first",
    )
    parser.add_argument("--hang", action="store_true", help="hang without answering")
    parser.add_argument("--hang-after", type=int, help="hang after this many stream chunks")
    parser.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM")
    parser.add_argument("--flood", type=int, help="write this many bytes to stdout instead")
    parser.add_argument("--spawn-child", action="store_true", help="fork a hanging child")
    parser.add_argument("--child-lifetime", type=float, default=600.0, help="child's sleep")
    parser.add_argument("--child-keeps-stdout", action="store_true", help="child keeps stdout")
    parser.add_argument("--pid-file", help="write the child's pid to this file")
    return parser.parse_args(list(argv))


def _extract_directive(prompt: str) -> tuple[str, list[str]]:
    start = prompt.find(DIRECTIVE_PREFIX)
    if start < 0:
        return prompt, []
    end = prompt.find("]]", start)
    if end < 0:
        return prompt, []
    import shlex  # only paid for when a directive is present

    extra = shlex.split(prompt[start + len(DIRECTIVE_PREFIX) : end])
    return prompt[:start] + prompt[end + 2 :], extra


def _hang() -> None:
    while True:
        time.sleep(_FOREVER)


def _spawn_child(options: argparse.Namespace) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: same process group, sleeps until killed or its lifetime ends
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            if not options.child_keeps_stdout:
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
            time.sleep(options.child_lifetime)
        finally:
            os._exit(0)
    if options.pid_file:
        with open(options.pid_file, "w", encoding="utf-8") as handle:
            handle.write(f"{pid}\n")
    sys.stderr.write(f"fake-cli child pid {pid}\n")
    sys.stderr.flush()


def _write(data: str) -> None:
    sys.stdout.write(data)
    sys.stdout.flush()


def _flood(count: int) -> None:
    block = b"x" * 65536
    out = sys.stdout.buffer
    while count > 0:
        out.write(block[: min(count, len(block))])
        count -= len(block)
    out.flush()


def _answer(options: argparse.Namespace, prompt: str) -> None:
    answer = options.reply if options.reply is not None else prompt.strip()
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(answer.split())}
    if options.output_format == "json":
        if options.hang_after is not None:
            _hang()
        _write(json.dumps({options.json_field: answer, "usage": usage}) + "\n")
        return
    text = options.output_format == "text"
    pieces = split_reply(answer, options.chunks)
    for index, piece in enumerate(pieces):
        if index == options.hang_after:
            _hang()
        if index and options.chunk_delay:
            time.sleep(options.chunk_delay)
        _write(piece if text else json.dumps({"type": "content", "content": piece}) + "\n")
    if options.hang_after is not None:
        _hang()
    if not text:
        usage["completion_tokens"] = len(pieces)
        _write(json.dumps({"type": "result", "usage": usage}) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake agent; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    options = parse_options(args)
    if options.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if options.spawn_child:
        _spawn_child(options)
    prompt = sys.stdin.read()
    prompt, extra = _extract_directive(prompt)
    if extra:
        options = parse_options(args + extra)
        if options.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if options.spawn_child and "--spawn-child" not in args:
            _spawn_child(options)
    if options.sleep:
        time.sleep(options.sleep)
    if options.hang:
        _hang()
    try:
        if options.flood is not None:
            _flood(options.flood)
        elif options.exit_code == 0 or options.answer_then_exit:
            _answer(options, prompt)
    except BrokenPipeError:
        # The reader went away (an adapter stopping a flood): leave quietly, as a CLI would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    if options.stderr:
        sys.stderr.write(options.stderr.rstrip("\n") + "\n")
    return int(options.exit_code)


if __name__ == "__main__":
    sys.exit(main())
