#!/usr/bin/env bash
# Issue 16's training-quality comparison, all of it, on the GPU machine: the same GPT-2 124M
# initialisation (made by transformers) trained by Forge and by PyTorch on the same token stream,
# and a second PyTorch run on another window order to measure the run-to-run noise.
#
#   1. make_init.py        GPT-2 124M, random init (seed INIT_SEED), HF directory in WORK/init
#   2. forge train         --init-from WORK/init --device cuda --precision bf16, STEPS steps of
#                          BATCH x SEQ, Forge's default recipe           -> OUT/forge.jsonl
#   3. torch_train.py A    the same windows in Forge's order (--seed forge), bf16 autocast,
#                          torch.compile                                  -> OUT/torch-A.jsonl
#   4. torch_train.py B    another window order (--seed SEED_B), otherwise as A -> OUT/torch-B.jsonl
#   5. plot_svg.py         OUT/quality.svg and the summary (stdout and OUT/summary.txt): final val
#                          losses, |Forge - A| against the noise |A - B|
# Everything is written under WORK (results in WORK/results, copied to OUT after every stage and
# at the end, whatever happened). A stage whose result is already in WORK/results is skipped, so a second device call
# on the still-warm machine continues where the first stopped; other settings than the ones that
# made WORK/results clear it first (WORK/results/settings.txt).
#
# --check: the proof that init and batches are the same, before the long run: a tiny GPT-2
# (2 layers, width 128, 2 heads, context 64, GPT-2's vocabulary), fp32 on both sides, 20 steps of
# 2 micro-batches of 8 x 64; prints steps 1-5 side by side and fails (exit 1) unless every step's
# train loss and gradient norm agree within 1e-3 relative. DEVICE=cpu runs it without a GPU.
#
# Data, prepared once on the CPU machine (~24 MB; carry it):
#   tools/quality/prepare.sh build/forge ../shared/data/gpt2 dev-out/quality-data
# which runs scripts/make_corpus.sh (fortunes + gcide), keeps its first 25,000,000 bytes and calls
#   forge data prepare --tokenizer ../shared/data/gpt2 --input CUT.txt --out dev-out/quality-data \
#     --format lines --val-fraction 0.01
# (9,647,304 train / 98,121 val tokens).
#
# usage: tools/quality/run.sh FORGE DATA OUT [--check]
#   e.g. device run, carrying dev-out (dev-out/bundle.tar.xz from scripts/device-bundle.sh on a
#   CUDA build, and dev-out/quality-data; ~24 MB + the bundle, under the 64 MiB carry limit):
#     bash tools/quality/run.sh dev-out/bin/forge dev-out/quality-data $OUT --check
#     bash tools/quality/run.sh dev-out/bin/forge dev-out/quality-data $OUT
# Environment (defaults): PYTHON=python3 WORK=/tmp/forge-quality STEPS=1000 BATCH=32 SEQ=1024
#   EVAL_EVERY=100 EVAL_WINDOWS=64 FORGE_SEED=1337 (forge's seed: its window order) INIT_SEED=1337
#   SEED_B=1 COMPILE=1 DEVICE=cuda PRECISION=bf16 WINDOW=25 (train-loss smoothing) TAIL=200
#   (steps compared) INIT_ARGS= (more make_init.py arguments: a smaller model for a dry run, e.g.
#   DEVICE=cpu PRECISION=fp32 COMPILE=0 INIT_ARGS="--layers 2 --width 64 --heads 2 --ctx 64"
#   STEPS=30 BATCH=4 SEQ=64 EVAL_EVERY=10 EVAL_WINDOWS=8 WINDOW=5 TAIL=10)
#
# Time on one H200 (estimate, not measured): Forge ~70 s (forge bench train, GPT-2 124M: ~290k
# tokens/s at 16 x 1024, ~568k at 64 x 1024, so ~60-110 ms a step at 32 x 1024); each
# PyTorch run ~40-90 s of torch.compile + ~70-120 s of steps (torch.compile did ~530k tokens/s at
# 64 x 1024; this script syncs once a step to log the loss); ~6-8 minutes in all. If one device
# call cannot hold it, run it twice: the second call skips the stages the first finished (WORK
# stays on a warm machine), or split with STAGES="init forge torchA" then STAGES="torchB plot".
set -uo pipefail

if [[ $# -lt 3 || $# -gt 4 || ( $# -eq 4 && $4 != --check ) ]]; then
  echo "usage: $0 FORGE DATA OUT [--check]" >&2
  exit 2
fi
forge=$1 data=$2 out=$3 check=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
work=${WORK:-/tmp/forge-quality}
device=${DEVICE:-cuda}
# A forge packed by scripts/device-bundle.sh: unpacked here, with the libraries it brings.
[[ ! -e $forge && -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in "$forge" "$data/train_000000.bin" "$data/val_000000.bin"; do
  [[ -e $f ]] || { echo "$0: $f not found" >&2; exit 2; }
done
mkdir -p "$out" "$work" || exit 2
status=0

if [[ $check == --check ]]; then
  init=$work/check-init run=$work/check-forge
  rm -rf "$init" "$run"
  common=(--steps 20 eval_every=10 eval_windows=8 batch_size=8 grad_accum=2)
  "$py" "$here/make_init.py" --out "$init" --layers 2 --width 128 --heads 2 --ctx 64 --seed 7 \
    > "$out/check-init.log" 2>&1 || { cat "$out/check-init.log"; exit 1; }
  precision=()
  [[ $device == cuda ]] && precision=(--precision fp32)
  "$forge" train --init-from "$init" --data "$data" --out "$run" --device "$device" \
    "${precision[@]}" "${common[@]}" > "$out/check-forge.log" 2>&1 ||
    { tail -5 "$out/check-forge.log"; exit 1; }
  cp "$run/metrics.jsonl" "$out/check-forge.jsonl"
  "$py" "$here/torch_train.py" --init "$init" --data "$data" --out "$out/check-torch.jsonl" \
    --steps 20 --eval-every 10 --eval-windows 8 --batch 8 --grad-accum 2 --precision fp32 \
    --device "$device" > "$out/check-torch.log" 2>&1 || { tail -5 "$out/check-torch.log"; exit 1; }
  "$py" - "$out/check-forge.jsonl" "$out/check-torch.jsonl" <<'PY'
import json, sys
def read(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    return ({r["step"]: r["loss"] for r in recs if "loss" in r and "step" in r},
            {r["step"]: r["grad_norm"] for r in recs if "grad_norm" in r and "step" in r},
            {r["step"]: r["val_loss"] for r in recs if "val_loss" in r})
(f, fn, fv), (t, tn, tv) = read(sys.argv[1]), read(sys.argv[2])
rel = lambda a, b: abs(a - b) / abs(b)
print("step  forge train loss  torch train loss  rel. diff  forge grad norm  torch grad norm")
for s in sorted(f)[:5]:
    print(f"{s + 1:4d}  {f[s]:16.6f}  {t[s]:16.6f}  {rel(f[s], t[s]):9.2e}  {fn[s]:15.6f}  "
          f"{tn[s]:15.6f}")
for s in sorted(fv):
    print(f"val before step {s + 1}: forge {fv[s]:.6f} torch {tv[s]:.6f} "
          f"rel. diff {rel(fv[s], tv[s]):.2e}")
same = len(f) == len(t) == 20 and sorted(f) == sorted(t)
worst = max(rel(f[s], t[s]) for s in f) if same else float("inf")
worst_norm = max(rel(fn[s], tn[s]) for s in f) if same else float("inf")
ok = worst <= 1e-3 and worst_norm <= 1e-3
print(f"check {'PASSED' if ok else 'FAILED'}: {len(f)} steps, largest relative difference "
      f"{worst:.2e} in the train loss, {worst_norm:.2e} in the gradient norm (limit 1e-3)")
sys.exit(0 if ok else 1)
PY
  exit $?
fi

steps=${STEPS:-1000} batch=${BATCH:-32} seq=${SEQ:-1024}
eval_every=${EVAL_EVERY:-100} eval_windows=${EVAL_WINDOWS:-64}
forge_seed=${FORGE_SEED:-1337} seed_b=${SEED_B:-1} precision=${PRECISION:-bf16}
read -ra init_args <<< "${INIT_ARGS:-}"
stages=${STAGES:-init forge torchA torchB plot}
compile=()
[[ ${COMPILE:-1} == 1 ]] && compile=(--compile)
has() { [[ " $stages " == *" $1 "* ]]; }
res=$work/results
settings="steps=$steps batch=$batch seq=$seq eval_every=$eval_every eval_windows=$eval_windows \
forge_seed=$forge_seed seed_b=$seed_b precision=$precision device=$device \
init_seed=${INIT_SEED:-1337} init_args=${INIT_ARGS:-} compile=${COMPILE:-1} \
data=$(cd "$data" && pwd) forge=$(cd "$(dirname "$forge")" && pwd)/$(basename "$forge")"
if [[ -f $res/settings.txt && $(cat "$res/settings.txt") != "$settings" ]]; then
  echo "WORK=$work holds a run with other settings; starting afresh"
  rm -rf "$work/init" "$work/forge-run" "$res"
fi
mkdir -p "$res" && echo "$settings" > "$res/settings.txt" || exit 2
save() { cp -r "$res"/. "$out"/; }  # after every stage: a device call cut short keeps what ran
trap save EXIT
stamp() { save; echo "== $(date -u +%H:%M:%S) $*"; }

if has init && [[ ! -f $work/init/model.safetensors ]]; then
  stamp "make_init.py: GPT-2 124M, seed ${INIT_SEED:-1337} ${INIT_ARGS:-}"
  rm -rf "$work/init"
  "$py" "$here/make_init.py" --out "$work/init" --seed "${INIT_SEED:-1337}" "${init_args[@]}" ||
    exit 1
fi

if has forge && [[ ! -f $res/forge.jsonl ]]; then
  stamp "forge train: $steps steps of $batch x $seq, $device $precision"
  rm -rf "$work/forge-run"
  "$forge" train --init-from "$work/init" --data "$data" --out "$work/forge-run" \
    --device "$device" --precision "$precision" --steps "$steps" batch_size="$batch" seq_len="$seq" \
    eval_every="$eval_every" eval_windows="$eval_windows" seed="$forge_seed" \
    > "$res/forge.log" 2>&1 || status=1
  grep -E "^(model|batch|device|done)" "$res/forge.log"
  if [[ -f $work/forge-run/metrics.jsonl && $status == 0 ]]; then
    cp "$work/forge-run/metrics.jsonl" "$res/forge.jsonl"
    cp "$work/forge-run/config.json" "$res/forge-config.json"
  else
    tail -5 "$res/forge.log"
  fi
fi

torch_run() {  # name, --seed value
  local name=$1 seed=$2
  [[ -f $res/torch-$name.jsonl ]] && return 0
  stamp "torch_train.py $name: --seed $seed, $precision${compile:+, torch.compile}"
  "$py" "$here/torch_train.py" --init "$work/init" --data "$data" --out "$res/torch-$name.part" \
    --steps "$steps" --batch "$batch" --seq-len "$seq" --eval-every "$eval_every" \
    --eval-windows "$eval_windows" --seed "$seed" --forge-seed "$forge_seed" --precision "$precision" \
    --device "$device" "${compile[@]}" > "$res/torch-$name.log" 2>&1
  local rc=$?
  tail -3 "$res/torch-$name.log"
  # Only a finished run counts as done (a killed one would be taken as complete next time).
  if [[ $rc == 0 ]]; then mv "$res/torch-$name.part" "$res/torch-$name.jsonl"; else status=1; fi
}
has torchA && torch_run A forge
has torchB && torch_run B "$seed_b"

if has plot; then
  if [[ -f $res/forge.jsonl && -f $res/torch-A.jsonl && -f $res/torch-B.jsonl ]]; then
    stamp "plot_svg.py"
    "$py" "$here/plot_svg.py" --forge "$res/forge.jsonl" --torch "$res/torch-A.jsonl" \
      --torch "$res/torch-B.jsonl" --out "$res/quality.svg" --window "${WINDOW:-25}" \
      --tail "${TAIL:-200}" --labels "Forge ($precision)" "PyTorch A (Forge's window order)" \
      "PyTorch B (window seed $seed_b)" | tee "$res/summary.txt" || status=1
    echo "results in $out: quality.svg, summary.txt, the runs' JSONL and logs"
  else
    echo "plot: skipped, a run is missing (forge.jsonl, torch-A.jsonl, torch-B.jsonl in $res)"
    status=1
  fi
fi
exit $status
