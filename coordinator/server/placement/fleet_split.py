"""One fleet, several models: which workers each hosted model may place on. Pure, no IO.

A coordinator started with several `--model`s splits its workers between them, by the
models' order (the first is the default):

1. Each model in turn takes the workers its chain needs, chosen by placement itself
   (`chain_of`: a chain from these workers, or None when they cannot hold the model),
   from the workers no earlier model took. It tries first without the workers a later
   model's chain already uses, so a re-plan does not break another model's chain while
   free workers can do; only where those are not enough does an earlier model take
   them (the first model is served first).
2. The workers no chain needs are the fleet's spares, shared: they go to the first
   model's share (its spares, warm for its stages, and its further chains), and since
   the split is made again at every re-plan, whichever model loses a stage next takes
   its replacement from them.

A worker therefore serves one model's stage at a time, and each model's own placement
(`routes.plan_chains`) runs on its share only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = ["ChainOf", "split_fleet"]

ChainOf = Callable[[int, tuple[str, ...]], tuple[str, ...] | None]
"""(model index, the workers on offer) -> the workers its chain would use, or None."""


def split_fleet(
    workers: Sequence[str],
    models: int,
    chain_of: ChainOf,
    held: Mapping[str, int] | None = None,
) -> tuple[tuple[str, ...], ...]:
    """Each model's share of `workers` (in their order), one share per model: a chain's
    workers, and for the first model also every worker no chain took. `held`: worker ->
    the model whose chain it served in the last plan. A model no chain fits gets ()."""
    if models < 1:
        raise ValueError("at least one model")
    was = held or {}
    order = list(dict.fromkeys(workers))
    remaining = list(order)
    shares: list[list[str]] = []
    for m in range(models):
        later = {w for w in remaining if was.get(w, -1) > m}
        chain: tuple[str, ...] | None = None
        if later:
            chain = chain_of(m, tuple(w for w in remaining if w not in later))
        if chain is None:
            chain = chain_of(m, tuple(remaining))
        used = set(chain or ())
        shares.append([w for w in remaining if w in used])
        remaining = [w for w in remaining if w not in used]
    shares[0].extend(remaining)
    first = set(shares[0])
    return (tuple(w for w in order if w in first), *(tuple(s) for s in shares[1:]))
