#!/usr/bin/env bash
# λ selection of the analytic heads with and without task boundaries (benchmarks/RESULTS.md, issue 17):
# `loo` on the current block, `reservoir` leave-one-out, and the reservoir with the nearest-mean blend, each on the
# boundary run and the task-free run of the same stream. Prints each run's table row.
#   benchmarks/analytic_selection.sh SUITE [SEEDS] [METHOD] [OUT]     e.g. benchmarks/analytic_selection.sh bbc-text
set -euo pipefail
suite=$1 seeds=${2:-1} method=${3:-analytic-rp} out=${4:-runs/analytic-selection}
declare -A settings=(
  [loo]="--set method.analytic.lambda_selection=loo --set method.analytic.mean_weight_grid=[0]"
  [reservoir]="--set method.analytic.lambda_selection=reservoir --set method.analytic.mean_weight_grid=[0]"
  [blend]="--set method.analytic.lambda_selection=reservoir --set method.analytic.mean_weight_grid=[0,0.1,0.3,1,3,10,100]"
)
mkdir -p "$out"
for selection in loo reservoir blend; do
  for task_free in false true; do
    folder=$out/$selection-$task_free
    # shellcheck disable=SC2086  # the settings are several words on purpose
    memcl bench "$suite" --seeds "$seeds" --methods "$method" ${settings[$selection]} \
      --set stream.task_free=$task_free --out "$folder" > "$folder.log" 2>&1 || { tail -3 "$folder.log"; exit 1; }
    echo "$selection task_free=$task_free: $(grep "^| $method " "$folder/$suite/results.md")"
  done
done
