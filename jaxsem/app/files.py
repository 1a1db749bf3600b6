"""The files the commands write: CSV tables and PNG figures, each written whole or not at all
(:func:`jaxsem.io.atomic_output`)."""

from __future__ import annotations

import csv
import io

from ..io import atomic_output

__all__ = ["write_csv", "save_figure"]


def write_csv(path: str, header, rows) -> str:
    """``rows`` (sequences of numbers) under the column names ``header``, ten significant digits."""
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(list(header))
    for r in rows:
        w.writerow([f"{v:.10g}" for v in r])
    with atomic_output(path, "output file") as fh:
        fh.write(text.getvalue().encode("utf-8"))
    return path


def save_figure(fig, path: str) -> str:
    """``fig`` as a PNG at ``path``, then closed."""
    import matplotlib.pyplot as plt

    try:
        with atomic_output(path, "output file") as fh:
            fig.savefig(fh, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
