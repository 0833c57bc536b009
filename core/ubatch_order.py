"""The order in which llama.cpp computes a batch's rows when each sequence has a KV
stream of its own, so captured hidden states can be put back in the batch's order.

With one stream per sequence, llama.cpp cuts a batch into micro-batches with
`llama_batch_allocr::split_equal(n_ubatch, sequential=true)`: each micro-batch takes a
run of consecutive sequence ids (the first unused row's sequence, then id + 1, id + 2,
... in the order rows are met), the same number of rows from each, and lays them out
sequence by sequence. Logits come back in the batch's order (llama.cpp reorders its
outputs), but an eval callback sees each micro-batch's rows as computed: this module
says which batch row each computed row is. Mirrors llama.cpp's `split_equal` without
`n_keep_tail` (plain and sliding-window KV caches); hybrid memory is never batched
across sequences (core/stage.py).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ubatch_order"]


def ubatch_order(seq_ids: Sequence[int], n_ubatch: int) -> list[int]:
    """Batch row indices in the order llama.cpp computes them (one sequence per row)."""
    n = len(seq_ids)
    if n_ubatch < 1:
        raise ValueError("n_ubatch must be >= 1")
    rows_of: dict[int, list[int]] = {}
    for i, seq in enumerate(seq_ids):
        rows_of.setdefault(seq, []).append(i)
    used = [False] * n
    order: list[int] = []
    while len(order) < n:
        run: list[int] = []
        for i in range(n):
            seq = seq_ids[i]
            if used[i] or seq in run:
                continue
            if run and seq != run[-1] + 1:
                continue
            run.append(seq)
        next_row = {seq: 0 for seq in run}
        for seq in run:
            while used[rows_of[seq][next_row[seq]]]:
                next_row[seq] += 1
        taken: dict[int, list[int]] = {seq: [] for seq in run}
        while all(next_row[seq] < len(rows_of[seq]) for seq in run):
            for seq in run:
                row = rows_of[seq][next_row[seq]]
                taken[seq].append(row)
                used[row] = True
                next_row[seq] += 1
            if (len(taken[run[0]]) + 1) * len(run) > n_ubatch:
                break
        for seq in run:
            order.extend(taken[seq])
    return order
