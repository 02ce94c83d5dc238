import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.core.errors import InputError
from specdraft.pipelines.cli import main
from specdraft.pipelines.config import ConfigError, apply_overrides, from_dict, load_config
from specdraft.pipelines.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_parses(path):
    cfg = load_config(RunConfig, path)
    assert isinstance(cfg, RunConfig)


def test_unknown_key_names_key_and_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'pretrain_target\.seq_lne'; did you mean 'pretrain_target\.seq_len'"):
        from_dict(RunConfig, {"pretrain_target": {"seq_lne": 12}})


def test_a_moved_section_says_where_it_went():
    """train-heads and export both read the decoder's defaults: they left export for a section of their own."""
    with pytest.raises(ConfigError, match=r"'export\.decoding' is now the top-level section 'decoding'; move it there"):
        from_dict(RunConfig, {"export": {"decoding": {"k": 3}}})
    assert from_dict(RunConfig, {"decoding": {"k": 3}}).decoding.k == 3


def test_wrong_type_names_field():
    with pytest.raises(ConfigError, match=r"'pretrain_target\.train\.max_steps' has the wrong type"):
        from_dict(RunConfig, {"pretrain_target": {"train": {"max_steps": "many"}}})
    with pytest.raises(ConfigError, match=r"'run\.seed' has the wrong type"):
        from_dict(RunConfig, {"run": {"seed": True}})


def test_literal_choices_and_impossible_values():
    with pytest.raises(ConfigError, match="target.quantization"):
        from_dict(RunConfig, {"target": {"quantization": "int4"}})
    with pytest.raises(Exception, match="demo.train_per_domain must be >= 1"):
        from_dict(RunConfig, {"demo": {"train_per_domain": 0}})
    with pytest.raises(Exception, match="label_transforms must list distinct transforms"):
        from_dict(RunConfig, {"acceptance_data": {"label_transforms": [{"temperature": 0.0}, {"temperature": 0.0, "top_k": 5}]}})
    with pytest.raises(Exception, match="temperature must be >= 0"):
        from_dict(RunConfig, {"acceptance_data": {"label_transforms": [{"temperature": -1.0}]}})
    with pytest.raises(Exception, match="unknown bandit"):
        from_dict(RunConfig, {"evaluate": {"stream_bandits": ["ucb-db"]}})


def test_dotted_overrides_are_typed():
    data = apply_overrides({}, ["pretrain_target.train.max_steps=7", "run.root=/x/y", "demo.domains=[math, code]"])
    cfg = from_dict(RunConfig, data)
    assert cfg.pretrain_target.train.max_steps == 7 and cfg.run.root == "/x/y" and cfg.demo.domains == ["math", "code"]


def test_exponent_numbers_read_as_numbers_in_files_and_overrides(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e-3` as a string; a learning rate written so must still be a number."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run:\n  root: {tmp_path / 'run'}\ntrain_drafters:\n  finetune:\n    lr: 1e-3\n")
    assert load_config(RunConfig, cfg).train_drafters.finetune.lr == 0.001
    data = apply_overrides({}, ["train_drafters.finetune.lr=2E-4", "run.root=1e3x", "demo.domains=[1.5e2, .5e1]"])
    assert data == {"train_drafters": {"finetune": {"lr": 2e-4}}, "run": {"root": "1e3x"}, "demo": {"domains": [150.0, 5.0]}}


def test_cli_misspelled_key_exits_2_and_writes_nothing(tmp_path, capsys):
    root = tmp_path / "run"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"run:\n  root: {root}\ndemo:\n  corpus_per_domian: 5\n")
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "demo.corpus_per_domian" in err[0] and "demo.corpus_per_domain" in err[0]
    assert main(["prepare-data", "--config", str(cfg)]) == 2
    assert not root.exists()


def test_console_script_exit_code(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pretrain_target:\n  seq_len: short\n")
    r = subprocess.run([sys.executable, "-m", "specdraft.pipelines.cli", "validate", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "pretrain_target.seq_len" in r.stderr and r.stderr.count("\n") == 1


def test_partial_section_keeps_the_stage_defaults():
    cfg = from_dict(RunConfig, {"pretrain_target": {"train": {"max_steps": 7}, "model": {"n_layers": 2}}})
    default = RunConfig().pretrain_target
    assert cfg.pretrain_target.train.max_steps == 7
    assert cfg.pretrain_target.train.batch_size == default.train.batch_size
    assert cfg.pretrain_target.model.hidden == default.model.hidden and cfg.pretrain_target.model.n_layers == 2


def test_epochs_given_over_a_section_defaulting_to_steps_train_for_epochs():
    """The general phase defaults to max_steps 200: a config that gives its max_epochs and not its max_steps means
    epochs (before, the default's 200 steps silently won); given both, max_steps decides, as documented."""
    given = from_dict(RunConfig, {"train_drafters": {"general": {"train": {"max_epochs": 2, "batch_size": 8}}}})
    assert (given.train_drafters.general.train.max_steps, given.train_drafters.general.train.max_epochs) == (-1, 2)
    both = from_dict(RunConfig, {"train_drafters": {"general": {"train": {"max_epochs": 2, "max_steps": 50}}}})
    assert both.train_drafters.general.train.max_steps == 50
    untouched = from_dict(RunConfig, {"train_drafters": {"general": {"train": {"batch_size": 8}}}})
    assert untouched.train_drafters.general.train.max_steps == RunConfig().train_drafters.general.train.max_steps == 200
    over = load_config(RunConfig, None, ["train_drafters.general.train.max_epochs=3"])  # a command-line override too
    assert over.train_drafters.general.train.max_steps == -1


def test_reproduce_is_the_demo_with_another_evaluation():
    """configs/reproduce.yaml takes demo.yaml through `base`: every training section is the demo's but the
    EAGLE set (so prepare-data, pretrain-target and distill-data are cache hits on a finished demo root) and
    its report goes beside the demo's."""
    from specdraft.pipelines.config import to_dict
    from specdraft.pipelines.stage import stage_dir

    demo = load_config(RunConfig, CONFIGS / "demo.yaml")
    rep = load_config(RunConfig, CONFIGS / "reproduce.yaml")
    for section in ("run", "target", "demo", "pretrain_target", "distill_data", "train_drafters",
                    "acceptance_data", "train_heads", "train_router", "export"):
        ours, theirs = to_dict(getattr(rep, section)), to_dict(getattr(demo, section))
        if section == "train_drafters":  # MetaSD's MetaEagle set: an EAGLE twin of every drafter
            assert ours.pop("eagle")["drafters"] is None and theirs.pop("eagle")["drafters"] == ["ofa"]
        assert ours == theirs, section
    assert stage_dir(demo, "evaluate").name == "report" and stage_dir(rep, "evaluate").name == "reproduce"
    assert rep.evaluate.spectr_drafts == [1, 2, 4, 8] and len(rep.evaluate.cascade_alphas) > 1
    assert rep.evaluate.sets == ["test", "perturbed", "ood"] and "perturbed" not in demo.evaluate.sets
    assert stage_dir(rep, "export") == stage_dir(demo, "export")


def test_quality_config_is_its_own_world_and_root():
    """configs/quality.yaml (make quality): the quality world with its three scored domains under its own run root,
    long generations, the cascades with several lenience values and every drafter's quality alone; the demo stays
    the default world."""
    from specdraft.data import quality_world
    from specdraft.data.quality import PRIMARY_METRIC
    from specdraft.pipelines.stage import stage_dir

    q = load_config(RunConfig, CONFIGS / "quality.yaml")
    demo = load_config(RunConfig, CONFIGS / "demo.yaml")
    assert q.demo.world == "quality" and demo.demo.world == RunConfig().demo.world == "demo"
    assert set(q.demo.domains) == set(quality_world.DOMAINS) <= set(PRIMARY_METRIC) and not q.demo.heldout_domains
    assert stage_dir(q, "prepare-data").parent != stage_dir(demo, "prepare-data").parent
    assert q.evaluate.max_new_tokens >= 128 and q.distill_data.max_new_tokens >= q.evaluate.max_new_tokens
    assert {"chow", "diff", "opt", "token_v3"} <= set(q.evaluate.cascades) and len(q.evaluate.cascade_alphas) > 2
    assert q.evaluate.drafter_quality and {"ucb-bd", "ucb-be"} <= set(q.evaluate.bandits)
    assert q.train_drafters.model.n_layers == 1 < q.pretrain_target.model.n_layers


def test_base_cycle_and_bad_evaluate_out_are_one_line_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_config(RunConfig, tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: ../nowhere.yaml\n")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RunConfig, tmp_path / "c.yaml")
    for bad in ("bundle", "../x", ""):
        with pytest.raises(InputError, match="evaluate.out"):
            load_config(RunConfig, None, [f"evaluate.out={bad}"])


def test_a_model_section_takes_a_preset_name(tmp_path):
    """`train_drafters.model: metasd-68m` is the preset (file and override); an unknown name is a one-line
    error naming the field and the presets; a mapping still gives the fields."""
    from specdraft.drafters.model import PRESETS

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run:\n  root: {tmp_path / 'run'}\ntrain_drafters:\n  model: metasd-68m\n")
    assert load_config(RunConfig, cfg).train_drafters.model == PRESETS["metasd-68m"]
    assert load_config(RunConfig, cfg, ["pretrain_target.model=demo-target"]).pretrain_target.model == PRESETS["demo-target"]
    with pytest.raises(ConfigError, match=r"'train_drafters\.model': unknown model preset 'metasd-86m'; choose one of .*metasd-68m"):
        from_dict(RunConfig, {"train_drafters": {"model": "metasd-86m"}})
    assert from_dict(RunConfig, {"train_drafters": {"model": {"n_layers": 3}}}).train_drafters.model.n_layers == 3
