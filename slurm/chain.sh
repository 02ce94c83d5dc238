#!/bin/bash
# Submit the whole pipeline as a chain of dependent Slurm jobs (each starts when the previous one
# succeeded; a failed job leaves the rest pending with DependencyNeverSatisfied: fix, then `scancel`
# them and run chain.sh again: finished stages are cache hits and take seconds).
#
#   slurm/chain.sh CONFIG [N_DISTILL_SHARDS [N_EVAL_SHARDS]] [key=value ...]   (from the directory CONFIG is relative to)
#
# distill-data, teacher-data and evaluate run as job arrays (N_DISTILL_SHARDS, default 4, for the first two;
# N_EVAL_SHARDS, default 4), each followed by a job that merges the shards (a cache hit when the last task to
# finish already did; teacher-data's tasks exit at once where no drafter reads its stored signal).
# Prints one job id per line, the last job's id last. Every job inherits this environment: set
# SBATCH_GPUS_PER_NODE=1 (and SBATCH_PARTITION, ...) here for a GPU cluster; SPECDRAFT_PYTHON picks the
# interpreter (default: this checkout's .venv/bin/python).
set -euo pipefail
CONFIG=${1:?usage: slurm/chain.sh CONFIG [N_DISTILL_SHARDS [N_EVAL_SHARDS]] [key=value ...]}
shift
SHARDS=4
EVAL_SHARDS=4
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then SHARDS=$1; shift; fi
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then EVAL_SHARDS=$1; shift; fi
(( SHARDS >= 1 )) || { echo "chain.sh: N_DISTILL_SHARDS must be >= 1" >&2; exit 2; }
(( EVAL_SHARDS >= 1 )) || { echo "chain.sh: N_EVAL_SHARDS must be >= 1" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
export SPECDRAFT_HOME=${SPECDRAFT_HOME:-$(dirname "$here")}
dep=""
submit() {  # submit SBATCH_ARGS...: submits after the previous job ($dep) succeeded; prints the new id
  sbatch --parsable ${dep:+--dependency=afterok:$dep} "$@" | cut -d';' -f1
}
dep=$(submit "$here/stage.sbatch" convert-target "$CONFIG" "$@"); echo "$dep"   # a GGUF target (else skipped)
dep=$(submit "$here/stage.sbatch" prepare-data "$CONFIG" "$@"); echo "$dep"
dep=$(submit "$here/stage.sbatch" pretrain-target "$CONFIG" "$@"); echo "$dep"
dep=$(submit --array=0-$((SHARDS - 1)) "$here/distill_data.sbatch" "$CONFIG" "$@"); echo "$dep"
dep=$(submit "$here/stage.sbatch" distill-data "$CONFIG" "$@"); echo "$dep"   # merges the shards (or a cache hit)
dep=$(submit --array=0-$((SHARDS - 1)) "$here/teacher_data.sbatch" "$CONFIG" "$@"); echo "$dep"
dep=$(submit "$here/stage.sbatch" teacher-data "$CONFIG" "$@"); echo "$dep"   # merges the shards (or a cache hit)
for stage in train-drafters acceptance-data train-heads train-router export; do
  dep=$(submit "$here/stage.sbatch" "$stage" "$CONFIG" "$@"); echo "$dep"
done
dep=$(submit --array=0-$((EVAL_SHARDS - 1)) "$here/evaluate.sbatch" "$CONFIG" "$@"); echo "$dep"
dep=$(submit "$here/stage.sbatch" evaluate "$CONFIG" "$@" --merge); echo "$dep"   # merges the shards (or a cache hit)
