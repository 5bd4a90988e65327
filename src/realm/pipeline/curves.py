"""The report's training curves: one PNG per trainer, a panel per metric, raw points faint behind their
exponential moving average."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from realm.common.io import write_atomic

CURVES = {  # trainer stage -> the metrics plotted, in panel order
    "ict": ("loss", "accuracy"),
    "realm": ("loss", "accuracy", "utility", "staleness_steps"),
    "read": ("loss", "train_em"),
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


def _draw(ax, steps: Sequence[int], values: Sequence[float], color: str, label: str) -> None:
    """A series as it is when it has a few points (e.g. dev EM once an epoch); else its raw points faint behind
    their EMA."""
    if len(values) < 10:
        ax.plot(steps, values, marker="o", linewidth=1.2, color=color, label=label)
        return
    ax.plot(steps, values, linewidth=0.6, alpha=0.25, color=color)
    ax.plot(steps, ema(values), linewidth=1.4, color=color, label=f"{label} (EMA {EMA_SPAN} logs)")


def _save(fig, axes, titles: Sequence[str], out: Path) -> Path:
    for ax, title in zip(axes, titles):
        ax.legend(fontsize=6)
        ax.set_title(title.replace("_", " "), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


def _figure(panels: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(3.6 * panels, 3.0), squeeze=False)
    return fig, axes[0]


def plot_curves(stage: str, rows: list[dict], out: Path) -> Path | None:
    """One PNG per trainer: a panel per metric against the step."""
    names = [m for m in CURVES[stage] if any(m in r for r in rows)]
    if not names:
        return None
    fig, axes = _figure(len(names))
    for ax, name in zip(axes, names):
        series = [(name, name)]
        if stage == "realm" and name == "accuracy" and any("null_accuracy" in r for r in rows):
            series.append(("null_accuracy", "null document only"))
        for color, (key, label) in enumerate(series):
            steps, values = zip(*[(r["step"], r[key]) for r in rows if key in r])
            _draw(ax, steps, values, f"C{color}", label)
    return _save(fig, axes, names, out)


def plot_runs(metrics: Sequence[str], runs: dict[str, list[dict]], out: Path) -> Path | None:
    """Several runs of one trainer on the same axes (the ablations' learning curves): a panel per metric, a
    colour per run."""
    names = [m for m in metrics if any(m in r for rows in runs.values() for r in rows)]
    if not names:
        return None
    fig, axes = _figure(len(names))
    for ax, name in zip(axes, names):
        for color, (run, rows) in enumerate(runs.items()):
            logged = [r for r in rows if name in r]
            if logged:
                _draw(ax, [r["step"] for r in logged], [r[name] for r in logged], f"C{color}", run)
    return _save(fig, axes, names, out)
