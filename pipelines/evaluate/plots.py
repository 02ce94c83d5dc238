"""The evaluation report's plots, from the metrics dict alone:
  pareto.png           discard rate vs verification rate (SpecDec++ Figure 3 style)
  speedup.png          counted and timed speedup per domain x method with 90% intervals (test set, greedy)
  best_arm_ratio.png   fraction of prompts whose bandit picked the hindsight-best drafter, per round
  robustness.png       counted speedup on in-domain / perturbed / OOD prompts per method, with intervals
  regret.png           stopping-time regret per domain x bandit (MetaSD Definition 1)
and cascades' quality against latency where the run has them.
"""
from __future__ import annotations

from pathlib import Path

from specdraft.decoding.cascades import DISPLAY_NAMES as CASCADE_NAMES
from specdraft.pipelines.evaluate.aggregate import method_keys, one, select, set_domains
from specdraft.pipelines.evaluate.cells import SET_NAMES, decoded_sets
from specdraft.pipelines.evaluate.methods import label


PLOTS = ("pareto.png", "speedup.png", "best_arm_ratio.png", "robustness.png", "regret.png")


def write_plots(metrics: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # SpecDec++ Figure 3 style: each policy is a point (discard rate, verification rate); lower-left is cheaper
    fig, ax = plt.subplots(figsize=(6, 4.5))
    markers = {"fixed": "o", "specdecpp": "*", "oracle": "s"}
    for fam, marker in markers.items():
        rows = select(metrics, mode="greedy", set="test", domain="all", family=fam)
        if rows:
            ax.scatter([r["discard_rate"] for r in rows], [r["verification_rate"] for r in rows], marker=marker,
                       s=80 if fam == "specdecpp" else 30, label={"fixed": "fixed K", "specdecpp": "SpecDec++",
                                                                    "oracle": "oracle"}[fam])
            for r in rows:
                ax.annotate(label(r), (r["discard_rate"], r["verification_rate"]), fontsize=6)
    ax.set_xlabel("discard rate (N_discarded / N)")
    ax.set_ylabel("verification rate (N_target / N)")
    ax.set_title("stopping policies, test set, greedy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)

    # counted and timed speedup per domain x method, each bar with its 90% interval over prompts
    k = metrics["k"]
    keys = [key for key in method_keys(metrics, ("fixed", "specdecpp", "router", "bandit"), mode="greedy", set="test")
            if key["k"] in (k, None)]
    domains = set_domains(metrics, "test")
    cells = [[one(metrics, set="test", domain=d, **key) or {} for d in domains] for key in keys]
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 0.12 * len(keys) * max(1, len(domains))), 8))
    for ax, name in zip(axes, ("counted_speedup", "speedup")):
        _grouped_bars(ax, plt, [label(key) for key in keys], domains,
                      [[c.get(name) or 0.0 for c in row] for row in cells],
                      f"{'counted' if name.startswith('counted') else 'timed'} speedup over autoregressive",
                      ref=1.0, errors=[[_err(c, name) for c in row] for row in cells])
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in metrics["best_arm_ratio"]:
        ax.plot(range(1, len(v["ratio"]) + 1), v["ratio"], label=label(v["key"]))
    if not metrics["best_arm_ratio"]:
        ax.text(0.5, 0.5, "no bandit runs (see the report's notes)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("round")
    ax.set_ylabel("best-arm ratio")
    ax.set_ylim(0, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "best_arm_ratio.png", dpi=110)
    plt.close(fig)

    sets = [(s, SET_NAMES[s]) for s in decoded_sets(metrics)]
    heads = metrics["headline"]
    fig, ax = plt.subplots(figsize=(max(6, 0.12 * len(heads) * 3), 4.5))
    _grouped_bars(ax, plt, [label(h["key"]) for h in heads], [name for _, name in sets],
                  [[h.get(f"{s}_counted_speedup") or 0.0 for s, _ in sets] for h in heads],
                  "counted speedup (all domains pooled)", ref=1.0,
                  errors=[[_err({"v": h.get(f"{s}_counted_speedup"), "v_lo": h.get(f"{s}_counted_speedup_lo"),
                                 "v_hi": h.get(f"{s}_counted_speedup_hi")}, "v") for s, _ in sets] for h in heads])
    fig.tight_layout()
    fig.savefig(out / "robustness.png", dpi=110)
    plt.close(fig)
    regret = metrics.get("stopping_regret") or []
    domains = [d for d in set_domains(metrics, "test") if any(d in v["per_domain"] for v in regret)]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    _grouped_bars(ax, plt, [label(v["key"]) for v in regret], domains,
                  [[v["per_domain"].get(d) or 0.0 for d in domains] for v in regret],
                  "stopping-time regret (rounds per prompt)", ref=0.0)
    fig.tight_layout()
    fig.savefig(out / "regret.png", dpi=110)
    plt.close(fig)
    verdicts = metrics.get("verdicts") or {}
    if verdicts.get("cascades"):
        _cascades_plot(plt, verdicts["cascades"], verdicts.get("quality_gap"), out / "cascades.png")


def _cascades_plot(plt, v: dict, gap: dict | None, path: Path) -> None:
    """Faster Cascades Figure 2: per scored domain, quality vs counted latency relative to the target sampling
    alone (1 / counted speedup), one line per rule over its alphas (annotated), the target at (1, its quality)
    and, where evaluate.drafter_quality ran, each drafter's greedy quality alone as a dotted line."""
    domains = list(v["per_domain"])
    fig, axes = plt.subplots(1, len(domains), figsize=(4.6 * len(domains), 4.2), squeeze=False)
    for ax, d in zip(axes[0], domains):
        e = v["per_domain"][d]
        for rule in v["rules"]:
            pts = sorted((p for p in e["points"] if p["rule"] == rule and p["counted"]), key=lambda p: p["alpha"])
            if not pts:
                continue
            xs, ys = [1.0 / p["counted"]["ratio"] for p in pts], [p["quality"] for p in pts]
            ax.plot(xs, ys, marker="o", ms=4, label=CASCADE_NAMES.get(rule, rule))
            for p, x, y in zip(pts, xs, ys):
                ax.annotate(f"{p['alpha']:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.scatter([1.0], [e["target_quality"]], marker="*", s=120, color="black", zorder=5, label="target (sampled)")
        for name, q in (((gap or {}).get("per_domain", {}).get(d) or {}).get("drafters") or {}).items():
            ax.axhline(q["mean"], ls=":", lw=1, color="grey")
            ax.annotate(f"{name} alone (greedy)", (ax.get_xlim()[0], q["mean"]), fontsize=6, color="grey")
        ax.set_title(d)
        ax.set_xlabel("counted latency relative to the target (1 / speedup)")
        ax.set_ylabel("quality (0-100)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _err(cell: dict, name: str) -> tuple[float, float]:
    """(below, above) the median: the error bar of its 90% interval (0, 0 where there is none)."""
    if not cell or cell.get(name) is None or cell.get(name + "_lo") is None:
        return 0.0, 0.0
    return max(0.0, cell[name] - cell[name + "_lo"]), max(0.0, cell[name + "_hi"] - cell[name])


def _grouped_bars(ax, plt, series: list[str], groups: list[str], values: list[list[float]], ylabel: str,
                  ref: float, errors: list[list[tuple[float, float]]] | None = None) -> None:
    """One bar per series in each group (values[series][group]), with error bars where given; an empty
    axis says there is nothing."""
    width = 0.8 / max(1, len(series))
    for j, (name, vals) in enumerate(zip(series, values)):
        yerr = None
        if errors is not None:
            yerr = [[e[0] for e in errors[j]], [e[1] for e in errors[j]]]
        ax.bar([i + j * width for i in range(len(groups))], vals, width, label=name, color=plt.cm.tab20(j % 20),
               yerr=yerr, capsize=1.5, error_kw={"elinewidth": 0.6})
    if not series or not groups:
        ax.text(0.5, 0.5, "nothing measured (see the report's notes)", ha="center", va="center",
                transform=ax.transAxes)
    ax.axhline(ref, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    if series:
        ax.legend(fontsize=6, ncol=2)
