"""The text a patch's edits leave, one edit after another, and its tree, parsed again only where
an edit changed it (pure)."""

from __future__ import annotations

import ast
import bisect
import copy
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from opspatch.core.anchors import (
    AnchorProblem,
    DefNode,
    child_blocks,
    definitions_in,
    first_line,
    iter_definitions,
    remember_definitions,
    resolve_scope,
)
from opspatch.core.placement import Splice, apply_splices
from opspatch.core.selectors import MODULE_SCOPE
from opspatch.core.source import LineIndex, split_lines
from opspatch.core.syntax import MAX_AST_DEPTH, SAME_TREE_FROM, parse_python

_HOLDERS = ("body", "orelse", "finalbody", "handlers", "cases")
"""The fields of a statement (or handler, or match case) that hold statements."""


class Unsure(Exception):
    """`ScopedReparse` cannot vouch for its tree here: place the edits the plain way."""


class WholeReparse:
    """The reference: the whole text parsed again after every edit."""

    whole_fresh = True
    """The tree is always the whole text's."""

    def __init__(self, text: str, tree: ast.Module) -> None:
        self.text = text
        self.tree = tree

    def tree_for(self, scope: str | None) -> ast.Module:
        """A tree of `self.text`, exact at least in `scope` (None: a diff, the whole file)."""
        return self.tree

    def apply(self, scope: str | None, splices: Sequence[Splice]) -> None:
        """Carry an edit in `scope` into the text and its tree.

        Raises:
            SyntaxError: the new text does not parse.
            EditProblem: two splices overlap.
        """
        self.text = apply_splices(self.text, splices)
        self.tree = parse_python(self.text)

    def final_tree(self, feature_version: tuple[int, int] | None = None) -> tuple[ast.Module, bool]:
        """The tree of the text the last edit left, exact everywhere; not parsed for
        `feature_version` (False)."""
        return self.tree, False


@dataclass
class _Place:
    """Where a definition of the current tree stands now (its first and last line), and
    whether its node says exactly what a parse of the whole text would (`fresh`), or was parsed
    before an edit moved or changed it."""

    first: int
    end: int
    fresh: bool = True


class ScopedReparse:
    """The text after each edit, and a tree of it exact in the scope of the edit placed next.

    `pending`: lines were put into the text since it was last parsed whole, and not all of them
    are known to parse; a text that does not parse then cannot say which edit broke it."""

    def __init__(self, text: str, tree: ast.Module) -> None:
        self.text = text
        self.tree = tree
        self.index = LineIndex.of(text)
        self.whole_fresh = True
        self.pending = False
        self.places: dict[int, _Place] = {}
        self._whole(tree)

    def tree_for(self, scope: str | None) -> ast.Module:
        """A tree of `self.text` whose node for `scope` (None or `<module>`: every node) says
        exactly what a parse of the whole text would say.

        Raises:
            Unsure: the scope is not one definition, or does not parse on its own.
        """
        if _is_whole(scope):
            if not self.whole_fresh:  # every line was checked for depth when it came in
                try:
                    self._whole(self._parse(self.text, checked=True))
                except SyntaxError:
                    raise Unsure("the text does not parse") from None
            return self.tree
        assert scope is not None
        node = self._resolve(scope)
        place = self.places[id(node)]
        if not place.fresh:
            # every line of the text was checked for depth where it stands when it came in
            path = _path(self.tree, scope)
            new = self._parse_region(scope, node, self.index, place.first, place.end, None)
            self._swap(path, scope, new)
        return self.tree

    def apply(self, scope: str | None, splices: Sequence[Splice]) -> None:
        """Carry an edit in `scope` into the text: an insert's lines are parsed when their scope
        is next needed, any other change of a scope at once, a module-level one in the whole
        text.

        Raises:
            SyntaxError: the new text does not parse (as the reference would say).
            EditProblem: two splices overlap.
            Unsure: the text does not parse, but lines put in before may be why.
        """
        text = apply_splices(self.text, splices)
        line = self._inserted_before(scope, splices[0]) if len(splices) == 1 else None
        if line is not None:
            self._put_lines(scope, line, text)
        elif _is_whole(scope):
            self._whole(self._parse(text))
        else:
            assert scope is not None
            self._changed(scope, splices, text)

    def final_tree(self, feature_version: tuple[int, int] | None = None) -> tuple[ast.Module, bool]:
        """The tree of the whole text the last edit left (parsed once, here, and checked for
        depth whole, as the reference checks it), and whether that parse was for
        `feature_version` (the patch's `min_python`): then the text parses for that Python too,
        and the validation need not parse it again.

        Raises:
            Unsure: it does not parse (the reference says after which edit).
        """
        if self.whole_fresh:
            return self.tree, False
        if feature_version is not None and feature_version >= SAME_TREE_FROM:
            try:
                tree = parse_python(self.text, feature_version=feature_version)
            except SyntaxError:
                pass  # not for that Python, or not at all: parsed as before, which says which
            else:
                self._whole(tree)
                return tree, True
        try:
            self._whole(self._parse(self.text))
        except SyntaxError:
            raise Unsure("the text does not parse") from None
        return self.tree, False

    # -----------------------------------------------------------------------------------------

    def _whole(self, tree: ast.Module) -> None:
        """`tree` is the whole text's: every node says where it stands."""
        self.tree = tree
        self.index = LineIndex.of(self.text)
        self.whole_fresh = True
        self.pending = False
        self.places = {
            id(node): _Place(first_line(node), _end(node)) for _, node in iter_definitions(tree)
        }

    def _parse(self, text: str, *, checked: bool = False) -> ast.Module:
        """`text` parsed whole, made the current text; its depth checked unless every line of
        it was (`checked`).

        Raises:
            SyntaxError: it does not parse, and every change before this one did.
            Unsure: it does not parse, and lines put in before may be why.
        """
        try:
            tree = parse_python(text, max_depth=None if checked else MAX_AST_DEPTH)
        except SyntaxError:
            if self.pending:
                raise Unsure("the text does not parse, after lines not parsed yet") from None
            raise
        self.text = text
        return tree

    def _changed(self, scope: str, splices: Sequence[Splice], text: str) -> None:
        """`scope`'s lines changed by `splices` (giving `text`): parse them again now, or the
        whole text when they do not parse on their own."""
        node = self._resolve(scope)
        place = self.places[id(node)]
        low, high = self.index.line_start(place.first), self.index.line_end(place.end)
        high += len(text) - len(self.text)
        if (
            any(s.start < low or s.end > high for s in splices)
            or text[low - 1 : low + 1] == "\r\n"  # a file of mixed line endings: two line
            or text[high - 1 : high + 1] == "\r\n"  # breaks became one
        ):
            self._whole(self._parse(text))
            return
        index = self.index.spliced(text, place.first, place.end).remember()
        end = len(index.lines) - (len(self.index.lines) - place.end)
        path = _path(self.tree, scope)
        try:
            new = self._parse_region(scope, node, index, place.first, end, len(path))
        except Unsure:
            self._whole(self._parse(text))
            return
        self.text, self.index = text, index
        self._swap(path, scope, new, moved=(place.end, end - place.end))

    def _inserted_before(self, scope: str | None, splice: Splice) -> int | None:
        """The line before which `splice` puts whole lines between the statements of `scope`
        (not into a definition inside it), lines that define nothing; else None."""
        text, offset, new = self.text, splice.start, splice.text
        line = bisect.bisect_left(self.index.starts, offset) + 1
        if (
            splice.end != offset
            or line > len(self.index.starts)
            or self.index.starts[line - 1] != offset
            or (offset > 0 and text[offset - 1] not in "\r\n")
            or not new.endswith(("\n", "\r"))
            or (text[offset - 1 : offset] == "\r" and new.startswith("\n"))
            or (new.endswith("\r") and text[offset : offset + 1] == "\n")
            or any(_defines(row) for row in split_lines(new))
            or not _shallow_enough(new)
        ):
            return None
        own = None if _is_whole(scope) else self._resolve(scope)  # type: ignore[arg-type]
        for qualname, node in iter_definitions(self.tree):
            place = self.places[id(node)]
            if node is own:
                if not place.first < line <= place.end + 1:
                    return None
            elif (own is None or qualname.startswith(f"{scope}.")) and (
                place.first < line <= place.end
            ):
                return None  # inside a definition of its own
        return line

    def _put_lines(self, scope: str | None, line: int, text: str) -> None:
        """Lines put before `line` (giving `text`), not parsed yet: what holds them is no longer
        fresh, and whatever stands after them moved."""
        index = self.index.spliced(text, line, line - 1).remember()
        grown = len(index.lines) - len(self.index.lines)
        holders = set() if _is_whole(scope) else _holders_of(scope)  # type: ignore[arg-type]
        for qualname, node in iter_definitions(self.tree):
            place = self.places[id(node)]
            if qualname in holders:
                self.places[id(node)] = _Place(place.first, place.end + grown, False)
            elif place.first >= line:
                self.places[id(node)] = _Place(place.first + grown, place.end + grown, False)
        self.text, self.index = text, index
        self.whole_fresh = False
        self.pending = True

    def _resolve(self, scope: str) -> DefNode:
        try:
            node = resolve_scope(self.tree, scope).node
        except AnchorProblem:
            raise Unsure(f"scope `{scope}` is not one definition") from None
        assert not isinstance(node, ast.Module)
        return node

    def _parse_region(
        self, scope: str, node: DefNode, index: LineIndex, first: int, end: int, depth: int | None
    ) -> DefNode:
        """The definition `node` stands for, parsed from lines `first` to `end` of `index.text`
        at their line numbers; checked as deep as the whole file checks it when `depth` (the
        node's level in the whole tree, the module's being 1) is given.

        Raises:
            Unsure: the lines do not parse on their own as that one definition.
        """
        lines = index.text[index.line_start(first) : index.line_end(end)]
        if index.indentation(first):
            if first < 2:
                raise Unsure("an indented definition on the first line")
            source, level = "\n" * (first - 2) + "if 1:\n" + lines, 3
        else:
            source, level = "\n" * (first - 1) + lines, 2
        deepest = None if depth is None else MAX_AST_DEPTH - (depth - level)
        try:
            body = parse_python(source, max_depth=deepest).body
        except SyntaxError:
            raise Unsure(f"`{scope}` does not parse on its own") from None
        if level == 3 and len(body) == 1 and isinstance(body[0], ast.If):
            body = body[0].body
        new = body[0] if len(body) == 1 else None
        if not isinstance(new, type(node)) or new.name != node.name:
            raise Unsure(f"`{scope}` is not one definition on its own")
        return new

    def _swap(
        self,
        path: list[ast.AST],
        scope: str,
        new: DefNode,
        moved: tuple[int, int] = (0, 0),
    ) -> None:
        """Put `new` where the last node of `path` stood, in a copy of the path to it (no tree
        is ever changed). `moved`: the last line of the edited region before the edit, and how
        many lines the edit added (less those it removed): every line after it moves so."""
        old = path[-1]
        assert isinstance(old, DefNode)
        copies: dict[int, ast.AST] = {}
        child: ast.AST = old
        twin: ast.AST = new
        for parent in reversed(path[:-1]):
            copied = copy.copy(parent)
            for name in _HOLDERS:
                held = getattr(parent, name, None)
                if isinstance(held, list) and any(x is child for x in held):
                    setattr(copied, name, [twin if x is child else x for x in held])
                    break
            copies[id(parent)] = copied
            child, twin = parent, copied
        assert isinstance(twin, ast.Module)
        after, grown = moved
        parent_name = scope.rpartition(".")[0]
        prefix = parent_name + "." if parent_name else ""
        gone = {
            id(node)
            for qualname, node in iter_definitions(self.tree)
            if node is old or qualname.startswith(f"{scope}.")
        }
        came = definitions_in([new], prefix)
        ordered: list[tuple[str, DefNode]] = []
        places: dict[int, _Place] = {}
        for qualname, node in iter_definitions(self.tree):
            if id(node) in gone:
                if node is old:
                    ordered += came
                    places.update({id(n): _Place(first_line(n), _end(n)) for _, n in came})
                continue
            place = self.places[id(node)]
            if id(node) in copies:  # holds the edited scope: its end moved, its lines changed
                holder = copies[id(node)]
                assert isinstance(holder, DefNode)
                node = holder
                place = _Place(place.first, place.end + grown, False)
            elif place.first > after and grown:
                place = _Place(place.first + grown, place.end + grown, False)
            ordered.append((qualname, node))
            places[id(node)] = place
        remember_definitions(twin, ordered)
        self.tree, self.places = twin, places
        self.whole_fresh = False


def _is_whole(scope: str | None) -> bool:
    """An edit without a scope (a diff) or at module level: the whole file is its scope."""
    return scope is None or scope == MODULE_SCOPE


def _defines(line: str) -> bool:
    """Whether a line may start a definition or a decorator (so its lines are parsed at once:
    the scopes a file defines are known); a line that merely starts so is taken for one."""
    return line.lstrip(" \t\f").startswith(("def", "class", "async", "@"))


def _shallow_enough(lines: str) -> bool:
    """Whether statements put into a file as `lines` (at the indentation of their block) cannot
    sit deeper there than the whole file's parse allows: parsed on their own, with what a block
    at that indentation can add (each step of indentation at most a compound statement and a
    handler). What is not known to be so is parsed with its scope at once."""
    indent = next((row for row in split_lines(lines) if row.strip()), "")
    indent = indent[: len(indent) - len(indent.lstrip(" \t\f"))]
    try:
        parse_python(textwrap.dedent(lines), max_depth=MAX_AST_DEPTH - 2 * len(indent))
    except SyntaxError:
        return False
    return True


def _holders_of(scope: str) -> set[str]:
    """`scope` and the definitions it is nested in, by qualname."""
    parts = scope.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts) + 1)}


def _end(node: ast.stmt) -> int:
    return node.end_lineno if node.end_lineno is not None else node.lineno


def _path(tree: ast.Module, scope: str) -> list[ast.AST]:
    """The nodes from the module down to the definition `scope` names: the definitions that
    hold it and the statements (and handlers) between them.

    Raises:
        Unsure: a definition on the way is not one.
    """
    path: list[ast.AST] = [tree]
    parts = scope.split(".")
    for k in range(1, len(parts) + 1):
        try:
            target = resolve_scope(tree, ".".join(parts[:k])).node
        except AnchorProblem:
            raise Unsure(f"`{'.'.join(parts[:k])}` is not one definition") from None
        below = _below(path[-1], target)
        if below is None:
            raise Unsure(f"`{scope}` was not found below its parent")
        path += below
    return path


def _below(holder: ast.AST, target: ast.AST) -> list[ast.AST] | None:
    """The nodes from a child of `holder` down to `target`, at `holder`'s own level (not into
    other definitions); None when it is not there."""
    for name in _HOLDERS:
        for child in getattr(holder, name, None) or ():
            if child is target:
                return [child]
            if isinstance(child, ast.stmt) and not child_blocks(child):
                continue  # holds no statements (a definition's are its own scope's)
            found = _below(child, target)
            if found is not None:
                return [child, *found]
    return None
