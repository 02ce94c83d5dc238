"""benchmarks/real/bench_data_scaling.py: the rows of each scale (hand-made rows), and its families trained and judged on a tiny GGUF pair."""
import datasets
import pytest

from specdraft.drafters.teacher_signal import SignalFormat
from specdraft.pipelines.readers import TeacherData
from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_data_scaling")


def rows(prompts: int, temperatures=(0.0, 1.0), domains=("code", "math")) -> list[dict]:
    # distill-data's order: one temperature after another; prompt ids "<domain>/train/<index>"
    return [{"id": f"{d}/train/{i:06d}@t{t:g}", "prompt_id": f"{d}/train/{i:06d}", "domain": d, "temperature": t,
             "response_ids": [1, 2]} for t in temperatures for d in domains for i in range(prompts)]


def test_the_scales_are_nested_and_use_a_temperature_only_once_its_predecessor_is_spent(bench):
    data = rows(4)
    by_scale = {n: bench.scale_rows(data, [0.0, 1.0], n) for n in (1, 2, 4, 8)}
    for small, large in ((1, 2), (2, 4), (4, 8)):
        assert {r["id"] for r in by_scale[small]} < {r["id"] for r in by_scale[large]}
    assert {r["temperature"] for r in by_scale[4]} == {0.0}  # all 4 prompts a domain answered greedily first
    assert sorted(r["id"] for r in by_scale[2] if r["domain"] == "math") == ["math/train/000000@t0",
                                                                              "math/train/000001@t0"]
    assert sum(r["temperature"] == 1.0 for r in by_scale[8]) == 8  # then the T = 1 answers to the same prompts
    # the listed order decides, not the values: T = 1 first when distill-data listed it first
    assert {r["temperature"] for r in bench.scale_rows(data, [1.0, 0.0], 4)} == {1.0}


def test_a_scale_the_rows_cannot_fill_is_refused_in_one_line(bench):
    with pytest.raises(SystemExit, match="holds 8 code train rows, a scale needs 9"):
        bench.scale_rows(rows(4), [0.0, 1.0], 9)


def test_the_stored_signal_is_cut_to_the_scale_s_rows_and_a_missing_row_is_refused(bench):
    train = datasets.Dataset.from_list([{"id": r["id"], "domain": r["domain"]} for r in rows(3)])
    dev = datasets.Dataset.from_list([{"id": "code/dev/000000@t0", "domain": "code"}])
    stored = TeacherData(SignalFormat(top_k=4, vocab_size=10, max_length=16, feature_layers=None, feature_width=0), "hash", {"train": train, "dev": dev})
    chosen = bench.scale_rows(rows(3), [0.0, 1.0], 2)
    cut = bench.subset(stored, {r["id"] for r in chosen})
    assert sorted(cut.splits["train"]["id"]) == sorted(r["id"] for r in chosen)
    assert cut.splits["dev"]["id"] == ["code/dev/000000@t0"]  # the dev curve's rows stay whole
    with pytest.raises(SystemExit, match="rerun stage teacher-data"):
        bench.subset(stored, {"code/train/000009@t0"})


def test_eagle3_extra_adds_the_references_of_the_scale_s_prompts_only(bench, tmp_path):
    """--families eagle3-extra: the reference rows teacher-data stored for the prompts a scale answers (not every
    reference it holds), in a work dir named by them; none stored is refused in one line."""
    data = rows(3, temperatures=(0.0,))
    refs = [{"id": f"reference:{r['prompt_id']}", "domain": r["domain"], "source": "reference"} for r in data]
    train = datasets.Dataset.from_list([{"id": r["id"], "domain": r["domain"], "source": "distilled"} for r in data]
                                       + refs)
    stored = TeacherData(SignalFormat(top_k=4, vocab_size=10, max_length=16, feature_layers=None, feature_width=0),
                         "hash", {"train": train})
    small, large = bench.scale_rows(data, [0.0], 1), bench.scale_rows(data, [0.0], 2)
    assert bench.reference_ids(stored, small) == ["reference:code/train/000000", "reference:math/train/000000"]
    assert len(bench.reference_ids(stored, large)) == 4
    cut = bench.subset(stored, {r["id"] for r in small} | set(bench.reference_ids(stored, small)))
    assert sorted(cut.splits["train"]["source"]) == ["distilled", "distilled", "reference", "reference"]
    assert bench.extra_dir(tmp_path, bench.reference_ids(stored, small)) != \
        bench.extra_dir(tmp_path, bench.reference_ids(stored, large))
    answers_only = TeacherData(stored.format, "hash", {"train": train.select(range(len(data)))})
    with pytest.raises(SystemExit, match=r"teacher_data.extra=\[reference\]"):
        bench.reference_ids(answers_only, small)


def test_overrides_after_run_change_the_config_s_recipe_and_a_wrong_key_is_refused(bench, tmp_path):
    from pathlib import Path

    from specdraft.core.errors import InputError

    config = str(Path(__file__).resolve().parents[2] / "configs" / "real.yaml")
    args = bench.build_parser().parse_args([str(tmp_path), "train_drafters.eagle.ttt_steps=7", "--config", config])
    assert bench.run_config(args).train_drafters.eagle.ttt_steps == 7
    assert bench.run_config(bench.build_parser().parse_args([str(tmp_path), "--config", config])
                            ).train_drafters.eagle.ttt_steps == 3
    with pytest.raises(InputError, match="ttt_step"):
        bench.run_config(bench.build_parser().parse_args([str(tmp_path), "train_drafters.eagle.ttt_step=7",
                                                          "--config", config]))


def test_a_point_s_work_dir_is_named_by_its_target_rows_and_training(bench, tmp_path):
    """A rerun resumes a point only from drafters made of the same inputs: other rows, other passes or another
    target name another work dir (before, a dir named by the scale alone was reused whatever made it)."""
    import dataclasses

    from specdraft.pipelines.schema import RunConfig

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    cfg = RunConfig()
    data = rows(4)
    key = bench.point_key(cfg, bench.scale_rows(data, [0.0, 1.0], 2), target)
    assert key == bench.point_key(cfg, bench.scale_rows(data, [0.0, 1.0], 2), target)
    assert key != bench.point_key(cfg, bench.scale_rows(data, [0.0, 1.0], 3), target)
    more = dataclasses.replace(cfg, train_drafters=dataclasses.replace(cfg.train_drafters, eagle=dataclasses.replace(
        cfg.train_drafters.eagle, lr=1e-2)))
    assert key != bench.point_key(more, bench.scale_rows(data, [0.0, 1.0], 2), target)
    (target / "config.json").write_text('{"hidden_size": 8}')
    assert key != bench.point_key(cfg, bench.scale_rows(data, [0.0, 1.0], 2), target)


# --------------------------------------------------------------------------- specialists from a sibling (the pair's)

from tests.pipelines.test_gguf_source import distilled, init_config, pair  # noqa: E402,F401  (module fixtures)


def test_specialists_from_the_init_are_judged_beside_it_in_domain_and_resumed(bench, pair, distilled, tmp_path):  # noqa: F811
    """--families specialists: one drafter a domain, each the config's init_from finetuned on its domain's rows of
    the scale, judged on its own domain's prompts beside the untouched init (the 0x row, paired); a rerun trains
    nothing again and reports the first run's seconds."""
    import json
    import shutil

    import yaml

    from specdraft.pipelines.config import to_dict

    root = tmp_path / "run"
    shutil.copytree(distilled, root)
    config = tmp_path / "pair.yaml"
    config.write_text(yaml.safe_dump(to_dict(init_config(root, pair))))
    page, argv = tmp_path / "RESULTS.md", [str(root), "--config", str(config), "--scales", "1,2", "--unit", "2",
                                           "--families", "specialists", "--tokens", "6"]
    assert bench.main([*argv, "--page", str(page), "--section", "bench_data_scaling.py (pair)",
                       "--plot", "pair.png"]) == 0
    text = page.read_text()
    assert "<!-- bench_data_scaling.py (pair) -->" in text and (tmp_path / "pair.png").is_file()
    assert "| 0x (the init, untouched) |" in text and "In domain:" in text
    works = sorted((root / "bench_data_scaling").glob("*-a-domain-*"))
    assert [w.name.split("-")[0] for w in works] == ["2", "4"]
    for w in works:
        assert sorted(p.name for p in w.iterdir() if (p / "model").is_dir()) == ["math", "translate"]
    first = json.loads((works[0] / "training.json").read_text())["specialists"]
    assert first is not None  # the fits' seconds (a tiny fit may round to 0.0)
    stamp = (works[0] / "math" / "model" / "model.safetensors").stat().st_mtime_ns
    bench.main([*argv, "--no-append"])
    assert (works[0] / "math" / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((works[0] / "training.json").read_text())["specialists"] == first


def test_specialists_need_a_config_that_names_their_init(bench, tmp_path):
    from specdraft.pipelines.schema import RunConfig

    with pytest.raises(SystemExit, match="init_from"):
        bench.init_dir(RunConfig(), tmp_path)


# --------------------------------------------------------------------------- the independent drafter's loss


def test_the_loss_families_train_from_one_start_on_the_stored_rows_and_only_the_loss_differs(bench, pair, distilled,  # noqa: F811
                                                                                             tmp_path, capsys):
    """--families independent-ce,independent-fkl,independent-tvd: the general phase's drafter, start and recipe,
    trained by the finetune phase on teacher-data's rows with each loss; a rerun trains nothing again; and a
    sampled judge (--temperature 1) gives the same counts twice (its generators are seeded)."""
    import json
    import shutil

    import torch
    import yaml
    from safetensors.torch import load_file

    from specdraft.pipelines.config import to_dict
    from specdraft.pipelines.stage import run_stage
    from tests.pipelines.test_gguf_source import OFF, pair_config

    root = tmp_path / "run"
    shutil.copytree(distilled, root)
    phase = {"lr": 1e-2, "max_length": 128, "train": {"max_epochs": 1, "batch_size": 4, **OFF}}
    cfg = pair_config(root, pair, train_drafters={"general": phase, "finetune": {**phase, "loss": "fkl"}})
    run_stage(cfg, "teacher-data")  # fkl in the finetune phase: the stage stores the target's top-k
    config = tmp_path / "losses.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    families = ["independent-ce", "independent-fkl", "independent-tvd"]
    argv = [str(root), "--config", str(config), "--scales", "1", "--unit", "2", "--families", ",".join(families),
            "--independent-epochs", "2", "--tokens", "6"]
    page = tmp_path / "RESULTS.md"
    assert bench.main([*argv, "--page", str(page), "--section", "bench_data_scaling.py (losses)", "--plot", ""]) == 0
    text = page.read_text()
    assert all(f"| independent, {name} MAT |" in text for name in ("CE", "forward KL", "TVD")), text
    assert "top-" in text and "greedy" in text
    (work,) = (root / "bench_data_scaling").glob("2-a-domain-*")
    assert sorted(p.name for p in work.iterdir() if p.is_dir()) == sorted([*families, "untrained"])
    info = {f: json.loads((work / f / "ofa" / "model" / "drafter.json").read_text()) for f in families}
    assert [info[f]["loss"] for f in families] == ["ce", "fkl", "tvd"]
    assert {info[f]["finetune"]["steps"] for f in families} == {2}  # 4 rows, batch 4, 2 passes: the same steps
    weights = {f: load_file(work / f / "ofa" / "model" / "model.safetensors") for f in families}
    start = load_file(work / "untrained" / "base" / "model" / "model.safetensors")
    key = next(k for k in start if "layers.0.mlp" in k)
    assert all(not torch.equal(weights[f][key], start[key]) for f in families)  # each trained from it ...
    assert not torch.equal(weights["independent-ce"][key], weights["independent-fkl"][key])  # ... to its own loss
    assert not torch.equal(weights["independent-fkl"][key], weights["independent-tvd"][key])
    seconds = json.loads((work / "training.json").read_text())
    assert all(seconds[f] is not None for f in families)
    stamp = (work / "independent-tvd" / "ofa" / "model" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    sampled = []
    for _ in range(2):
        bench.main([*argv, "--temperature", "1", "--no-append"])
        out = capsys.readouterr().out
        assert "sampled at T = 1" in out
        sampled.append([line for line in out.splitlines() if line.startswith("| 1x")])
    assert sampled[0] == sampled[1] and sampled[0]
    assert (work / "independent-tvd" / "ofa" / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((work / "training.json").read_text()) == seconds
