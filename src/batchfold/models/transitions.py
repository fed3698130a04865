"""The arc-hybrid transition system of the parser, with its static and dynamic oracles.

:class:`ArcHybrid` is the arc-hybrid transition system (Kuhlmann, Gomez-Rodriguez and Satta
2011) as used by Kiperwasser and Goldberg (2016). The artificial root token ``0``
(:data:`~batchfold.data.conllu.ROOT`) sits at the **end of the buffer**: a configuration starts
with an empty stack and the buffer ``1 .. n, 0``, and it is terminal when the stack is empty and
only the root is left in the buffer. The root is never shifted; words get attached to it by
LEFT_ARC when it is the first buffer item. :func:`oracle_transitions` is the static oracle and
:func:`action_cost` the dynamic oracle of Goldberg and Nivre (2013). The sentences come from
:mod:`batchfold.data.conllu`; :mod:`batchfold.models.attachment` scores the trees built.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TypeAlias

from batchfold.data.conllu import ROOT, Sentence, is_projective

__all__ = [
    "Action",
    "ArcHybrid",
    "Transition",
    "action_cost",
    "oracle_transitions",
]


class Action(enum.IntEnum):
    """The three arc-hybrid transitions.

    SHIFT moves the first buffer item onto the stack. LEFT_ARC attaches the stack top to the
    first buffer item and pops it. RIGHT_ARC attaches the stack top to the item below it and
    pops it.
    """

    SHIFT = 0
    LEFT_ARC = 1
    RIGHT_ARC = 2


Transition: TypeAlias = tuple[Action, str | None]
"""An action with its relation label (``None`` for SHIFT, or for unlabelled parsing)."""


class ArcHybrid:
    """An arc-hybrid parser configuration: a stack, a buffer and the arcs built so far.

    Words are numbered ``1..n`` and the root token is :data:`ROOT` (0), kept at the end of
    the buffer and never shifted. A configuration starts with an empty stack and the buffer
    ``1..n, 0``; it is terminal when the stack is empty and the buffer holds only the root.
    Every word then has a head, but nothing stops several words from being attached to the
    root (the static oracle of a single-rooted tree attaches exactly one).

    Arguments:
        n_words: the number of words of the sentence.

    Raises:
        ValueError: ``n_words`` is negative.

    Example:
        >>> c = ArcHybrid(2)
        >>> c.apply(Action.SHIFT)
        >>> c.apply(Action.LEFT_ARC, "nsubj")  # 1 <- 2
        >>> c.apply(Action.SHIFT)
        >>> c.stack, c.buffer
        ([2], [0])
        >>> c.apply(Action.LEFT_ARC, "root")  # 2 <- root
        >>> c.is_terminal(), c.heads, c.arcs
        (True, [2, 0], [(2, 1, 'nsubj'), (0, 2, 'root')])
    """

    __slots__ = ("heads", "labels", "n_words", "next", "stack")

    def __init__(self, n_words: int) -> None:
        if n_words < 0:
            raise ValueError(f"expected a word count of at least 0, found {n_words}")
        self.n_words = n_words
        """The number of words."""
        self.stack: list[int] = []
        """The stack, bottom first (``stack[-1]`` is the top)."""
        self.next = 1
        """The first word still in the buffer; ``n_words + 1`` when only the root is left."""
        self.heads: list[int] = [-1] * n_words
        """``heads[i]`` is the head given to word ``i + 1``, or -1 while it has none."""
        self.labels: list[str | None] = [None] * n_words
        """``labels[i]`` is the relation given with word ``i + 1``'s head."""

    @property
    def buffer(self) -> list[int]:
        """The buffer, first item first; it always ends with the root.

        Returns:
            A new list ``[next, ..., n, 0]``.

        Example:
            >>> ArcHybrid(3).buffer
            [1, 2, 3, 0]
        """
        return [*range(self.next, self.n_words + 1), ROOT]

    @property
    def b0(self) -> int:
        """The first buffer item (the root when no word is left).

        Returns:
            A word number, or :data:`ROOT`.

        Example:
            >>> ArcHybrid(0).b0
            0
        """
        return self.next if self.next <= self.n_words else ROOT

    @property
    def arcs(self) -> list[tuple[int, int, str | None]]:
        """The arcs built so far as ``(head, dependent, label)``, in order of dependents.

        Returns:
            A new list.

        Example:
            >>> ArcHybrid(1).arcs
            []
        """
        return [
            (head, dep, self.labels[dep - 1])
            for dep, head in enumerate(self.heads, start=1)
            if head >= 0
        ]

    def copy(self) -> ArcHybrid:
        """An independent copy of this configuration.

        Returns:
            A configuration with equal but separate stack and arcs.

        Example:
            >>> c = ArcHybrid(1)
            >>> d = c.copy(); d.apply(Action.SHIFT)
            >>> c.stack, d.stack
            ([], [1])
        """
        other = ArcHybrid.__new__(ArcHybrid)
        other.n_words = self.n_words
        other.stack = list(self.stack)
        other.next = self.next
        other.heads = list(self.heads)
        other.labels = list(self.labels)
        return other

    def is_terminal(self) -> bool:
        """Whether parsing is over: the stack is empty and only the root is in the buffer.

        Returns:
            ``True`` for a terminal configuration.

        Example:
            >>> ArcHybrid(0).is_terminal(), ArcHybrid(1).is_terminal()
            (True, False)
        """
        return not self.stack and self.next > self.n_words

    def is_legal(self, action: Action) -> bool:
        """Whether ``action`` can be applied now.

        SHIFT needs a word (not the root) at the front of the buffer; LEFT_ARC needs a
        non-empty stack; RIGHT_ARC needs at least two items on the stack.

        Arguments:
            action: the transition.

        Returns:
            ``True`` when it is allowed.

        Example:
            >>> c = ArcHybrid(1)
            >>> [c.is_legal(a) for a in Action]
            [True, False, False]
        """
        if action is Action.SHIFT:
            return self.next <= self.n_words
        if action is Action.LEFT_ARC:
            return bool(self.stack)
        return len(self.stack) >= 2

    def legal_actions(self) -> list[Action]:
        """The actions allowed now, in the order SHIFT, LEFT_ARC, RIGHT_ARC.

        Returns:
            A list, empty only for a terminal configuration.

        Example:
            >>> ArcHybrid(1).legal_actions()
            [<Action.SHIFT: 0>]
        """
        return [a for a in Action if self.is_legal(a)]

    def apply(self, action: Action, label: str | None = None) -> None:
        """Apply a transition in place.

        Arguments:
            action: the transition.
            label: the relation of the new arc (ignored for SHIFT).

        Raises:
            ValueError: the action is not legal in this configuration.

        Example:
            >>> c = ArcHybrid(1); c.apply(Action.RIGHT_ARC)
            Traceback (most recent call last):
            ...
            ValueError: RIGHT_ARC is not legal here: expected at least 2 items on the stack, found 0
        """
        if not self.is_legal(action):
            needs = {
                Action.SHIFT: "a word at the front of the buffer, found only the root",
                Action.LEFT_ARC: "a non-empty stack, found an empty one",
                Action.RIGHT_ARC: f"at least 2 items on the stack, found {len(self.stack)}",
            }[action]
            raise ValueError(f"{action.name} is not legal here: expected {needs}")
        if action is Action.SHIFT:
            self.stack.append(self.next)
            self.next += 1
            return
        dep = self.stack.pop()
        head = self.b0 if action is Action.LEFT_ARC else self.stack[-1]
        self.heads[dep - 1] = head
        self.labels[dep - 1] = label

    def __repr__(self) -> str:
        return f"ArcHybrid(stack={self.stack}, buffer={self.buffer}, arcs={len(self.arcs)})"


def _gold_children_counts(heads: Sequence[int]) -> list[int]:
    counts = [0] * (len(heads) + 1)
    for head in heads:
        counts[head] += 1
    return counts


def oracle_transitions(sentence: Sentence) -> list[Transition]:
    """The static oracle: the arc-hybrid transitions that build a projective gold tree.

    At each step the oracle attaches the stack top with LEFT_ARC when its gold head is the
    first buffer item, or with RIGHT_ARC when it is the item below it on the stack, once the
    stack top has all its dependents; otherwise it shifts.

    Arguments:
        sentence: a sentence with a projective tree.

    Returns:
        ``(action, label)`` pairs; applying them to ``ArcHybrid(len(sentence))`` reproduces
        ``sentence.heads`` and ``sentence.deprels``. The label of SHIFT is ``None``.

    Raises:
        ValueError: the tree is not projective.

    Example:
        >>> s = Sentence(("I", "ran", "home"), ("PRON", "VERB", "ADV"), (2, 0, 2),
        ...              ("nsubj", "root", "advmod"))
        >>> [(a.name, l) for a, l in oracle_transitions(s)]  # doctest: +NORMALIZE_WHITESPACE
        [('SHIFT', None), ('LEFT_ARC', 'nsubj'), ('SHIFT', None), ('SHIFT', None),
         ('RIGHT_ARC', 'advmod'), ('LEFT_ARC', 'root')]
    """
    heads = sentence.heads
    if not is_projective(heads):
        raise ValueError(
            f"sentence {sentence.sent_id!r}: expected a projective tree for the arc-hybrid "
            "static oracle, found crossing arcs"
        )
    missing = _gold_children_counts(heads)  # dependents not attached yet, per word
    config = ArcHybrid(len(heads))
    transitions: list[Transition] = []
    while not config.is_terminal():
        action = Action.SHIFT
        if config.stack:
            s0 = config.stack[-1]
            head = heads[s0 - 1]
            if missing[s0] == 0:
                if head == config.b0:
                    action = Action.LEFT_ARC
                elif len(config.stack) >= 2 and head == config.stack[-2]:
                    action = Action.RIGHT_ARC
        if action is Action.SHIFT:
            transitions.append((action, None))
        else:
            label = sentence.deprels[config.stack[-1] - 1]
            missing[heads[config.stack[-1] - 1]] -= 1
            transitions.append((action, label))
        config.apply(*transitions[-1])
    return transitions


def action_cost(
    config: ArcHybrid,
    action: Action,
    gold_heads: Sequence[int],
    *,
    label: str | None = None,
    gold_labels: Sequence[str] | None = None,
) -> int:
    """The dynamic-oracle cost of an arc-hybrid action (Goldberg and Nivre 2013).

    The cost is the number of gold arcs that can still be built before the action and can no
    longer be built after it. With ``s0``, ``s1`` the two top stack items, ``b`` the first
    buffer item and ``B`` the whole buffer (root included):

    * LEFT_ARC loses the gold arcs from ``s0`` to words in ``B`` and ``s0``'s gold head
      when that is ``s1`` or in ``B`` other than ``b``;
    * RIGHT_ARC loses the gold arcs from ``s0`` to words in ``B`` and ``s0``'s gold head
      when that is in ``B``;
    * SHIFT loses the gold arcs between ``b`` and the stack, except an arc from ``s0`` to
      ``b``.

    For a projective gold tree this is exact (arc-hybrid is arc-decomposable): an action
    has cost 0 exactly when the best tree still reachable stays reachable. For a
    non-projective gold tree (see :func:`is_projective`) not all gold arcs can be built
    together, and the count, which looks at each arc on its own, is only an approximation.

    Arguments:
        config: the current configuration.
        action: a legal action.
        gold_heads: the gold head of each word (``gold_heads[i]`` for word ``i + 1``).
        label: the relation the action would give its arc.
        gold_labels: the gold relations; with ``label``, an arc with the right head but the
            wrong relation costs 1 more.

    Returns:
        The number of gold arcs lost, at least 0.

    Raises:
        ValueError: the action is illegal, or ``gold_heads`` does not have one head per word.

    Example:
        >>> c = ArcHybrid(2); c.apply(Action.SHIFT)  # stack [1], buffer [2, 0]
        >>> gold = [2, 0]
        >>> [action_cost(c, a, gold) for a in (Action.SHIFT, Action.LEFT_ARC)]
        [1, 0]
    """
    if len(gold_heads) != config.n_words:
        raise ValueError(
            f"expected {config.n_words} gold heads (one per word), found {len(gold_heads)}"
        )
    if not config.is_legal(action):
        raise ValueError(f"{action.name} is not legal in {config!r}")
    stack = config.stack
    first = config.next  # words first..n are in the buffer, followed by the root

    def in_buffer(item: int) -> bool:
        return item == ROOT or item >= first

    def buffer_dependents(head: int) -> int:
        return sum(1 for h in gold_heads[first - 1 :] if h == head)

    if action is Action.SHIFT:
        b = first
        gold = gold_heads[b - 1]
        cost = sum(1 for item in stack if gold_heads[item - 1] == b)
        if gold != ROOT and gold in stack[:-1]:
            cost += 1
        return cost
    s0 = stack[-1]
    gold = gold_heads[s0 - 1]
    cost = buffer_dependents(s0)
    if action is Action.LEFT_ARC:
        b = config.b0
        if gold != b and ((len(stack) >= 2 and gold == stack[-2]) or in_buffer(gold)):
            cost += 1
        attached_to = b
    else:
        if in_buffer(gold):
            cost += 1
        attached_to = stack[-2]
    if (
        gold == attached_to
        and label is not None
        and gold_labels is not None
        and label != gold_labels[s0 - 1]
    ):
        cost += 1
    return cost
