"""The report's training curves: one PNG per trainer, a panel per metric, raw points faint behind their
exponential moving average."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from realm.common.io import write_atomic

CURVES = {  # trainer stage -> the metrics plotted, in panel order
    "ict": ("loss", "accuracy"),
    "realm": ("loss", "accuracy", "utility", "staleness_steps"),
    "qa": ("loss", "train_em", "answer_in_top_k", "dev_em"),
}


EMA_SPAN = 20  # logged points the curves' moving average spans (batch-8 steps alone are mostly noise)


def ema(values: Sequence[float], span: int = EMA_SPAN) -> list[float]:
    """Exponential moving average with weight 2 / (span + 1), debiased so the first points are not pulled to 0."""
    alpha, average, weight, out = 2.0 / (span + 1), 0.0, 0.0, []
    for value in values:
        average = (1 - alpha) * average + alpha * value
        weight = (1 - alpha) * weight + alpha
        out.append(average / weight)
    return out


def plot_curves(stage: str, rows: list[dict], out: Path) -> Path | None:
    """One PNG per trainer: a panel per metric against the step, the raw points faint behind their EMA."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m for m in CURVES[stage] if any(m in r for r in rows)]
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.0), squeeze=False)
    for ax, name in zip(axes[0], names):
        series = [(name, name)]
        if stage == "realm" and name == "accuracy" and any("null_accuracy" in r for r in rows):
            series.append(("null_accuracy", "null document only"))
        for color, (key, label) in enumerate(series):
            steps, values = zip(*[(r["step"], r[key]) for r in rows if key in r])
            if len(values) < 10:  # a few points (e.g. dev EM once an epoch): as they are
                ax.plot(steps, values, marker="o", linewidth=1.2, color=f"C{color}", label=label)
                continue
            ax.plot(steps, values, linewidth=0.6, alpha=0.25, color=f"C{color}")  # the raw points, faint
            ax.plot(steps, ema(values), linewidth=1.4, color=f"C{color}", label=f"{label} (EMA {EMA_SPAN} logs)")
        ax.legend(fontsize=6)
        ax.set_title(name.replace("_", " "), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return out
