"""The figures of the side-by-side benchmarks (`--plot FILE.png` of the comparison scripts,
`make bench` for docs/img): one place for the chart kinds they share, so every figure reads
the same way.

- `bars`: a grouped bar chart, one group per size (or configuration), one bar per
  contender; contenders that were not measured in a group leave a gap.
- `distributions`: latency distributions as percentile curves (x: latency, y: the
  percentile), one curve per contender, from the quantiles a script recorded.

`save` writes the PNG and records in it (a PNG text chunk, "tensorwire-series") the title,
series and groups of every panel as drawn, read back from the figure's artists, so a test
can check what a figure shows without comparing pixels.

matplotlib is a benchmark dependency only (scripts/install-deps.sh, pyproject's `test`
extra); it is imported when a figure is drawn, never by tensorwire itself.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

SERIES_KEY = "tensorwire-series"

# One colour per contender, the same in every figure.
COLOURS = {"tensorwire": "#1f77b4", "tensordict": "#ff7f0e", "torchrl_shm": "#2ca02c",
           "torchrl_mp": "#d62728", "tensorpack": "#9467bd", "ucx_perftest": "#7f7f7f"}
_FALLBACK = ["#17becf", "#8c564b", "#e377c2", "#bcbd22", "#aec7e8", "#ffbb78"]


def _colours(names) -> list[str]:
    """The contender's colour for its first series; later variants of the same contender
    (another mode or transport) and unknown names take the next free colour."""
    used, out, spare = set(), [], iter(_FALLBACK * 4)
    for name in names:
        colour = next((c for key, c in COLOURS.items() if name == key or name.startswith(key + " ")), None)
        if colour is None or colour in used:
            colour = next(spare)
        used.add(colour)
        out.append(colour)
    return out


def figure(ncols: int, title: str):
    """A figure of `ncols` panels side by side; returns (figure, list of axes)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, ncols, figsize=(6.2 * ncols, 4.4), squeeze=False)
    fig.suptitle(title)
    return fig, list(axes[0])


def bars(ax, title: str, groups: Sequence[str], series: Mapping[str, Sequence[float | None]],
         ylabel: str, log: bool = False) -> None:
    """Grouped bars: `series[name][i]` is the value of contender `name` in `groups[i]`
    (None or NaN: not measured there)."""
    n = max(len(series), 1)
    width = 0.8 / n
    colours = _colours(series)
    for k, (name, values) in enumerate(series.items()):
        if len(values) != len(groups):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(groups)} groups")
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(groups))]
        ys = [float("nan") if v is None else float(v) for v in values]
        ax.bar(xs, ys, width, label=name, color=colours[k])
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")


def distributions(ax, title: str, curves: Mapping[str, Sequence[float]], xlabel: str) -> None:
    """Percentile curves: `curves[name]` holds the latencies at evenly spaced percentiles
    from 0 to 100 (at least two values; `quantiles` computes them)."""
    colours = _colours(curves)
    for k, (name, qs) in enumerate(curves.items()):
        if len(qs) < 2:
            raise ValueError(f"distribution {name!r} needs at least two quantiles, got {len(qs)}")
        ps = [100 * i / (len(qs) - 1) for i in range(len(qs))]
        ax.plot(qs, ps, label=name, color=colours[k])
    ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("percentile")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def note(ax, title: str, text: str) -> None:
    """A panel that says why it has no data (a reference that is not installed, say)."""
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_axis_off()


def quantiles(samples: Sequence[float], n: int = 101) -> list[float]:
    """`n` evenly spaced quantiles (0th to 100th percentile) of `samples`, nearest rank."""
    s = sorted(samples)
    if not s:
        raise ValueError("no samples")
    return [s[min(len(s) - 1, math.floor(i * (len(s) - 1) / (n - 1) + 0.5))] for i in range(n)]


def drawn(fig) -> list[dict]:
    """What each panel of `fig` shows: its title, its legend's series, its groups (x tick
    labels) and any note, read from the artists."""
    panels = []
    for ax in fig.axes:
        legend = ax.get_legend()
        panels.append({
            "title": ax.get_title(),
            "series": [t.get_text() for t in legend.get_texts()] if legend else [],
            # the x tick labels of a bar chart: its groups (a curve's axis has numbers)
            "groups": [t.get_text() for t in ax.get_xticklabels()] if ax.containers else [],
            "note": " ".join(t.get_text() for t in ax.texts),
        })
    return panels


def save(fig, path: str) -> None:
    """Writes `fig` as a PNG at `path`, with what it shows in its "tensorwire-series" text chunk."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100, metadata={SERIES_KEY: json.dumps(drawn(fig))})
    plt.close(fig)
    print(f"figure written to {path}")
