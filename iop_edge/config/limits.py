"""The bounds every config must keep, checked while loading (pure).

A config is data an operator writes, but the daemon reads it again on every save and signal, so
its cost must be bounded before anything expensive runs:

- **Nesting depth** (:data:`MAX_DEPTH` levels, the root mapping being level 1): deeper values
  overflowed Python's recursion limit in the loader and orjson's in the config hash.
- **Expanded size** (:data:`MAX_NODES` YAML nodes, an alias counted at every use): a 1.5 KB
  "billion laughs" document expands to 10^8 nodes. Aliases reuse the node they name, so the
  expanded size of the node graph is measured with one memoized walk, linear in the text,
  before a single value is built. A recursive alias (a node containing an alias to itself) is
  refused as well.
- **Expanded text** (:data:`MAX_EXPANDED_CHARS` characters of scalars, an alias counted at
  every use): under the node cap, a list of a million aliases of one 4,000-character string
  would still expand to 4 GB of text.
- **Integers** must fit in 64 bits (:data:`INT_MIN` … :data:`INT_MAX`), which is what the
  config hash (orjson) and every consumer can represent.

:func:`check_node_graph` runs on the composed YAML graph (before construction);
:func:`check_values` on already-parsed data (every load path goes through it). Both walk
iteratively: no input can exhaust the Python stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import yaml

from iop_edge.config import paths
from iop_edge.errors import ConfigError, ConfigProblem

#: Nesting levels a config may use (the root mapping is level 1; real configs use about 7).
MAX_DEPTH: Final = 64
#: YAML nodes a config may expand to, every mapping key, value and list item counted and an
#: alias counted at every use (the 200-node benchmark config, 501 KiB, has 50,215).
MAX_NODES: Final = 1_000_000
#: Characters of scalar text a config may expand to, an alias counted at every use: four times
#: the largest file read (:data:`iop_edge.config_file.MAX_FILE_BYTES`), so only aliases reach it.
MAX_EXPANDED_CHARS: Final = 16 * 1024 * 1024
#: The integer range a config value may use: signed or unsigned 64-bit.
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1

_DEPTH_RULE: Final = f"a config may nest at most {MAX_DEPTH} levels"
_INT_TAG: Final = "tag:yaml.org,2002:int"
#: An integer written with more characters than this is out of range whatever its base (2^64
#: takes 65 binary digits); refusing it before it is built also keeps Python's limit on
#: converting long digit strings (4,300) from raising.
_MAX_INT_TEXT: Final = 100


def _int_message(shown: str, size: str) -> str:
    return f"{shown} is too {size}; integers must fit in 64 bits ({INT_MIN} to {INT_MAX})"


class _Frame:
    """One collection node being measured: its collection children (scalars are counted at
    once), the next one to visit, and the expanded size and height accumulated so far.

    ``position`` is the index, among all the node's children (a mapping's keys and values
    alternating), of the child being visited: error paths are rendered from it.
    """

    __slots__ = ("chars", "children", "depth", "height", "index", "node", "position", "size")

    def __init__(self, node: yaml.CollectionNode, depth: int, flat: list[yaml.Node]) -> None:
        self.node = node
        self.depth = depth
        self.children = [(i, c) for i, c in enumerate(flat) if isinstance(c, yaml.CollectionNode)]
        scalars = len(flat) - len(self.children)
        self.size = 1 + scalars
        self.chars = sum(len(c.value) for c in flat if isinstance(c, yaml.ScalarNode))
        self.height = 2 if scalars else 1
        self.index = 0
        self.position = 0


def _push(stack: list[_Frame], node: yaml.CollectionNode, depth: int, source: str) -> None:
    """Start measuring ``node`` at ``depth``; refuse it at once when its children would be
    too deep, its scalars alone are too many or too long, or one of them is an integer too
    long to be in range."""
    flat: list[yaml.Node] = (
        [part for pair in node.value for part in pair]
        if isinstance(node, yaml.MappingNode)
        else node.value
    )
    frame = _Frame(node, depth, flat)
    for total, limit, rule in (
        (frame.size, MAX_NODES, _NODES_RULE),
        (frame.chars, MAX_EXPANDED_CHARS, _CHARS_RULE),
    ):
        if total > limit:
            raise _too_big(stack, source, rule)  # at the path of this node, its parent's child
    stack.append(frame)
    if depth >= MAX_DEPTH and flat:
        raise _too_deep(stack, flat[0])
    long_ints = [
        i for i, c in enumerate(flat) if c.tag == _INT_TAG and len(c.value) > _MAX_INT_TEXT
    ]
    if long_ints:
        frame.position = long_ints[0]
        text = flat[frame.position].value
        size = "small" if text.startswith("-") else "large"
        raise _problem(stack, _int_message(f"{text[:24]}…", size))


def check_node_graph(root: yaml.Node | None, source: str) -> None:
    """Refuse a composed YAML document that nests too deep, expands past :data:`MAX_NODES`,
    holds a recursive alias or an integer far out of range; raise :class:`ConfigError`
    naming the path and the cap."""
    if not isinstance(root, yaml.CollectionNode):
        return  # an empty or scalar document: refused later as "not a mapping"
    # id(node) -> (expanded size, height, expanded characters), once measured
    sizes: dict[int, tuple[int, int, int]] = {}
    stack: list[_Frame] = []
    _push(stack, root, 1, source)
    open_ids = {id(root)}
    while stack:
        frame = stack[-1]
        if frame.index < len(frame.children):
            frame.position, child = frame.children[frame.index]
            frame.index += 1
            known = sizes.get(id(child))
            if known is None:
                if id(child) in open_ids:
                    raise _problem(
                        stack,
                        f"is a recursive alias (line {child.start_mark.line + 1} refers to a "
                        "node that contains it); a config cannot be recursive",
                    )
                _push(stack, child, frame.depth + 1, source)
                open_ids.add(id(child))
                continue
            size, height, chars = known  # an alias of a node measured before: reuse
            if frame.depth + height > MAX_DEPTH:
                raise _too_deep(stack, child)
        else:
            stack.pop()
            open_ids.discard(id(frame.node))
            sizes[id(frame.node)] = (frame.size, frame.height, frame.chars)
            if not stack:
                return
            size, height, chars = frame.size, frame.height, frame.chars
            frame = stack[-1]
        frame.size += size
        frame.chars += chars
        frame.height = max(frame.height, height + 1)
        if frame.size > MAX_NODES:
            stack.pop()  # the path of the frame itself, not of its last child
            raise _too_big(stack, source, _NODES_RULE)
        if frame.chars > MAX_EXPANDED_CHARS:
            stack.pop()
            raise _too_big(stack, source, _CHARS_RULE)


def _too_deep(stack: list[_Frame], child: yaml.Node) -> ConfigError:
    return _problem(
        stack,
        f"is nested more than {MAX_DEPTH} levels deep (line {child.start_mark.line + 1}); "
        + _DEPTH_RULE,
    )


_NODES_RULE: Final = (
    f"expands to more than {MAX_NODES:,} YAML nodes, an alias counted at every use; a "
    f"config may expand to at most {MAX_NODES:,} (an alias bomb?)"
)
_CHARS_RULE: Final = (
    f"expands to more than {MAX_EXPANDED_CHARS // 2**20} MiB of text, an alias counted at "
    f"every use; a config may expand to at most {MAX_EXPANDED_CHARS:,} characters "
    "(an alias bomb?)"
)


def _too_big(stack: list[_Frame], source: str, rule: str) -> ConfigError:
    error = _problem(stack, rule)
    if error.problems[0].path:
        return error
    return ConfigError([ConfigProblem("", f"{source}: the document {rule}")])


def _problem(stack: list[_Frame], message: str) -> ConfigError:
    """A one-problem error at the path of the child each frame of ``stack`` is visiting."""
    path, key = "", ""
    for frame in stack:
        index = frame.position
        if isinstance(frame.node, yaml.MappingNode):
            key_node = frame.node.value[index // 2][0]
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            path = paths.join(path, key)
        else:
            label = paths.item_label(key, _identity(frame.node.value[index], key), index)
            path += f"[{label}]"
    return ConfigError([ConfigProblem(path, message)])


def _identity(item: yaml.Node, list_key: str) -> dict[str, str] | None:
    """The identity of a list item node as :func:`paths.item_label` reads it."""
    ident = paths.IDENTITY_KEYS.get(list_key)
    if ident is None or not isinstance(item, yaml.MappingNode):
        return None
    for key_node, value_node in item.value:
        if (
            isinstance(key_node, yaml.ScalarNode)
            and key_node.value == ident
            and isinstance(value_node, yaml.ScalarNode)
        ):
            return {ident: value_node.value}
    return None


def check_values(data: Any) -> list[ConfigProblem]:
    """Every integer outside 64 bits in parsed data, at its path; or the one problem of data
    nested deeper than :data:`MAX_DEPTH` or larger than :data:`MAX_NODES` values (which ends
    the walk: such data may also be recursive)."""
    if _within_limits(data):
        return []
    problems: list[ConfigProblem] = []
    for count, (value, loc) in enumerate(_walk(data), start=1):
        if len(loc) >= MAX_DEPTH:
            return [
                ConfigProblem(
                    paths.render_loc(loc, data),
                    f"is nested more than {MAX_DEPTH} levels deep; " + _DEPTH_RULE,
                )
            ]
        if count > MAX_NODES:
            return [
                ConfigProblem(
                    "",
                    f"the config holds more than {MAX_NODES:,} values; the limit is {MAX_NODES:,}",
                )
            ]
        if type(value) is int and not INT_MIN <= value <= INT_MAX:
            shown = (
                str(value)
                if value.bit_length() <= 1000
                else f"an integer of {value.bit_length()} bits"
            )
            size = "large" if value > 0 else "small"
            problems.append(ConfigProblem(paths.render_loc(loc, data), _int_message(shown, size)))
    return problems


def _within_limits(data: Any) -> bool:
    """The fast check, level by level without paths: whether ``data`` keeps every bound
    (when it does not, :func:`check_values` walks again to name the paths)."""
    level = [data]
    count = 1
    for _ in range(MAX_DEPTH):
        below: list[Any] = []
        for value in level:
            if isinstance(value, dict):
                below.extend(value)  # keys are values too (an integer key is checked)
                below.extend(value.values())
            elif isinstance(value, list | tuple):
                below.extend(value)
            elif type(value) is int and not INT_MIN <= value <= INT_MAX:
                return False
        if not below:
            return True
        count += len(below)
        if count > MAX_NODES:
            return False
        level = below
    return False


def _walk(data: Any) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    """Every value and mapping key of ``data`` with its location, depth first, iteratively
    (a key is reported at the location of its value)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        yield value, loc
        if isinstance(value, dict):
            children = []
            for key, item in value.items():
                child = (*loc, str(key))
                yield key, child
                children.append((item, child))
            stack.extend(reversed(children))  # popped in document order
        elif isinstance(value, list | tuple):
            stack.extend(reversed([(item, (*loc, i)) for i, item in enumerate(value)]))
