"""Data scaling: what more distilled data buys a drafter trained from scratch, for both drafter families.

    python benchmarks/real/bench_data_scaling.py RUN [key.path=value ...] [--config configs/real.yaml] [--scales 1,2,4,8]
        [--families independent,eagle3,eagle3-extra,independent-ce,independent-fkl,independent-tvd]
        [--independent-epochs 4] [--eagle-epochs 2] [--specialist-epochs N] [--tokens 64] [--k 4] [--temperature 0]
        [--no-append] [--section S --page P --plot NAME.png]

RUN is a run root of --config whose prepare-data, distill-data and teacher-data ran at the largest scale's data,
e.g. for SmolLM2 at 8x make real's (96 prompts a domain at T = 0, 384 answers):

    specdraft prepare-data configs/real.yaml run.root=RUN demo.train_per_domain=384 distill_data.temperatures=[0.0,1.0]
    (then distill-data and teacher-data with the same overrides)

and for the Qwen pair's specialists (stages prepare-data and distill-data only), at 4x its 16 answers a domain:

    specdraft run configs/real-pair.yaml run.root=RUN demo.train_per_domain=64 demo.test_per_domain=4 \
        'run.stages=[convert-target,prepare-data,distill-data]'
    python benchmarks/real/bench_data_scaling.py RUN --config configs/real-pair.yaml --families specialists \
        --scales 1,2,4 --page benchmarks/sibling/RESULTS.md --section "bench_data_scaling.py (pair)" \
        --plot data_scaling_pair.png

key.path=value overrides --config as the stages' own command line does (e.g. train_drafters.eagle.ttt_steps=7: a
recipe of the authors' own beside the config's, in a section of its own).

Scale s takes, per training domain, the first s x U rows (U: --config's demo.train_per_domain, make real's 96) in the
order (temperature as listed, prompt index): so the scales are nested, and past the world's distinct prompts (the
instruct world has 395 code functions to ask about) the larger scales add the target's answers at the next
temperature to the same prompts, as MetaSD's recipe distils at several temperatures. At each scale, from random
weights, both families as make real trains them, for epochs (so compute grows with the data, as the peers'
recipes do):
  - independent: make real's 2 x 256 drafter, its general phase (cross-entropy on the target's answers, lr 1e-3,
    batch 8) for --independent-epochs passes (make real: 200 steps, ~4 passes of its 384 answers);
  - EAGLE-3: make real's train_drafters.eagle (vLLM's layout, 3-step training-time test, 8192-token draft
    vocabulary, lr 1e-3, batch 8) for --eagle-epochs passes, on teacher-data's stored features (the target never
    runs in training);
  - eagle3-extra: the same EAGLE-3 recipe on the same answers plus the reference answer of each of the scale's
    prompts, text the target did not write, scored by teacher-data (`teacher_data.extra: [reference]`) at prefill
    speed: whether that second source adds acceptance beyond the target's own answers. The same passes, so it
    trains on more rows and takes longer;
  - independent-ce, independent-fkl, independent-tvd: the independent drafter's loss measured. The same drafter,
    random weights (the general phase's own seeded start), rate, batch and passes as `independent`, trained by the
    stage's finetune phase on teacher-data's stored rows: cross-entropy on the target's greedy tokens, forward
    KL(p || q) or total variation against the target's stored top-k (renormalised over its k tokens). All three read
    the same rows through the same code, so only the loss differs; `independent` is the general phase's own CE.
For a config whose drafters start from a sibling model (train_drafters.init_from, the Qwen pair's
configs/real-pair.yaml), `--families specialists` measures self-distillation instead:
  - specialists: one drafter a training domain, each the init_from model finetuned by the stage's finetune phase
    on its domain's rows of the scale (--config's finetune section: loss, lr, batch) for --specialist-epochs passes
    (default: the config's); judged on its own domain's test prompts, beside the untouched init_from model (the
    "0x" row) on the same prompts, paired.
Each is trained by the stage's own code (pipelines/train_drafters.py train_base and finetune,
pipelines/train_eagle.py train_eagle) into RUN/bench_data_scaling/<answers a domain>-a-domain-<hash of the target, the rows and the
training config>/, so a killed run resumes with the next unfinished drafter, and a changed input trains anew.
Judged by the acceptance length at K = --k (MAT: tokens per target forward, bonus counted; exact, greedy) of the
decoder at batch 1 over every test prompt of the training domains, chat-templated as evaluate formats them, in the
dtype the run's target.dtype picks; 90% intervals bootstrap over prompts. --temperature T > 0 decodes by speculative
sampling at T instead (the acceptance TVD aims at), each prompt's generator seeded from run.seed and its index, the
same for every drafter. Training times are wall clock on the
box as it was. Writes the table as this script's section of benchmarks/real/RESULTS.md (or --section of --page)
and the curve as --plot beside that page (data_scaling.png).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.data.chat import chat_format  # noqa: E402
from specdraft.decoding.bundle.chat import end_of_turn_ids  # noqa: E402
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_tokenizer  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.speculative import generate_speculative  # noqa: E402
from specdraft.decoding.speculators.drafter import DrafterSpeculator  # noqa: E402
from specdraft.decoding.speculators.eagle import EagleSpeculator  # noqa: E402
from specdraft.decoding.speculators.eagle_model import load_eagle, target_dir_hash  # noqa: E402
from specdraft.pipelines.config import load_config, to_dict  # noqa: E402
from specdraft.pipelines.readers import BASE, TeacherData, load_distill_data, load_teacher_data  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from specdraft.pipelines.train_drafters import converted_init, finetune, train_base  # noqa: E402
from specdraft.pipelines.train_eagle import PREFIX, train_eagle  # noqa: E402
from benchmarks.engines.acceptance import paired_ratio, pooled_mal, test_prompts  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.publish import add_section_flags, page_of, publish_for  # noqa: E402
from benchmarks.harness.tables import interval, table  # noqa: E402

FAMILIES = {"independent": "independent", "specialists": "specialists", "eagle3": "EAGLE-3",
            "eagle3-extra": "EAGLE-3 + references", "independent-ce": "independent, CE",
            "independent-fkl": "independent, forward KL", "independent-tvd": "independent, TVD"}  # name -> label
LOSSES = {"independent-ce": "ce", "independent-fkl": "fkl", "independent-tvd": "tvd"}  # family -> finetune loss
STORED = {"eagle3", "eagle3-extra", *LOSSES}  # the families that read teacher-data's stored signal
UNTRAINED = "untrained"  # the loss families' common start: <point>/untrained/base/model
EXTRA = "extra"  # eagle3-extra's drafter: under <point>/extra-<hash of its reference rows>/


def scale_rows(rows: list[dict], temperatures: list[float], per_domain: int) -> list[dict]:
    """The first `per_domain` rows of each domain in (temperature as listed, prompt index) order: nested in
    `per_domain`. Refuses a scale the rows cannot fill (one line: what to distil)."""
    rank = {float(t): i for i, t in enumerate(temperatures)}

    def order(r: dict) -> tuple:
        return rank[float(r["temperature"])], int(r["prompt_id"].rsplit("/", 1)[1])

    out = []
    for domain in sorted({r["domain"] for r in rows}):
        mine = sorted((r for r in rows if r["domain"] == domain), key=order)
        if len(mine) < per_domain:
            raise SystemExit(f"error: distill_data holds {len(mine)} {domain} train rows, a scale needs {per_domain}; "
                             "distil more (demo.train_per_domain, distill_data.temperatures) or lower --scales")
        out += mine[:per_domain]
    return out


def subset(stored: TeacherData, ids: set[str]) -> TeacherData:
    """`stored` with its train split cut to the rows `ids` (its dev split whole, for the EAGLE dev curve)."""
    train = stored.splits["train"]
    keep = [i for i, x in enumerate(train["id"]) if x in ids]
    if len(keep) != len(ids):
        raise SystemExit("error: teacher_data lacks rows of distill_data's train split; rerun stage teacher-data")
    return dataclasses.replace(stored, splits={**stored.splits, "train": train.select(keep)})


def reference_ids(stored: TeacherData, rows: list[dict]) -> list[str]:
    """The ids of teacher-data's reference rows (`teacher_data.extra: [reference]`) of the prompts `rows` answer,
    sorted; refused in one line when teacher-data stored none."""
    prompts = {r["prompt_id"] for r in rows}
    ids = sorted(x for x, source in zip(stored.splits["train"]["id"], stored.splits["train"]["source"])
                 if source == "reference" and x.split(":", 1)[1] in prompts)
    if not ids:
        raise SystemExit("error: teacher_data holds no reference rows of these prompts; rerun stage teacher-data "
                         "with teacher_data.extra=[reference] (a prompt world with reference answers)")
    return ids


def extra_dir(work: Path, ids: list[str]) -> Path:
    """eagle3-extra's work dir within a point's: named by its reference rows, so other extras train anew."""
    return work / f"{EXTRA}-{hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:12]}"


def eagle_work(family: str, work: Path, refs: list[str]) -> Path:
    """Where an EAGLE family's drafter of a point trains: eagle3 in the point's dir, eagle3-extra in `extra_dir`."""
    return work if family == "eagle3" else extra_dir(work, refs)


def loss_config(cfg: RunConfig, loss: str) -> RunConfig:
    """A point's config for a loss family: the general phase off (so the base is the untrained drafter, the general
    phase's own seeded start) and the finetune phase the general phase's recipe with `loss`; one drafter of every
    domain trained for its passes (same_epochs: no specialist to match)."""
    tcfg = cfg.train_drafters
    return dataclasses.replace(cfg, train_drafters=dataclasses.replace(
        tcfg, general=dataclasses.replace(tcfg.general, enabled=False),
        finetune=dataclasses.replace(tcfg.general, loss=loss), ofa_compute="same_epochs"))


def point_config(cfg: RunConfig, args) -> RunConfig:
    """--config's training sections with the epochs of this benchmark (max_steps off, so passes decide)."""
    tcfg = cfg.train_drafters
    general = dataclasses.replace(tcfg.general, train=dataclasses.replace(
        tcfg.general.train, max_steps=-1, max_epochs=args.independent_epochs))
    eagle = dataclasses.replace(tcfg.eagle, drafters=["ofa"], eval_every_n_steps=0, train=dataclasses.replace(
        tcfg.eagle.train, max_steps=-1, max_epochs=args.eagle_epochs))
    epochs = args.specialist_epochs or tcfg.finetune.train.max_epochs
    tune = dataclasses.replace(tcfg.finetune, train=dataclasses.replace(
        tcfg.finetune.train, max_steps=-1, max_epochs=epochs))
    # init_from stays in the key (point_key) but not in the recipe: the independent drafter starts from random
    # weights, the specialists from the init's converted directory (`init_dir`)
    return dataclasses.replace(cfg, train_drafters=dataclasses.replace(
        tcfg, general=general, eagle=eagle, finetune=tune, general_on="distilled", init_from=None, init_drafter=None))


def point_key(cfg: RunConfig, rows: list[dict], target_path: Path, init=None) -> str:
    """What a point's drafters are made of (the target's content, the rows, the training sections, the model the
    specialists start from): its work dir is named by it, so a rerun resumes only what the same inputs made."""
    made_of = [target_dir_hash(target_path), [r["id"] for r in rows], to_dict(cfg.train_drafters), cfg.run.seed]
    if init is not None:
        made_of.append(to_dict(init) if dataclasses.is_dataclass(init) else str(init))
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:12]


def init_dir(cfg: RunConfig, run: Path) -> Path:
    """The specialists' starting model as a directory: init_from's own, or its GGUF converted once under RUN."""
    init = cfg.train_drafters.init_from
    if init is None:
        raise SystemExit("error: --families specialists needs a config whose train_drafters.init_from names the model "
                         "they start from (configs/real-pair.yaml); use --families independent,eagle3")
    return Path(init) if isinstance(init, str) else converted_init(SimpleNamespace(cfg=cfg, work=run / "bench_data_scaling"),
                                                                   init)


def train_point(cfg: RunConfig, work: Path, rows: list[dict], stored: TeacherData | None, target, tok,
                target_path: Path, dev_rows: list[dict], families: list[str], init: Path | None,
                refs: list[str]) -> dict:
    """`families` at one scale, by the stage's code, into `work` (resumed: a finished drafter is kept); `refs`: the
    reference rows eagle3-extra adds; -> {family: training seconds of this process, None where resumed}."""
    ctx = SimpleNamespace(cfg=cfg, work=work)
    timings: dict[str, dict] = {}
    domains = sorted({r["domain"] for r in rows})
    done: dict[str, float | None] = {}
    if "independent" in families:
        train_base(ctx, tok, rows, timings, str(target_path))
        done["independent"] = timings.get(BASE, {}).get("seconds")
    if "specialists" in families:
        tune = cfg.train_drafters.finetune
        finetune(ctx, tok, [(d, [d]) for d in domains], rows, init, target if tune.loss != "ce" else None, timings)
        trained = [timings[d]["seconds"] for d in domains if d in timings]
        done["specialists"] = round(sum(trained), 1) if len(trained) == len(domains) else None
    ids = {r["id"] for r in rows}
    answers = subset(stored, ids) if STORED & set(families) else None  # the scale's stored rows, cut once
    for family in ("eagle3", "eagle3-extra"):
        if family in families:
            # the answers pick the draft vocabulary, as in the stage; eagle3-extra trains on their prompts'
            # references too
            rows_of = answers if family == "eagle3" else subset(stored, ids | set(refs))
            eagle = train_eagle(SimpleNamespace(cfg=cfg, work=eagle_work(family, work, refs)), target,
                                [("ofa", domains)], rows, tok.pad_token_id, cfg.run.seed, target_path, rows_of,
                                dev_rows)
            done[family] = eagle.get(PREFIX + "ofa", {}).get("seconds")
    for family in [f for f in LOSSES if f in families]:
        lcfg = loss_config(cfg, LOSSES[family])
        base = train_base(SimpleNamespace(cfg=lcfg, work=work / UNTRAINED), tok, rows, {}, str(target_path))
        finetune(SimpleNamespace(cfg=lcfg, work=work / family), tok, [("ofa", domains)], rows, base, None, timings,
                 stored=answers)
        done[family] = timings.pop("ofa", {}).get("seconds")
    record = work / "training.json"  # the first run's times: a resumed point reports what it cost then
    first = json.loads(record.read_text()) if record.is_file() else {}
    merged = {**first, **{k: first.get(k) if v is None else v for k, v in done.items()}}
    record.write_text(json.dumps(merged) + "\n")
    return merged


def counts(target, speculator, prompts, args, eos) -> dict:
    """{"tokens", "calls"}: generated tokens and target forwards per prompt at --temperature (greedy at 0; else
    sampled, prompt i's generator seeded with run.seed + i for every drafter alike), a fresh `speculator(domain)`
    per prompt (so a specialist drafts its own domain's prompts)."""
    sampling = SamplingConfig(temperature=args.temperature)
    with torch.inference_mode():
        made = [generate_speculative(target, speculator(d), ids, args.tokens, sampling, eos,
                                     generator=torch.Generator().manual_seed(args.seed + i)).metrics
                for i, (d, ids) in enumerate(prompts)]
    return {"tokens": [m.n_generated for m in made], "calls": [m.n_target for m in made]}


def mat(c: dict) -> tuple[float, float, float]:
    """MAT pooled over prompts with a 90% bootstrap interval over prompts."""
    return pooled_mal(c["tokens"], c["calls"], n_boot=1000)


def only(c: dict, prompts, domain: str) -> dict:
    """`c` cut to `domain`'s prompts."""
    keep = [i for i, (d, _) in enumerate(prompts) if d == domain]
    return {k: [v[i] for i in keep] for k, v in c.items()}


def drafted(path: Path, target, prompts, args, eos) -> dict:
    """Per-prompt counts of the model drafter at `path` (loaded in the target's dtype, dropped after) at K = --k."""
    drafter = load_causal_lm(path, dtype_of(target), "cpu")
    return counts(target, lambda d: DrafterSpeculator(drafter, FixedK(args.k)), prompts, args, eos)


def judge(family: str, work: Path, target, target_path: Path, prompts, args, eos, refs: list[str]) -> dict:
    """Per-prompt counts of `family`'s drafter(s) trained in `work`; a specialist is loaded for its own domain's
    prompts only, one at a time (each is the size of the init)."""
    if family == "independent":
        return drafted(work / BASE / "model", target, prompts, args, eos)
    if family in LOSSES:
        return drafted(work / family / "ofa" / "model", target, prompts, args, eos)
    if family in ("eagle3", "eagle3-extra"):
        eagle = load_eagle(eagle_work(family, work, refs) / (PREFIX + "ofa") / "model", target=target, target_hash=target_dir_hash(target_path))
        return counts(target, lambda d: EagleSpeculator(eagle, FixedK(args.k)), prompts, args, eos)
    out = {"tokens": [0] * len(prompts), "calls": [0] * len(prompts)}
    for domain in sorted({d for d, _ in prompts}):
        mine = [(i, p) for i, p in enumerate(prompts) if p[0] == domain]
        got = drafted(work / domain / "model", target, [p for _, p in mine], args, eos)
        for j, (i, _) in enumerate(mine):
            out["tokens"][i], out["calls"][i] = got["tokens"][j], got["calls"][j]
    return out


def plot(points: list[dict], families: list[str], title: str, path: Path, init: tuple | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for family, style in zip(families, ("o-", "s-", "^-", "D-", "v-", "P-", "X-")):
        xs = [p["tokens"] for p in points]
        ms = [mat(p[family]) for p in points]
        ax.errorbar(xs, [m[0] for m in ms], fmt=style, capsize=3, label=FAMILIES[family],
                    yerr=[[m[0] - m[1] for m in ms], [m[2] - m[0] for m in ms]])
    if init is not None:  # the untouched init_from model: what the specialists must beat
        ax.axhline(init[0], color="grey", ls="--", label="the init, untouched")
        ax.axhspan(init[1], init[2], color="grey", alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distilled response tokens")
    ax.set_ylabel("acceptance length at K = 4 (MAT)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_config(args) -> RunConfig:
    """--config with RUN as its root and the command line's overrides."""
    return load_config(RunConfig, args.config, [f"run.root={args.run}", *args.overrides])


def run_bench(args) -> str:
    run = Path(args.run)
    cfg = run_config(args)
    args.seed = cfg.run.seed  # the sampled decodes' generators
    unit = args.unit or cfg.demo.train_per_domain
    target_path = run / "target"
    init = init_dir(cfg, run) if "specialists" in args.families else None
    tok = load_tokenizer(target_path, cfg.target.trust_remote_code)
    target = load_causal_lm(target_path, cfg.target.dtype, "cpu")
    distill = load_distill_data(run / "distill_data")
    # as distill-data listed them: its chunks run one temperature after another, in the config's order
    temperatures = list(dict.fromkeys(float(t) for t in distill["train"]["temperature"]))
    all_rows = [dict(r) for r in distill["train"]]
    dev_rows = [dict(r) for r in distill["dev"]]
    stored = load_teacher_data(run / "teacher_data") if STORED & set(args.families) else None
    args.top_k = stored and stored.format.top_k  # as teacher-data stored it, for the section's prose
    pcfg = point_config(cfg, args)
    domains = sorted({r["domain"] for r in all_rows})
    eos = end_of_turn_ids(tok, target)
    # every test prompt RUN holds (its prepare-data may have made more than --config's demo.test_per_domain)
    prompts = [(d, ids) for d, ids in test_prompts(run, tok, chat_format(cfg.prompts), sys.maxsize,
                                                   args.max_prompt_tokens) if d in domains]
    untouched = None
    if init is not None:  # the 0x point: the init itself drafting every prompt
        untouched = drafted(init, target, prompts, args, eos)
        print(f"[bench_data_scaling] the init, untouched: {mat(untouched)[0]:.3f}")
    points = []
    for s in args.scales:
        rows = scale_rows(all_rows, temperatures, s * unit)
        key = point_key(pcfg, rows, target_path, cfg.train_drafters.init_from)
        work = run / "bench_data_scaling" / f"{s * unit}-a-domain-{key}"
        print(f"[bench_data_scaling] {s}x: {len(rows)} rows")
        refs = reference_ids(stored, rows) if "eagle3-extra" in args.families else []
        seconds = train_point(pcfg, work, rows, stored, target, tok, target_path, dev_rows, args.families, init, refs)
        points.append({"scale": s, "rows": len(rows), "tokens": sum(len(r["response_ids"]) for r in rows),
                       "temperatures": sorted({float(r["temperature"]) for r in rows}), "seconds": seconds,
                       "references": len(refs) if "eagle3-extra" in args.families else None,
                       **{f: judge(f, work, target, target_path, prompts, args, eos, refs)
                          for f in args.families}})
        print(f"[bench_data_scaling] {s}x: " + ", ".join(f"{FAMILIES[f]} {mat(points[-1][f])[0]:.3f}"
                                                         for f in args.families))
    # what RUN holds, for the section's rerun line: its prompts a domain and the temperatures it was distilled at
    held = min(1 + max(int(r["prompt_id"].rsplit("/", 1)[1]) for r in all_rows if r["domain"] == d) for d in domains)
    args.data = f"demo.train_per_domain={held} distill_data.temperatures=[{','.join(map(str, temperatures))}]"
    return render(args, cfg, target, points, unit, prompts, untouched)


def recipe(args, cfg: RunConfig, family: str) -> str:
    """How `family`'s drafters are made at each scale, for the section's prose."""
    tcfg = cfg.train_drafters
    if family == "independent":
        return (f"the independent drafter ({tcfg.model.hidden} wide, {tcfg.model.n_layers} layers) from random "
                f"weights for {args.independent_epochs} passes")
    if family == "eagle3":
        return (f"EAGLE-3 ({tcfg.eagle.draft_vocab} draft tokens, test length {tcfg.eagle.ttt_steps}) from random "
                f"weights for {args.eagle_epochs} passes on the stored features")
    if family in LOSSES:  # the recipe they share is said once, by `recipes`
        return {"ce": "cross-entropy on the target's greedy tokens (CE)", "fkl": "forward KL against the target's "
                f"stored top-{args.top_k}", "tvd": f"total variation against its stored top-{args.top_k} (TVD)"
                }[LOSSES[family]]
    if family == "eagle3-extra":
        return ("EAGLE-3 + references: the same recipe on the same answers plus the reference answer of each of "
                "the scale's prompts (the references column: text the target did not write, scored by teacher-data)")
    tune = tcfg.finetune
    return (f"a specialist a domain from the init_from model (the 0x row), the stage's finetune phase ({tune.loss}, "
            f"lr {tune.lr:g}, batch {tune.train.batch_size}) for {args.specialist_epochs or tune.train.max_epochs} "
            "pass(es) of its domain's rows, judged on its own domain's prompts")


def recipes(args, cfg: RunConfig, families: list[str]) -> str:
    """Every family's recipe for the section's prose, the loss families' shared one said once."""
    tcfg = cfg.train_drafters
    losses = [recipe(args, cfg, f) for f in families if f in LOSSES]
    shared = (f"the independent drafter ({tcfg.model.hidden} wide, {tcfg.model.n_layers} layers) from the general "
              f"phase's random weights for {args.independent_epochs} passes at its rate and batch on teacher-data's "
              "stored rows by the finetune phase, with " + ", ".join(losses)) if losses else None
    told = [recipe(args, cfg, f) for f in families if f not in LOSSES]
    return "; ".join(told + [shared] if shared else told)


def render(args, cfg: RunConfig, target, points: list[dict], unit: int, prompts, untouched: dict | None) -> str:
    gguf = cfg.target.gguf
    name = (Path(gguf.file).name if gguf and gguf.file else f"GGUF of {len(gguf.parts)} parts" if gguf
            else str(cfg.target.name_or_path))
    name += f" ({target.config.num_hidden_layers} x {target.config.hidden_size})"
    families = args.families
    if not args.no_append and args.plot:
        plot(points, families, f"{name}, {cfg.demo.world} world, K = {args.k}",
             Path(args.page or page_of(__file__)).with_name(args.plot), untouched and mat(untouched))
    refs = "eagle3-extra" in families  # a column of the reference rows added to the answers
    rows = [["0x (the init, untouched)", 0, 0, "", *([""] if refs else []),
             *[x for f in families for x in ((interval(mat(untouched)), "") if f == "specialists" else ("", ""))]]
            ] if untouched else []
    rows += [[f"{p['scale']}x", p["rows"], f"{p['tokens']:,}", ", ".join(f"{t:g}" for t in p["temperatures"]),
              *([p["references"]] if refs else []),
              *[x for f in families for x in (interval(mat(p[f])), p["seconds"].get(f))]] for p in points]
    header = ["scale", "answers", "response tokens", "temperatures", *(["references"] if refs else []),
              *[x for f in families for x in (f"{FAMILIES[f]} MAT", "its training s")]]
    dtype = str(dtype_of(target)).removeprefix("torch.")
    lines = [
        f"## Acceptance length against distilled data ({datetime.date.today()}, {machine('cpu', dtype)}; "
        f"{box_load()})", "",
        f"`python benchmarks/real/bench_data_scaling.py {shlex.join('RUN' if a == args.run else a for a in args.argv)}`, RUN: {args.config}'s "
        f"prepare-data, distill-data" + (" and teacher-data" if STORED & set(families) else "")
        + f" with {args.data}" + (" teacher_data.extra=[reference]" if refs else ""), "",
        f"Target {name}; {cfg.demo.world} world; at each scale " + recipes(args, cfg, families)
        + f". 1x = {unit} answers a domain" + (" (the config's)" if unit == cfg.demo.train_per_domain else "")
        + f". MAT at K = {args.k} (tokens per target forward), "
        + ("greedy" if args.temperature == 0 else f"sampled at T = {args.temperature:g} (prompt i's generator seeded "
           f"{args.seed} + i, the same for every drafter)")
        + f", batch 1, {len(prompts)} test prompts x "
        f"{args.tokens} new tokens, pooled, 90% interval over prompts; training seconds: the fits' wall clock.", "",
        *table(header, rows, "lrrl" + "r" * refs + "rr" * len(families))]
    if untouched:  # in domain, each specialist against the init on the same prompts, paired
        domains = sorted({d for d, _ in prompts})
        per = [[d, interval(mat(only(untouched, prompts, d))),
                *[f"{interval(mat(only(p['specialists'], prompts, d)))}, "
                  f"x{interval(paired_ratio(only(p['specialists'], prompts, d), only(untouched, prompts, d)))}"
                  for p in points]] for d in domains]
        per.append(["pooled", interval(mat(untouched)),
                    *[f"{interval(mat(p['specialists']))}, x{interval(paired_ratio(p['specialists'], untouched))}"
                      for p in points]])
        lines += ["", "In domain: each specialist's MAT on its own domain's test prompts, and its ratio to the init's "
                  "on the same prompts (paired, 90% interval over prompts):", "",
                  *table(["domain", "the init", *[f"{p['scale']}x: MAT, x the init" for p in points]], per,
                         "l" + "r" * (1 + len(points)))]
    figure = [f"![acceptance length against distilled tokens]({args.plot})", ""] if args.plot else []
    return "\n".join([*lines, "", *figure])


def families(text: str) -> list[str]:
    names = [f for f in text.split(",") if f]
    bad = [f for f in names if f not in FAMILIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown famil(ies) {bad}: choose among {', '.join(FAMILIES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run root whose distill-data (and teacher-data for eagle3) ran at the largest scale")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="overrides of --config's recipes, e.g. train_drafters.eagle.ttt_steps=7")
    parser.add_argument("--config", default="configs/real.yaml", help="the run's config: 1x and the recipes")
    parser.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8],
                        help="multiples of the config's demo.train_per_domain, comma-separated")
    parser.add_argument("--families", type=families, default=["independent", "eagle3"],
                        help=f"drafter families, comma-separated, of {', '.join(FAMILIES)} (specialists: the config's "
                             "init_from model distilled, one a domain)")
    parser.add_argument("--independent-epochs", type=int, default=4, help="passes of the independent drafter")
    parser.add_argument("--eagle-epochs", type=int, default=2, help="passes of the EAGLE-3 drafters")
    parser.add_argument("--specialist-epochs", type=int, default=None,
                        help="passes of each specialist (default: the config's train_drafters.finetune)")
    parser.add_argument("--unit", type=int, default=None,
                        help="answers a domain at 1x (default: the config's demo.train_per_domain)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per test prompt")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy decodes; T > 0: speculative sampling at T, seeded per prompt")
    parser.add_argument("--max-prompt-tokens", type=int, default=448, help="test prompts truncated from the left")
    parser.add_argument("--plot", default="data_scaling.png",
                        help="the curve's file name, beside the page; '' for none (a page's folder holds at most ten files)")
    add_section_flags(parser)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    publish_for(run_bench(args), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
