"""``shm sim --plot FILE.png``: what a person wants to see of a comparison, on one page.

Three panels: scheduled requests per second per host manager; decision and
end-to-end latency (p50 and p99, log scale); the cumulative distribution of
view staleness (how far behind the sources each scheduler's view was when
sampled).  Uses matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

from typing import Any

COLORS = {"shared": "#2a7ab9", "legacy": "#c0504d", "caching": "#9bbb59"}


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    results = report["results"]
    names = list(results)
    colors = [COLORS.get(n, "#777777") for n in names]
    cfg = report["config"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    fig.suptitle(f"shm sim: {cfg['nodes']} nodes, {cfg['schedulers']} schedulers, "
                 f"{cfg['clients']} clients, seed {cfg['seed']}")

    rates = [results[n]["scheduled_per_s"] for n in names]
    bars = ax1.bar(names, rates, color=colors)
    ax1.bar_label(bars, labels=[f"{r:.1f}" for r in rates])
    ax1.set_title("scheduled requests per second")
    ax1.set_ylabel("requests/s")

    x = np.arange(len(names))
    width = 0.2
    series = [("decision p50", "decision_ms_p50"), ("decision p99", "decision_ms_p99"),
              ("end-to-end p50", "e2e_ms_p50"), ("end-to-end p99", "e2e_ms_p99")]
    for i, (label, key) in enumerate(series):
        values = [results[n][key] or 0.0 for n in names]
        ax2.bar(x + (i - 1.5) * width, values, width, label=label)
    ax2.set_xticks(x, names)
    ax2.set_yscale("log")
    ax2.set_ylabel("ms (log)")
    ax2.set_title("latency")
    ax2.legend(fontsize=8)

    for n, color in zip(names, colors, strict=True):
        samples = sorted(1000 * s for s in results[n].get("_staleness_s", []))
        if not samples:
            continue
        ys = np.arange(1, len(samples) + 1) / len(samples)
        ax3.plot([max(s, 0.01) for s in samples], ys, label=n, color=color)
    ax3.set_xscale("log")
    ax3.set_xlabel("staleness, ms (log; 0 shown as 0.01)")
    ax3.set_ylabel("fraction of samples")
    ax3.set_title("view staleness CDF")
    ax3.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
