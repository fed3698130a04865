"""Attachment scores of a dependency parser: UAS and LAS over a corpus."""

from __future__ import annotations

from collections.abc import Sequence

from batchfold.data.conllu import Sentence, base_relation

__all__ = ["attachment_scores"]


def attachment_scores(
    pred_heads: Sequence[Sequence[int]],
    pred_labels: Sequence[Sequence[str | None]],
    gold: Sequence[Sentence],
    *,
    subtypes: bool = True,
) -> tuple[float, float]:
    """Unlabelled and labelled attachment scores over a corpus, micro-averaged over words.

    Every word counts, punctuation included. UAS is the share of words with the right head;
    LAS the share with the right head and the right relation. Relations are compared in full
    (``nmod:poss`` differs from ``nmod``) unless ``subtypes`` is ``False``.

    Arguments:
        pred_heads: predicted heads, one sequence per sentence.
        pred_labels: predicted relations, one sequence per sentence.
        gold: the gold sentences.
        subtypes: compare relation subtypes too.

    Returns:
        ``(uas, las)``, fractions in ``[0, 1]``.

    Raises:
        ValueError: the numbers of sentences or of words differ, or there are no words.

    Example:
        >>> g = Sentence(("I", "ran", "home"), ("PRON", "VERB", "ADV"), (2, 0, 2),
        ...              ("nsubj", "root", "obj"))
        >>> attachment_scores([(2, 0, 2)], [("nsubj", "root", "advmod")], [g])
        (1.0, 0.6666666666666666)
    """
    if not len(pred_heads) == len(pred_labels) == len(gold):
        raise ValueError(
            f"expected as many predicted head and label sequences as gold sentences "
            f"({len(gold)}), found {len(pred_heads)} and {len(pred_labels)}"
        )
    total = right_heads = right_both = 0
    for k, (heads, labels, sentence) in enumerate(zip(pred_heads, pred_labels, gold, strict=True)):
        n = len(sentence)
        if len(heads) != n or len(labels) != n:
            raise ValueError(
                f"sentence {k} ({sentence.sent_id!r}): expected {n} predicted heads and "
                f"labels, found {len(heads)} and {len(labels)}"
            )
        total += n
        for head, label, gold_head, gold_label in zip(
            heads, labels, sentence.heads, sentence.deprels, strict=True
        ):
            if head != gold_head:
                continue
            right_heads += 1
            if label is not None and (
                label == gold_label
                if subtypes
                else base_relation(label) == base_relation(gold_label)
            ):
                right_both += 1
    if total == 0:
        raise ValueError("expected at least one word to score, found none")
    return right_heads / total, right_both / total
