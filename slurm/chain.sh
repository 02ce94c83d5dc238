#!/bin/bash
# Submit the whole pipeline as a chain of dependent Slurm jobs (each starts when the previous
# succeeded). Stages that are cache hits finish in seconds.
#
#   slurm/chain.sh configs/real.yaml [N_DISTILL_SHARDS] [key=value ...]
set -euo pipefail
CONFIG=${1:?usage: slurm/chain.sh CONFIG [N_DISTILL_SHARDS] [key=value ...]}
SHARDS=${2:-4}
shift $(( $# >= 2 ? 2 : 1 ))
here=$(dirname "$0")
dep=""
submit() {  # submit ARGS...; prints the job id and chains the next job after it
  local id
  id=$(sbatch --parsable ${dep:+--dependency=afterok:$dep} "$@")
  echo "$id"
}
dep=$(submit "$here/stage.sbatch" prepare-data "$CONFIG" "$@")
dep=$(submit "$here/stage.sbatch" pretrain-target "$CONFIG" "$@")
dep=$(submit --array=0-$((SHARDS - 1)) "$here/distill_data.sbatch" "$CONFIG" "$@")
dep=$(submit --gpus-per-node=1 "$here/stage.sbatch" distill-data "$CONFIG" "$@")   # merges the shards
for stage in train-drafters acceptance-data train-heads train-router export evaluate; do
  dep=$(submit "$here/stage.sbatch" "$stage" "$CONFIG" "$@")
done
echo "submitted; last job $dep"
