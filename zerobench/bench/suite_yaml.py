"""Reading a suite file: YAML's safe subset (no ``!!python`` tags, aliases shared rather than copied), and
nothing YAML would accept silently or a reader would crash on.

- A key given twice in one mapping is refused, naming the key and both lines: YAML parsers keep the last
  value without a word, so a suite that sets ``steps`` twice would run what its reader did not expect.
- Nesting deeper than ``MAX_DEPTH`` is refused before it is built (a suite is a few levels deep; the
  parser builds nodes recursively, and 100k levels would end in a ``RecursionError``).
- Aliases that expand the document beyond ``MAX_VALUES`` values or ``MAX_DEPTH`` levels (billion laughs), or
  that make it hold itself, are refused before anything is built from it: the values of a suite are
  copied, compared and printed in error messages, which would expand them.
- An integer beyond a 64-bit one, or a float literal beyond the largest float (``1.0e+400``, which YAML reads
  as infinity), is refused: no run key takes one, and converting it later would end in an ``OverflowError``.
  (``.inf`` written as such is read as infinity and refused by the key that gets it.)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from zerobench.config import ConfigError

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a suite may have (suites use 3 or 4 levels)."""
MAX_VALUES = 1_000_000
"""Most values (scalars, lists, mappings) a suite may expand to through its aliases: a suite of ``MAX_RUNS``
runs written out holds a few hundred thousand; a billion-laughs file holds 9**9 from a few lines."""
INT_LIMIT = 2**63 - 1
"""Largest integer magnitude a suite may hold (int64, what every count and seed fits in)."""
_INF_LITERALS = {".inf", "+.inf", "-.inf", ".Inf", "+.Inf", "-.Inf", ".INF", "+.INF", "-.INF"}


class SuiteYAMLError(Exception):
    """A suite's YAML that is refused; the message names the line."""


class SuiteLoader(yaml.SafeLoader):
    """``yaml.SafeLoader``, refusing duplicate keys, deep nesting and numbers out of range."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise SuiteYAMLError(
                    f"line {line}: nested more than {MAX_DEPTH} levels deep: a suite is a mapping "
                    "of run keys a few levels deep"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        root = super().compose_document()
        _check_expansion(root)
        return root

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self._refuse_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _refuse_duplicates(self, node: yaml.MappingNode) -> None:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base`` may be overridden key by key
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader refuses it in one line
                continue
            if first is not None:
                raise SuiteYAMLError(
                    f"line {line}: key {key!r} is given twice in one mapping (first on line {first}): keep one"
                )
            seen[key] = line

    def construct_yaml_int(self, node):
        value = super().construct_yaml_int(node)
        if abs(value) > INT_LIMIT:
            raise SuiteYAMLError(
                f"line {node.start_mark.line + 1}: the integer {node.value[:30]}"
                f"{'...' if len(node.value) > 30 else ''} is out of range (at most 2**63-1)"
            )
        return value

    def construct_yaml_float(self, node):
        value = super().construct_yaml_float(node)
        if math.isinf(value) and node.value not in _INF_LITERALS:
            raise SuiteYAMLError(
                f"line {node.start_mark.line + 1}: the number {node.value[:30]} is beyond the largest float"
            )
        return value


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand it beyond ``MAX_VALUES`` values or ``MAX_DEPTH`` levels, or that
    holds itself: the node graph is walked once (each anchored node sized once), never expanded."""
    size: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth) of the tree it expands to
    path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        if finished:
            path.discard(id(node))
            kids = [size[id(c)] for c in _children(node)]
            values, depth = 1 + sum(v for v, _ in kids), 1 + max((d for _, d in kids), default=0)
            line = node.start_mark.line + 1
            if values > MAX_VALUES:
                raise SuiteYAMLError(
                    f"line {line}: its aliases (*name) expand to more than {MAX_VALUES:,} values: "
                    "write the values out, or use fewer aliases"
                )
            if depth > MAX_DEPTH:
                raise SuiteYAMLError(f"line {line}: its aliases (*name) nest more than {MAX_DEPTH} levels deep")
            size[id(node)] = (values, depth)
            continue
        if id(node) in size:
            continue
        path.add(id(node))
        stack.append((node, True))
        for child in _children(node):
            if id(child) in path:
                raise SuiteYAMLError(
                    f"line {child.start_mark.line + 1}: an alias refers to a collection that holds "
                    "it (a recursive anchor): a suite is a tree"
                )
            if id(child) not in size:
                stack.append((child, False))


SuiteLoader.add_constructor("tag:yaml.org,2002:int", SuiteLoader.construct_yaml_int)
SuiteLoader.add_constructor("tag:yaml.org,2002:float", SuiteLoader.construct_yaml_float)


def load_yaml(path: Path) -> Any:
    """The YAML document in ``path`` (a suite), or a one-line ``ConfigError`` naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not a YAML suite (not UTF-8 text: byte {e.start} is {e.object[e.start]:#04x})"
        ) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the suite: {e.strerror or e}") from None
    try:
        return yaml.load(text, Loader=SuiteLoader)  # SuiteLoader is a SafeLoader
    except SuiteYAMLError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
