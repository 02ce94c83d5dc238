"""configs/demo.yaml's budget choices: what its verdicts are priced with, and which rows it leaves to make reproduce."""
import re
from pathlib import Path

import pytest

from specdraft.pipelines.config import load_config
from specdraft.pipelines.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
QUIET_REPORT = REPO / "benchmarks" / "pipeline" / "reproduce-2026-11-23" / "README.md"


def _quiet_calibration() -> dict[str, float]:
    """The calibration row of the kept make-reproduce report (this pair, a quiet box): c and v(K)."""
    lines = QUIET_REPORT.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| t_target 1 token (ms)"))
    header = [c.strip() for c in lines[at].strip("|").split("|")]
    values = [float(c) for c in lines[at + 2].strip("|").split("|")]
    return dict(zip(header, values))


def test_demo_prices_its_counts_with_the_pairs_quiet_calibration():
    """The counted verdicts must not move with the box's load, so the demo pins c and v(K); the pins are what
    this pair measured with the box to itself, not numbers chosen for a verdict."""
    demo = load_config(RunConfig, REPO / "configs" / "demo.yaml")
    pinned, quiet = demo.evaluate.counted_costs, _quiet_calibration()
    assert pinned is not None
    assert pinned.cost_ratio == pytest.approx(quiet["c = t_draft / t_target"], abs=0.003)
    vk = {int(m.group(1)): v for name, v in quiet.items() if (m := re.fullmatch(r"v\((\d+)\)", name))}
    assert set(vk) >= set(demo.evaluate.ks)
    for k, v in vk.items():
        assert 1 + pinned.verify_slope * k == pytest.approx(v, abs=0.005), k


def test_reproduce_runs_the_throughput_rows_the_demo_leaves_out():
    """The throughput rows (their cost table and batched decodes: 52 s of the demo's evaluate) are make reproduce's:
    every B up to 8 with at least 3 batches at the largest, fed every test prompt."""
    demo = load_config(RunConfig, REPO / "configs" / "demo.yaml")
    reproduce = load_config(RunConfig, REPO / "configs" / "reproduce.yaml")
    assert demo.evaluate.batch_sizes == []
    ev = reproduce.evaluate
    assert ev.batch_sizes == [1, 2, 4, 8] and ev.throughput_prompts is None and "test" in ev.sets
    assert ev.prompts_per_domain * len(reproduce.demo.domains) // max(ev.batch_sizes) >= 3
