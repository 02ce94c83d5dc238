"""The rows both EAGLE-3 trainers of bench_speculators.py see, and the target's hidden states in speculators' layout.

The exact rows specdraft's EAGLE trainer sees (its seeded batch sampler's first `steps` batches, built by the collator
it uses: input_ids and the response's loss mask) are written as speculators' prepared dataset (input_ids, loss_mask,
seq_len), the dev rows after them as its validation split. The target's hidden states (the inputs of three of its
layers and its last layer's output before the final norm, [T, 4, H]) are computed once, offline, into a cache whose
files the seeds' datasets link to (hidden_states/hs_{i}.safetensors).

Every cache here belongs to one run: the hidden states lie in a folder named by the run's key (the target's and the
distilled data's content hashes, `acceptance.run_key`) and the layers, each file holds the token ids it was computed
for and is computed again when they differ, and a seed's dataset is rebuilt when its rows or its run differ from
those it was written for.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.engines.acceptance import ids_digest
from benchmarks.harness.timing import run_child, tail

STAMP = "specdraft_rows.json"  # in a seed's dataset: the run key and the digest of the rows it holds


def our_batches(n_rows: int, ecfg, seed: int) -> list[list[int]]:
    """The row indices of the batches specdraft's EAGLE trainer takes: its seeded sampler's epochs, cut at
    max_steps (the permutation depends only on seed and epoch, drafters/data.ResumableBatchSampler)."""
    from specdraft.drafters.data import ResumableBatchSampler

    sampler = ResumableBatchSampler(n_rows, ecfg.train.batch_size, seed, True, False, 0, 1)
    epochs = ecfg.train.max_epochs if ecfg.train.max_steps == -1 else None
    batches, epoch = [], 0
    while (epochs is None or epoch < epochs) and (ecfg.train.max_steps == -1 or len(batches) < ecfg.train.max_steps):
        sampler.set_epoch(epoch)
        batches += [list(b) for b in sampler]
        epoch += 1
    return batches if ecfg.train.max_steps == -1 else batches[: ecfg.train.max_steps]


def prepared_row(row: dict, collate) -> dict:
    """One row as speculators' prepared dataset holds it, built by specdraft's collator: input_ids, and its
    loss mask as is (both trainers then train the drafter at index i on p_{i+1} when mask[i + 1] is set)."""
    b = collate([{"prompt_ids": row["prompt_ids"], "response_ids": row["response_ids"]}])
    ids, mask = b["input_ids"][0].tolist(), b["loss_mask"][0].tolist()
    return {"input_ids": ids, "loss_mask": mask, "seq_len": len(ids)}


def source_rows(run: Path, collate) -> tuple[list[dict], list[dict], list[dict]]:
    """(train distill rows, their prepared rows, the dev rows prepared): the hidden-state cache's row j is
    prepared train row j for j < len(train), then the dev rows."""
    from specdraft.pipelines.readers import load_distill_data

    distill = load_distill_data(run / "distill_data")
    train = [dict(r) for r in distill["train"]]
    return train, [prepared_row(r, collate) for r in train], [prepared_row(dict(r), collate) for r in distill["dev"]]


def write_dataset(rows: list[dict], out: Path) -> None:
    """speculators' prepared layout (prepare-data's save_to_disk: torch format, input_ids / loss_mask / seq_len)."""
    import datasets

    ds = datasets.Dataset.from_list(rows)
    ds.set_format(type="torch")
    ds.save_to_disk(str(out))


def vocab_files(draft_ids: list[int], vocab_size: int, out: Path) -> tuple[Path, Path]:
    """speculators' d2t (int64 offsets: target id = i + d2t[i]) and t2d (bool, one per target id) of our vocabulary."""
    ids = np.asarray(sorted(draft_ids), dtype=np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[ids] = True
    d2t_path, t2d_path = out / f"d2t-{len(ids)}.npy", out / f"t2d-{len(ids)}.npy"
    np.save(d2t_path, ids - np.arange(len(ids)))
    np.save(t2d_path, t2d)
    return d2t_path, t2d_path


# ---- the target's hidden states, in speculators' file layout -------------------------------------------


def hs_cache(work: Path, key: str, layers: list[int]) -> Path:
    """The hidden-state cache of the run `key` names, at these target layers."""
    return work / "hs_cache" / f"{key}-layers{'_'.join(map(str, layers))}"


def hidden_state_stack(target, input_ids: list[int], layers: list[int]) -> torch.Tensor:
    """[T, 4, H]: hidden_states[i] (the input of target layer i, vLLM's aux layer id i) for the three layers, then
    the last layer's output before the final norm (what speculators' verifier_norm + lm_head turn into p)."""
    seen = {}
    hook = target.model.layers[-1].register_forward_hook(lambda m, a, out: seen.update(last=out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = target(input_ids=torch.tensor([input_ids]), use_cache=False, output_hidden_states=True)
    finally:
        hook.remove()
    states = [out.hidden_states[i][0] for i in layers] + [seen["last"][0]]
    return torch.stack(states, dim=1).float().contiguous()


def cached_ids(path: Path) -> list[int] | None:
    """The token ids a cached hidden-state file was computed for (None when there is no file)."""
    from safetensors import safe_open

    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor("token_ids").tolist()


def extract_all(target_dir: Path, rows: dict[int, dict], layers: list[int], out: Path) -> int:
    """hs_{j}.safetensors ({"hidden_states" [T, 4, H], "token_ids" [T]}) for every row j of `rows` ({j: row}),
    computed where the cache holds none for exactly that row's token ids. -> how many were computed."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    todo = {j: row for j, row in rows.items() if cached_ids(out / f"hs_{j}.safetensors") != list(row["input_ids"])}
    if not todo:
        return 0
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    for j, row in todo.items():
        path = out / f"hs_{j}.safetensors"
        hs = hidden_state_stack(target, row["input_ids"], layers)
        save_file({"hidden_states": hs, "token_ids": torch.tensor(row["input_ids"], dtype=torch.long)},
                  str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)
    return len(todo)


def extract(script: Path, run: Path, work: Path, cache: Path, prepared: list[dict], needed: list[int],
            layers: list[int]) -> dict:
    """The hidden-state cache of the `needed` rows of `prepared` (train rows, then dev rows), in a child process of
    `script` (speculators' offline step, timed apart): -> its cost, {"seconds", "peak_rss_mib", "rows", "computed"}."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "rows.json").write_text(json.dumps({j: prepared[j]["input_ids"] for j in sorted(set(needed))}))
    cmd = [sys.executable, str(script), "--run", str(run), "--extract", str(cache),
           "--layers", ",".join(str(i) for i in layers)]
    res = run_child(cmd, work / "extract.log")
    if res["rc"] != 0:
        raise RuntimeError(f"hidden-state extraction failed (rc {res['rc']}); its log ends:\n{tail(work / 'extract.log')}")
    return {**res, **json.loads(tail(work / "extract.log", 1))}


def child_extract(run: Path, cache: Path, layers: str) -> None:
    """Child mode of `extract`: compute what the cache lacks, print the count as the log's last line."""
    rows = {int(j): {"input_ids": ids} for j, ids in json.loads((cache / "rows.json").read_text()).items()}
    computed = extract_all(run / "target", rows, [int(i) for i in layers.split(",")], cache)
    print(json.dumps({"rows": len(rows), "computed": computed}))


def link_hidden_states(cache: Path, indices: list[int], out: Path) -> None:
    """The dataset's row i reads hidden_states/hs_{i}: a hard link to the cache's file of its source row (an
    earlier link to another file is replaced)."""
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    for i, j in enumerate(indices):
        src, dst = cache / f"hs_{j}.safetensors", hs_dir / f"hs_{i}.safetensors"
        if dst.exists() and os.path.samefile(src, dst):
            continue
        dst.unlink(missing_ok=True)
        os.link(src, dst)


def prepare_seed(work: Path, cache: Path, key: str, seed: int, ecfg, prepared: list[dict], dev: list[dict]
                 ) -> tuple[Path, int, int]:
    """Seed `seed`'s speculators dataset: specdraft's batches in its order, then the dev rows, linked to `cache`'s
    hidden states; one written for other rows or another run is replaced. -> (dir, train rows, steps)."""
    batches = our_batches(len(prepared), ecfg, seed)
    order = [i for b in batches for i in b]
    rows = [prepared[i] for i in order] + dev
    data = work / f"seed{seed}" / "data"
    stamp = {"run": key, "rows": ids_digest(r["input_ids"] for r in rows)}
    if not (data / STAMP).exists() or json.loads((data / STAMP).read_text()) != stamp:
        shutil.rmtree(data, ignore_errors=True)
        write_dataset(rows, data)
        (data / STAMP).write_text(json.dumps(stamp))
    link_hidden_states(cache, order + [len(prepared) + j for j in range(len(dev))], data)
    return data, len(order), len(batches)
