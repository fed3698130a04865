"""One Stanford Sentiment Treebank tree: the :class:`Tree` type and the PTB bracket parser.

:func:`parse_tree` reads one line such as ``(3 (2 It) (4 (2 's) (4 good)))`` into a
:class:`Tree`, a sentiment label 0-4 on every node. Words are kept as the file spells them
(PTB escaped: ``-LRB-`` for ``(``, ``\\/`` for ``/``); :func:`unescape_word` turns them back
for display. Parsing and every traversal are iterative, so trees of any depth are fine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from batchfold.errors import SSTFormatError

__all__ = [
    "Tree",
    "parse_tree",
    "unescape_word",
]

_LABELS = {"0": 0, "1": 1, "2": 2, "3": 3, "4": 4}
_TOKEN = re.compile(r"[()]|[^ ()]+")
_ESCAPES = {
    "-LRB-": "(",
    "-RRB-": ")",
    "-LSB-": "[",
    "-RSB-": "]",
    "-LCB-": "{",
    "-RCB-": "}",
}


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Tree:
    """One node of a sentiment tree, with its whole subtree.

    A leaf has a ``word`` and no children; an internal node has no word and one or two
    children. Equality, hashing, ``str``, ``repr`` and pickling all work without recursion, so
    very deep trees are safe.

    Arguments:
        label: the sentiment class of the phrase, 0 (very negative) to 4 (very positive).
        word: the token of a leaf, as the file spells it (PTB escaped); ``None`` for an
            internal node.
        children: the subtrees of an internal node, left to right; ``()`` for a leaf.

    Raises:
        ValueError: a node with both or neither of a word and children, or with more than
            two children.

    Example:
        >>> t = Tree(3, None, (Tree(2, "It", ()), Tree(4, "works", ())))
        >>> str(t), t.size, t.depth, t.words()
        ('(3 (2 It) (4 works))', 3, 1, ['It', 'works'])
    """

    label: int
    word: str | None
    children: tuple[Tree, ...]

    def __post_init__(self) -> None:
        if self.word is None:
            if not 1 <= len(self.children) <= 2:
                raise ValueError(
                    f"an internal node needs 1 or 2 children, got {len(self.children)}"
                )
        elif self.children:
            raise ValueError("a leaf (a node with a word) cannot have children")

    @property
    def is_leaf(self) -> bool:
        """Whether this node is a leaf (holds a word).

        Returns:
            ``True`` for a leaf.

        Example:
            >>> parse_tree("(2 a)").is_leaf
            True
        """
        return self.word is not None

    def nodes(self) -> Iterator[Tree]:
        """All nodes of the tree in post-order: children left to right, then their parent.

        Returns:
            An iterator over the nodes; the root comes last.

        Example:
            >>> [n.label for n in parse_tree("(3 (1 a) (4 (0 b) (2 c)))").nodes()]
            [1, 0, 2, 4, 3]
        """
        stack: list[tuple[Tree, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded or not node.children:
                yield node
            else:
                stack.append((node, True))
                stack.extend((child, False) for child in reversed(node.children))

    def leaves(self) -> list[Tree]:
        """The leaves of the tree, left to right.

        Returns:
            The leaf nodes in sentence order.

        Example:
            >>> [leaf.label for leaf in parse_tree("(3 (1 a) (4 b))").leaves()]
            [1, 4]
        """
        return [node for node in self.nodes() if node.word is not None]

    def words(self) -> list[str]:
        """The words of the sentence, left to right, as the file spells them.

        Returns:
            The leaves' words.

        Example:
            >>> parse_tree("(3 (2 -LRB-) (2 (2 hi) (2 -RRB-)))").words()
            ['-LRB-', 'hi', '-RRB-']
        """
        return [node.word for node in self.nodes() if node.word is not None]

    @property
    def size(self) -> int:
        """The number of nodes in the tree, leaves included.

        Returns:
            The node count (1 for a leaf).

        Example:
            >>> parse_tree("(3 (2 a) (2 b))").size
            3
        """
        return sum(1 for _ in self.nodes())

    @property
    def depth(self) -> int:
        """The number of edges on the longest path from this node down to a leaf.

        Returns:
            0 for a leaf, 1 for a node whose children are all leaves, and so on.

        Example:
            >>> parse_tree("(3 (2 a) (2 (2 b) (2 c)))").depth
            2
        """
        deepest = 0
        stack: list[tuple[Tree, int]] = [(self, 0)]
        while stack:
            node, d = stack.pop()
            deepest = max(deepest, d)
            stack.extend((child, d + 1) for child in node.children)
        return deepest

    def _flat(self) -> list[tuple[int, str | None, int]]:
        """The tree as ``(label, word, number of children)`` triples in post-order."""
        return [(node.label, node.word, len(node.children)) for node in self.nodes()]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        pairs: list[tuple[Tree, Tree]] = [(self, other)]
        while pairs:
            a, b = pairs.pop()
            if a is b:
                continue
            if a.label != b.label or a.word != b.word or len(a.children) != len(b.children):
                return False
            pairs.extend(zip(a.children, b.children, strict=True))
        return True

    def __hash__(self) -> int:
        return hash(tuple(self._flat()))

    def __str__(self) -> str:
        parts: list[str] = []
        stack: list[Tree | str] = [self]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
            elif item.word is not None:
                parts.append(f"({item.label} {item.word})")
            else:
                parts.append(f"({item.label}")
                stack.append(")")
                for child in reversed(item.children):
                    stack.append(child)
                    stack.append(" ")
        return "".join(parts)

    def __repr__(self) -> str:
        return f"parse_tree({str(self)!r})"

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return _from_flat, (self._flat(),)


def _from_flat(flat: list[tuple[int, str | None, int]]) -> Tree:
    """Rebuild a tree from the post-order triples of ``Tree._flat`` (used by pickle)."""
    built: list[Tree] = []
    for label, word, n_children in flat:
        if n_children:
            children = tuple(built[-n_children:])
            del built[-n_children:]
        else:
            children = ()
        built.append(Tree(label, word, children))
    (root,) = built
    return root


def unescape_word(word: str) -> str:
    """A PTB-escaped token as plain text, for display.

    ``-LRB-``/``-RRB-`` become ``(``/``)`` (and likewise the square and curly bracket forms),
    ``\\/`` becomes ``/`` and ``\\*`` becomes ``*``.

    Arguments:
        word: a token as it appears in the SST files.

    Returns:
        The token with the escapes undone.

    Example:
        >>> [unescape_word(w) for w in ["-LRB-", "-RRB-", "1\\\\/2", "\\\\*\\\\*", "fine"]]
        ['(', ')', '1/2', '**', 'fine']
    """
    if word in _ESCAPES:
        return _ESCAPES[word]
    return word.replace("\\/", "/").replace("\\*", "*")


def _describe(token: str | None) -> str:
    return "end of line" if token is None else repr(token)


def parse_tree(line: str, *, source: str = "<string>", line_no: int = 1) -> Tree:
    """Parse one PTB bracketed line such as ``(3 (2 a) (4 good))`` into a :class:`Tree`.

    Tokens are separated by ASCII spaces and brackets only, so a word may hold other
    whitespace (SST has one token with a no-break space). A trailing line ending is ignored.
    Every node needs a label 0-4 followed by either one word or one or two subtrees.

    Arguments:
        line: the text of one tree.
        source: the file name used in error messages.
        line_no: the line number used in error messages.

    Returns:
        The root of the tree.

    Raises:
        SSTFormatError: the line is not one well-formed tree; the message gives
            ``source:line_no:column`` and what was expected and found.

    Example:
        >>> t = parse_tree("(3 (2 It) (4 (2 's) (4 good)))")
        >>> t.label, t.words(), t.children[1].label
        (3, ['It', "'s", 'good'], 4)
    """
    line = line.rstrip("\r\n")
    tokens: list[str | None] = list(_TOKEN.findall(line))
    tokens.append(None)  # end of line
    pos = 0

    def fail(expected: str, index: int) -> SSTFormatError:
        starts = [m.start() + 1 for m in _TOKEN.finditer(line)] + [len(line) + 1]
        found = _describe(tokens[index])
        return SSTFormatError(
            f"{source}:{line_no}:{starts[index]}: expected {expected}, found {found}"
        )

    if tokens[0] != "(":
        raise fail("'('", 0)
    # The open nodes, innermost last: (label, children so far).
    stack: list[tuple[int, list[Tree]]] = []
    while True:
        # Here tokens[pos] is "(": read the label, then a word or the first subtree.
        label = _LABELS.get(tokens[pos + 1] or "")
        if label is None:
            raise fail("a label 0-4", pos + 1)
        pos += 2
        token = tokens[pos]
        if token == "(":
            stack.append((label, []))
            continue
        if token is None or token == ")":
            raise fail("a word or '('", pos)
        pos += 1
        if tokens[pos] != ")":
            raise fail("')'", pos)
        node = Tree(label, token, ())
        # Close finished nodes until one can take another child or the root is done.
        pos += 1
        while stack:
            parent_label, children = stack[-1]
            children.append(node)
            token = tokens[pos]
            if token == "(" and len(children) < 2:
                break
            if token != ")":
                raise fail("')' or '('" if len(children) < 2 else "')'", pos)
            stack.pop()
            node = Tree(parent_label, None, tuple(children))
            pos += 1
        else:
            break
    if tokens[pos] is not None:
        raise fail("end of line", pos)
    return node
