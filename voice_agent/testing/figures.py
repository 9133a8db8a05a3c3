"""The figures the benchmarks print: one percentile, one table.

Every benchmark takes its percentiles here, so a p95 means the same in
each of their reports (and in docs/measurements.md, which quotes them)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank: the value
    at position ``round(q / 100 * (n - 1))`` once sorted (Python's round,
    halves to even), always one of the values measured, never interpolated.
    IndexError when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def table(rows: Sequence[Sequence[object]], header: Sequence[object]) -> str:
    """A Markdown table, every column right-aligned to its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]

    def line(row: Sequence[object]) -> str:
        return "| " + " | ".join(str(x).rjust(w) for x, w in zip(row, widths, strict=False)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])
