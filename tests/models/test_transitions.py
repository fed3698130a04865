from __future__ import annotations

import random
from functools import cache

import pytest

from batchfold.data.conllu import Sentence
from batchfold.models.transitions import Action, ArcHybrid, action_cost, oracle_transitions

# The same brute-force crossing check and random trees as in tests/data/test_conllu.py.


def crosses(heads: list[int] | tuple[int, ...], root_arc: bool = True) -> bool:
    spans = [(min(h, d), max(h, d)) for d, h in enumerate(heads, 1) if root_arc or h != 0]
    return any(a < c < b < d for a, b in spans for c, d in spans)


def random_tree(n: int, rng: random.Random) -> list[int]:
    order = list(range(1, n + 1))
    rng.shuffle(order)
    heads = [0] * n
    for i, w in enumerate(order[1:], start=1):
        heads[w - 1] = rng.choice(order[:i])
    return heads


def sentence(heads: list[int], labels: list[str] | None = None) -> Sentence:
    n = len(heads)
    deprels = labels or [f"r{i}" for i in range(1, n + 1)]
    return Sentence(
        tuple(f"w{i}" for i in range(1, n + 1)), ("X",) * n, tuple(heads), tuple(deprels)
    )


def rebuild(s: Sentence) -> ArcHybrid:
    config = ArcHybrid(len(s))
    for action, label in oracle_transitions(s):
        assert config.is_legal(action)
        config.apply(action, label)
    assert config.is_terminal()
    return config


def test_arc_hybrid_legality_and_errors() -> None:
    c = ArcHybrid(2)
    assert c.stack == [] and c.buffer == [1, 2, 0] and c.b0 == 1 and not c.is_terminal()
    assert c.legal_actions() == [Action.SHIFT]
    with pytest.raises(ValueError, match="LEFT_ARC is not legal here: expected a non-empty stack"):
        c.apply(Action.LEFT_ARC, "x")
    c.apply(Action.SHIFT)
    c.apply(Action.SHIFT)
    assert c.buffer == [0] and c.b0 == 0
    assert c.legal_actions() == [Action.LEFT_ARC, Action.RIGHT_ARC]
    with pytest.raises(ValueError, match="SHIFT is not legal here: expected a word at the front"):
        c.apply(Action.SHIFT)
    c.apply(Action.RIGHT_ARC, "obj")
    c.apply(Action.LEFT_ARC, "root")
    assert c.is_terminal() and c.legal_actions() == []
    assert c.arcs == [(0, 1, "root"), (1, 2, "obj")]
    with pytest.raises(ValueError, match="word count of at least 0"):
        ArcHybrid(-1)


def test_static_oracle_on_hand_made_trees() -> None:
    cases = [
        [0],
        [2, 0],
        [0, 1],
        [2, 0, 2],
        [0, 1, 2, 3],  # right-branching chain
        [2, 3, 4, 0],  # left-branching chain
        [3, 3, 0, 5, 3, 5],
        [0, 3, 1, 3, 1],
    ]
    for heads in cases:
        s = sentence(heads)
        config = rebuild(s)
        assert tuple(config.heads) == s.heads
        assert tuple(config.labels) == s.deprels
        transitions = oracle_transitions(s)
        assert len(transitions) == 2 * len(heads)
        assert all((label is None) == (a is Action.SHIFT) for a, label in transitions)


def test_static_oracle_rejects_non_projective_trees() -> None:
    with pytest.raises(ValueError, match="expected a projective tree"):
        oracle_transitions(sentence([3, 4, 0, 3]))
    with pytest.raises(ValueError, match="expected a projective tree"):
        oracle_transitions(sentence([3, 0, 2]))


def test_static_oracle_on_random_projective_trees() -> None:
    rng = random.Random(2)
    done = 0
    while done < 500:
        heads = random_tree(rng.randint(1, 12), rng)
        if crosses(heads):
            continue
        s = sentence(heads)
        assert tuple(rebuild(s).heads) == s.heads
        done += 1


def test_dynamic_oracle_agrees_with_static_oracle_and_flags_lost_arcs() -> None:
    # 1 <- 2 -> 3, 2 <- root: "I saw it"
    s = sentence([2, 0, 2], ["nsubj", "root", "obj"])
    gold = list(s.heads)
    config = ArcHybrid(3)
    for action, label in oracle_transitions(s):
        assert action_cost(config, action, gold, label=label, gold_labels=s.deprels) == 0
        config.apply(action, label)

    config = ArcHybrid(3)
    config.apply(Action.SHIFT)  # stack [1], buffer [2, 3, 0]
    assert action_cost(config, Action.LEFT_ARC, gold) == 0
    assert action_cost(config, Action.SHIFT, gold) == 1  # 1 could no longer get head 2
    assert action_cost(config, Action.LEFT_ARC, gold, label="obj", gold_labels=s.deprels) == 1
    config.apply(Action.LEFT_ARC, "nsubj")
    config.apply(Action.SHIFT)
    config.apply(Action.SHIFT)  # stack [2, 3], buffer [0]
    assert action_cost(config, Action.RIGHT_ARC, gold) == 0
    assert action_cost(config, Action.LEFT_ARC, gold) == 1  # 3 attached to the root, not 2

    config = ArcHybrid(3)
    config.apply(Action.SHIFT)
    config.apply(Action.SHIFT)  # stack [1, 2], buffer [3, 0]
    # RIGHT_ARC attaches 2 to 1 and loses 2 <- root and 2 -> 3
    assert action_cost(config, Action.RIGHT_ARC, gold) == 2
    with pytest.raises(ValueError, match="expected 3 gold heads"):
        action_cost(config, Action.SHIFT, [0])
    with pytest.raises(ValueError, match="RIGHT_ARC is not legal"):
        action_cost(ArcHybrid(3), Action.RIGHT_ARC, gold)


def exact_costs(n: int, gold: list[int]):
    """Brute force: the arcs an action makes unreachable, by search over all continuations."""

    @cache
    def best(stack: tuple[int, ...], nxt: int) -> int:
        config = make(stack, nxt)
        if config.is_terminal():
            return 0
        return max(gain(config, a) + best(*after(config, a)) for a in config.legal_actions())

    def make(stack: tuple[int, ...], nxt: int) -> ArcHybrid:
        config = ArcHybrid(n)
        config.stack, config.next = list(stack), nxt
        return config

    def gain(config: ArcHybrid, action: Action) -> int:
        if action is Action.SHIFT:
            return 0
        head = config.b0 if action is Action.LEFT_ARC else config.stack[-2]
        return int(gold[config.stack[-1] - 1] == head)

    def after(config: ArcHybrid, action: Action) -> tuple[tuple[int, ...], int]:
        nxt = config.copy()
        nxt.apply(action)
        return tuple(nxt.stack), nxt.next

    def cost(config: ArcHybrid, action: Action) -> int:
        now = best(tuple(config.stack), config.next)
        return now - gain(config, action) - best(*after(config, action))

    return cost


def test_dynamic_oracle_is_exact_on_projective_trees() -> None:
    rng = random.Random(3)
    checked = 0
    while checked < 3000:
        n = rng.randint(1, 7)
        gold = random_tree(n, rng)
        if crosses(gold):
            continue
        cost = exact_costs(n, gold)
        config = ArcHybrid(n)
        while not config.is_terminal():  # a random walk, mistakes included
            legal = config.legal_actions()
            for action in legal:
                assert action_cost(config, action, gold) == cost(config, action)
                checked += 1
            assert any(action_cost(config, a, gold) == 0 for a in legal)
            config.apply(rng.choice(legal))


# ----------------------------------------------------------------------------------------------
# The real UD English-EWT data (skipped when it is not on this machine: see the ewt fixture)


def test_real_static_oracle_rebuilds_every_projective_training_tree(
    ewt: dict[str, list[Sentence]],
) -> None:
    rebuilt = 0
    for s in ewt["train"]:
        if not s.is_projective:
            continue
        config = rebuild(s)
        assert tuple(config.heads) == s.heads, s.sent_id
        assert tuple(config.labels) == s.deprels, s.sent_id
        rebuilt += 1
    assert rebuilt == 12_544 - 288
