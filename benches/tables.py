"""Markdown tables of repeated rate measurements, as the bench scripts print them."""

from __future__ import annotations

import statistics


def rate_table(rates: dict[str, list[float]], ref: str, unit: str = "batches/s") -> str:
    """One row per reader: the median, every run, and the median's ratio to ``ref``'s."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    rows = [f"| reader | {unit} (median) | runs | / {ref} |", "|---|---|---|---|"]
    for k, v in rates.items():
        runs = ", ".join(f"{r:.1f}" for r in v)
        rows.append(f"| {k} | {med[k]:.1f} | {runs} | {med[k] / med[ref]:.3f} |")
    return "\n".join(rows)
