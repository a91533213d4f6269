#!/usr/bin/env bash
# Runs fuzz targets on their seed corpora: fuzz/run.sh SECONDS [TARGET...] (default: all).
#
#   BUILD=build-fuzz   where the targets are (cmake --preset fuzz && cmake --build --preset fuzz
#                      --target fuzz_targets)
#   WORK=/tmp/forge-fuzz  per target: corpus/ (seeds + what the fuzzer adds; kept between runs,
#                      so a second run continues where the first stopped) and findings
#                      (crash-*, leak-*, timeout-*, oom-*) with the log
#
# Seeds: the files of fuzz/corpus/<format>/, the matching test files under tests/data and the
# past findings in fuzz/regressions/<format>-*. One target at a time, in one process (libFuzzer's
# default; -jobs/-workers would fork children that log elsewhere): the CI machine has 2 cores.
# Inputs up to a size that fits the format, 2 GB of memory, 10 s per input. Prints one line per target:
#   fuzz_config: 30 s clean, 123456 runs
# and exits non-zero when any target found something (the reproducer's path is printed; replay
# it with $BUILD/fuzz/<target> <file>).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
build=${BUILD:-build-fuzz}
work=${WORK:-/tmp/forge-fuzz}
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(fuzz_safetensors fuzz_safetensors_index fuzz_config fuzz_model_load
           fuzz_generation_config fuzz_tokenizer_json fuzz_tokenizer_config fuzz_gpt2_vocab
           fuzz_shard fuzz_prompts fuzz_sft fuzz_trainer_state fuzz_settings fuzz_chat_template
           fuzz_openai_request)
fi

# seeds TARGET: the seed files of a target, one path a line.
seeds() {
  local golden=tests/data/hf_golden
  case $1 in
    fuzz_safetensors) ls fuzz/corpus/safetensors/* $golden/*/model.safetensors ;;
    fuzz_safetensors_index) ls fuzz/corpus/safetensors_index/* ;;
    fuzz_config | fuzz_model_load) ls fuzz/corpus/config/* $golden/*/config.json ;;
    fuzz_generation_config) ls fuzz/corpus/generation_config/* $golden/*/generation_config.json ;;
    fuzz_tokenizer_json)
      ls fuzz/corpus/tokenizer_json/* tests/data/tokenizer/post_processor/{bos,bos_eos,byte_level}.json \
         tests/data/tokenizer/sentencepiece/{llama2,mistral}.json ;;
    fuzz_tokenizer_config) ls fuzz/corpus/tokenizer_config/* ;;
    fuzz_gpt2_vocab) ls fuzz/corpus/gpt2_vocab/* ;;
    fuzz_shard) ls fuzz/corpus/shard/* ;;
    fuzz_prompts) ls fuzz/corpus/prompts/* ;;
    fuzz_sft) ls fuzz/corpus/sft/* ;;
    fuzz_chat_template) ls fuzz/corpus/chat_template/* ;;
    fuzz_trainer_state) ls fuzz/corpus/trainer_state/* ;;
    fuzz_settings) ls fuzz/corpus/settings/* ;;
    fuzz_openai_request) ls fuzz/corpus/openai_request/* ;;
    *) echo "fuzz/run.sh: unknown target $1" >&2; return 1 ;;
  esac
}

# The longest input worth trying: the formats' real files are small except tokenizers (a
# SentencePiece tokenizer.json seed is 29 KB) and weights (a golden model is up to 275 KB; 8 KB
# keeps its header and the start of its data: truncation is a case worth fuzzing too).
max_len() {
  case $1 in
    fuzz_tokenizer_json) echo 32768 ;;
    fuzz_safetensors | fuzz_gpt2_vocab) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

status=0
for t in "${targets[@]}"; do
  bin=$build/fuzz/$t
  if [[ ! -x $bin ]]; then
    echo "$t: not built ($bin)"
    status=1
    continue
  fi
  dir=$work/$t
  mkdir -p "$dir/corpus"
  list=$(seeds "$t") || { status=1; continue; }
  # Past findings (fuzz/regressions/<format>-*) stay in the corpus: fixed, and kept fixed.
  list+=" $(ls fuzz/regressions/"${t#fuzz_}"-* 2>/dev/null)"
  # shellcheck disable=SC2086
  cp $list "$dir/corpus/" 2>/dev/null || true
  log=$dir/log.txt
  # Findings of earlier runs move to old/: what is left after this run is this run's.
  mkdir -p "$dir/old"
  mv "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* "$dir/old/" 2>/dev/null
  # Scratch files of the targets (memfds need none) go under the work directory. One OpenMP
  # thread: libFuzzer runs one input at a time, and on a loaded 2-core machine the CPU ops'
  # threads waiting at barriers made one forward pass of a 2-layer model take over 10 s
  # (fuzz_model_load's first seed timed out; 0.2 s with one thread).
  OMP_NUM_THREADS=1 TMPDIR=$dir "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 \
    -timeout=10 -max_len="$(max_len "$t")" -dict="$root/fuzz/dict/forge.dict" \
    -artifact_prefix="$dir/" -print_final_stats=1 "$dir/corpus" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  finding=$(ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* 2>/dev/null | head -1)
  if ((rc == 0)) && [[ -z $finding ]]; then
    echo "$t: $seconds s clean, ${runs:-?} runs"
  else
    echo "$t: FOUND a problem after ${runs:-?} runs (exit $rc): ${finding:-see $log}"
    grep -m2 -E '^fuzz:|runtime error|ERROR: (Address|Leak|libFuzzer: (out-of-memory|timeout))' "$log" ||
      tail -5 "$log"
    status=1
  fi
done
exit $status
