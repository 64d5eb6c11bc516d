#!/bin/bash
# The GPU checks of issue 35, each bounded in time, each result saved:
#   bash benchmarks/gpu_checks.sh [ROOT [STAGE ...]]      (ROOT: benchmarks/results; stages: tests decode update round-static)
# Everything a call writes goes to ROOT/<UTC date>-<card slug>/ (benchmarks/raw_output.py folder; the processor, e.g.
# amd-epyc-avx512bf16, on a machine without a GPU): card.txt (the card, driver, CUDA and the packages' versions), and for each stage <stage>.log (all it
# printed, its commands' stderr included) and <stage>.json, written by benchmarks/raw_output.py run: the stage's
# benchmark result (or test run) after a raw_output section with the card, driver, CUDA, torch / transformers / peft
# versions, the command line and settings, the git commit and whether the tree was dirty, the UTC times and every
# phase's seconds. A stage of two runs names the second <stage>.<what>.json (waits.tests, kernels.tests,
# decode-compile.profile). On a lent machine (no .git) set FEDAGENT_GIT_COMMIT and FEDAGENT_GIT_DIRTY where the call
# starts: FEDAGENT_GIT_COMMIT=$(git rev-parse HEAD) FEDAGENT_GIT_DIRTY=$(git status --porcelain | wc -l) bash ...
# Stages, in the order given:
#   tests         the static engine's CUDA graphs against the transformers loop and against eager, with eager and with
#                 compiled kernels (tests/agent/test_decode.py -k cuda)
#   ranks         a client's round through the rank launcher on NCCL: one rank on one card, two where the machine has
#                 two GPUs (skipped with its reason otherwise; tests/methods/test_ranked_round.py -k nccl)
#   waits         the log-prob and update passes do not synchronize with the host between micro-batches
#                 (tests/agent/test_device_waits.py, on CUDA under torch.cuda.set_sync_debug_mode), and the fused AdamW
#                 steps as the reference loop does (tests/agent/test_grpo.py); then, side by side, update_profile.py at
#                 FAST's settings without and with the old waits put back (host-waits=true), and without again (the
#                 order's effect); then an optimizer step every micro-batch (minibatch 16, 8 steps) with the fused
#                 AdamW and with PyTorch's default (fused-adamw=false); then every layer checkpointed (the paper
#                 preset's engine.gradient-checkpointing=true), engine.gradient-checkpointing=auto, and a bf16 working copy over fp32
#                 master weights instead of autocast (engine.param-dtype=bf16)
#   decode        decode_profile.py: ms per token step of each engine, the numerical gaps, an operator table of 8 steps
#   decode-compile step_kernels.py: the static engine's token steps alone (CUDA graphs) with rollout.kernels=compile
#                 (element-wise work fused by torch.compile) and eager, alternating over 6 runs: ms with standard
#                 errors, a paired test, the first run's seconds (compilation); then decode_profile.py --compile: the
#                 same beside the hf loop, with an operator table of 4 steps each
#   round-compile round-fast with rollout.kernels=compile: the compilation lands in capture_s, the token steps apart
#   prefill       prefill_profile.py: a later turn's prefill of 16 tasks x 8 episodes, each group's shared prefix computed
#                 once (what the rollout runs) beside every prompt whole, and the log-prob gap between the two
#   update        update_profile.py: log-prob and update MFU by micro-batch setting and attention kernel, one micro-batch
#                 profiled
#   round-static  one client epoch on the 1.5B shape with the static engine (gpu_round.py)
#   round-hf      the same with the transformers loop
#   round-fast    round-static with the update settings that measured fastest (FAST below): log-prob passes of 64 rows,
#                 update micro-batches of 16, length-grouped
#   kernels       engine.training-kernels (agent/engine/kernels.py): its tests (Liger's against eager on the GPU), then update_profile.py
#                 with FAST's settings under eager, compile and liger (liger needs the liger-kernel wheel in .whl/)
#   round-kernels round-fast with the engine.training-kernels choice that kernels measured fastest (log-probs + update);
#                 run it after kernels, in the same call
#   round-auto    a whole paper-size epoch (64 tasks x 8 = 512 episodes) at FAST's settings with rollout.generation-batch-size=0
#                 and engine.gradient-checkpointing=auto: the rows the memory plan fits in the card's free memory (up to 512),
#                 the layers each micro-batch checkpoints in the room the plan leaves, the plan against the peak there,
#                 and the paper-round estimate at those rows (about 4 minutes on an H100, estimated)
#   passes        update_profile.py at FAST's settings with fewer, fuller update passes: micro-batches of 16 rows (FAST)
#                 and 32, grpo.ppo-max-token-len-per-gpu (passes cut by padded tokens) of 12,288 (4 passes of the 128 samples, no
#                 layer checkpointed in the plan), also with the log-prob passes cut at 65,536 tokens
#                 (grpo.log-prob-max-token-len-per-gpu: one pass of the 128 samples, against two of 64 rows), and of 28,672
#                 under engine.gradient-checkpointing=auto (one pass a minibatch of 64), also with engine.param-dtype=bf16 (on an
#                 H100 the update's MFU rose from 13.5 % to about 21 % when micro-batches went from 8 rows to 16,
#                 across calls)
#   round-passes  round-fast with the pass setting that passes measured fastest (log-probs + update); run it after
#                 passes, in the same call
#   wait-tests    the waits stage's tests alone (no host waits inside the passes on CUDA, fused AdamW against the loop,
#                 the bf16 working copy's master weights)
#   levers        one update_profile.py process with every lever built since the last GPU measurement, side by side at
#                 FAST's settings: FAST; the old host waits put back; the old 4-D padding mask put back;
#                 engine.param-dtype=bf16; micro-batches of 32 rows;
#                 grpo.ppo-max-token-len-per-gpu=12288 with log-prob passes of 65,536 tokens, in fp32 and bf16 working weights;
#                 28,672 under engine.gradient-checkpointing=auto, fp32 and bf16; 32 rows in bf16; FAST again (the order's
#                 effect); bf16 with Liger's kernels (last: Liger patches the model for good; left out without the
#                 liger-kernel wheel in .whl/, which the run config needs for it). Built for a session with one call's device time: it
#                 stands for waits' and passes' profiles in one process
#   round-levers  round-fast with the fastest levers variant (log-probs + update); run it after levers, in the same call
#   profile-fast  update_profile.py's operator table of one micro-batch (forward and backward) at FAST's settings, eager:
#                 where the update's time goes at the settings a round uses (the update stage profiles micro-batches of 8)
# Seen on an H100 (2026-11-27): a gpu_round call took about 130 s with the static engine and 200 s with hf; the
# kernels stage about 165 s on a fresh machine (its tests 90 s). 2026-11-28 (H100): wait-tests 20-25 s, levers (11
# variants then) 60-65 s, a round about 100 s; `wait-tests levers round-levers round-fast` 291 s after the wheels' install.
# On a lent machine, carry the wheels scripts/gpu_wheels.sh downloads (.whl) and install them first (docs/gpu.md).
# ROUND_SET sets run-config values in every round, over the stage's own, e.g. ROUND_SET="--set grpo.ppo-micro-batch-size-per-gpu=32".
# A round's --paper-round estimates a round on ALFWorld (configs/fedagent-paper.toml) and on WebShop (no preset: that
# file with WebShop's 15 steps of 128 tokens) at grpo.tasks-per-epoch=64, each with a table of the settings it used where the
# preset's differ; without the alfworld package (a lent machine's image) ALFWorld's is marked skipped.
# SHAPE=tiny runs every stage on a CPU in seconds: the plumbing, not the numbers (tests/benchmarks/test_gpu_checks.py).
set -u
ROOT=${1:-benchmarks/results}; shift || true
STAGES=${*:-tests decode update round-static}
KNOWN="tests ranks waits decode decode-compile round-compile prefill update round-static round-hf round-fast round-auto kernels round-kernels passes round-passes wait-tests levers round-levers profile-fast"
for stage in $STAGES; do  # every name checked before anything runs
  case " $KNOWN " in *" $stage "*) ;; *) echo "unknown stage $stage ($KNOWN)"; exit 2 ;; esac
done
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD:$PWD/benchmarks
DIR=$(python3 benchmarks/raw_output.py folder "$ROOT") || exit 1
mkdir -p "$DIR"
echo "writing to $DIR"
python3 benchmarks/raw_output.py card | tee "$DIR/card.txt"
# a wheel missing from the carried folder fails here, in seconds, instead of in every stage (tomli did, 2026-12-05)
python3 -c "import fedagent_flwr.simulation, fedagent_flwr.server_app, fedagent_flwr.client_app" \
  || { echo "the app does not import here: a package missing? (scripts/gpu_wheels.sh)"; exit 1; }
T0=$(date +%s)
SHAPE=${SHAPE:-1.5b}  # SHAPE=tiny runs every stage on a CPU in seconds: the plumbing, not the numbers
# update_profile.py's passes at the precision a GPU resolves auto to (bf16-mixed), also on a CPU, where auto is fp32
# and the run config refuses the bf16 working copy (engine.param-dtype=bf16) that several variants set
PROFILE_SHAPE="--shape $SHAPE"
[ "$SHAPE" = tiny ] && PROFILE_SHAPE="--shape tiny --set precision=bf16-mixed"
ROUND="--shape $SHAPE --set grpo.tasks-per-epoch=16 --set grpo.num-generations=8 --set engine.logprob-chunk-tokens=1024 --paper-round --paper-set grpo.tasks-per-epoch=64 --json"
UPDATE_PASSES8="engine.logprob-chunk-tokens=1024,grpo.group-by-length=true"
UPDATE_COMMON="grpo.ppo-micro-batch-size-per-gpu=8,$UPDATE_PASSES8"
UPDATE_VARIANTS=(--variant $UPDATE_COMMON,cudnn-attention=true
                 --variant $UPDATE_COMMON
                 --variant grpo.ppo-micro-batch-size-per-gpu=16,$UPDATE_PASSES8
                 --variant $UPDATE_COMMON,grpo.log-prob-micro-batch-size-per-gpu=64)
# FAST's passes but their rows: update_profile.py refuses a key set twice, so a variant of other rows starts from here
UPDATE_PASSES="grpo.log-prob-micro-batch-size-per-gpu=64,engine.logprob-chunk-tokens=1024,grpo.group-by-length=true"
UPDATE_FAST="grpo.ppo-micro-batch-size-per-gpu=16,$UPDATE_PASSES"
FAST="--set grpo.log-prob-micro-batch-size-per-gpu=64 --set grpo.ppo-micro-batch-size-per-gpu=16 --set grpo.group-by-length=true"
# Liger's variants only where its package is installed (LIGER=1 scripts/gpu_wheels.sh): the run config refuses
# engine.training-kernels=liger without it, and with it the whole update_profile.py call
python3 -c "import liger_kernel" 2>/dev/null && LIGER=1 || LIGER=
liger() { [ -n "$LIGER" ] && echo "--variant $1"; }
# bench NAME SECONDS ARGS...: `python3 ARGS` within SECONDS through raw_output.py, its raw output to $DIR/NAME.json
# (DRY=1: the command printed, not run: tests/benchmarks/test_gpu_checks.py parses every stage's arguments so)
bench() {
  name=$1 seconds=$2; shift 2
  [ -n "${DRY:-}" ] && { echo "DRY $name: python3 $*"; return; }
  python3 benchmarks/raw_output.py run "$DIR/$name.json" --stage "$stage" -- timeout "$seconds" python3 "$@"
  echo "rc $?"
}
wait_tests() {
  bench "$1" 120 -m pytest -q -p no:cacheprovider -p no:logging tests/agent/test_device_waits.py \
    "tests/agent/test_grpo.py::test_on_a_gpu_the_update_takes_fused_adamw_steps_equal_to_the_reference_loop" \
    tests/agent/test_master_weights.py
}
# merged ARGS...: the arguments with each `--set KEY=...` kept at its last value only (gpu_round.py refuses a key set
# twice): a stage's own values override FAST's and ROUND's, and ROUND_SET's override them all
merged() {
  local args=("$@") out=() i j
  for ((i = 0; i < ${#args[@]}; i++)); do
    if [ "${args[i]}" = --set ]; then
      for ((j = i + 2; j < ${#args[@]}; j++)); do
        [ "${args[j]}" = --set ] && [ "${args[j+1]%%=*}" = "${args[i+1]%%=*}" ] && { i=$((i + 1)); continue 2; }
      done
    fi
    out+=("${args[i]}")
  done
  echo "${out[@]}"
}
# round_bench NAME SECONDS ARGS...: gpu_round.py at ROUND's settings with ARGS (and ROUND_SET) over them
round_bench() {
  name=$1 seconds=$2; shift 2
  bench "$name" "$seconds" benchmarks/gpu_round.py $(merged $ROUND "$@" ${ROUND_SET:-})
}
# round_at_fastest WHAT RESULT: a round at FAST's settings with the fastest variant of an update_profile.py result
round_at_fastest() {
  # the variant holds FAST's keys (every one starts from UPDATE_FAST) and overrides them
  best=$(python3 benchmarks/fastest_variant.py "$2" --sets) || { echo "no $1 result to pick from"; return; }
  echo "fastest $1: $best"
  round_bench "$stage" 200 $FAST $best --decode-engine static
}
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
run_stage() {
  case $1 in
    tests)
      bench tests 150 -m pytest -q -p no:cacheprovider tests/agent/test_decode.py -k cuda ;;
    ranks)
      bench ranks 150 -m pytest -q -rs -p no:cacheprovider tests/methods/test_ranked_round.py -k nccl ;;
    decode-compile)
      bench decode-compile 150 benchmarks/step_kernels.py --shape $SHAPE --rows 128 --prompt-tokens 512 --steps 32 --runs 6 --json
      bench decode-compile.profile 200 benchmarks/decode_profile.py --shape $SHAPE --compile --profile-tokens 4 --json ;;
    round-compile)
      round_bench round-compile 240 $FAST --set rollout.kernels=compile --decode-engine static ;;
    waits)
      wait_tests waits.tests
      bench waits 240 benchmarks/update_profile.py $PROFILE_SHAPE --prompt-tokens 180 --variant $UPDATE_FAST \
        --variant $UPDATE_FAST,host-waits=true --variant $UPDATE_FAST --variant $UPDATE_FAST,grpo.mini-batch-size=16 \
        --variant $UPDATE_FAST,grpo.mini-batch-size=16,fused-adamw=false --variant $UPDATE_FAST,engine.gradient-checkpointing=true \
        --variant $UPDATE_FAST,engine.gradient-checkpointing=auto --variant $UPDATE_FAST,engine.param-dtype=bf16 --json ;;
    decode)
      bench decode 120 benchmarks/decode_profile.py --shape $SHAPE --json ;;
    prefill)
      bench prefill 90 benchmarks/prefill_profile.py --shape $SHAPE --json ;;
    update)
      bench update 100 benchmarks/update_profile.py $PROFILE_SHAPE --prompt-tokens 180 --profile "${UPDATE_VARIANTS[@]}" --json ;;
    round-static|round-hf)
      round_bench $1 240 --decode-engine ${1#round-} ;;
    round-fast)
      round_bench round-fast 200 $FAST --decode-engine static ;;
    kernels)
      bench kernels.tests 120 -m pytest -q -p no:cacheprovider tests/agent/test_kernels.py
      bench kernels 300 benchmarks/update_profile.py $PROFILE_SHAPE --prompt-tokens 180 --variant $UPDATE_FAST \
        --variant $UPDATE_FAST,engine.training-kernels=compile $(liger $UPDATE_FAST,engine.training-kernels=liger) --json ;;
    profile-fast)
      bench profile-fast 150 benchmarks/update_profile.py $PROFILE_SHAPE --prompt-tokens 180 --profile --top 25 \
        --variant $UPDATE_FAST --json ;;
    passes)
      bench passes 240 benchmarks/update_profile.py $PROFILE_SHAPE --prompt-tokens 180 --variant $UPDATE_FAST \
        --variant grpo.ppo-micro-batch-size-per-gpu=32,$UPDATE_PASSES --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=12288 \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=12288,grpo.log-prob-max-token-len-per-gpu=65536 \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=28672,engine.gradient-checkpointing=auto \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=28672,engine.gradient-checkpointing=auto,engine.param-dtype=bf16 --json ;;
    round-passes)
      round_at_fastest passes "$DIR/passes.json" ;;
    wait-tests)
      wait_tests wait-tests ;;
    levers)
      bench levers 270 benchmarks/update_profile.py $PROFILE_SHAPE --prompt-tokens 180 --variant $UPDATE_FAST \
        --variant $UPDATE_FAST,host-waits=true --variant $UPDATE_FAST,padding-mask=true \
        --variant $UPDATE_FAST,engine.param-dtype=bf16 --variant grpo.ppo-micro-batch-size-per-gpu=32,$UPDATE_PASSES \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=12288,grpo.log-prob-max-token-len-per-gpu=65536 \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=12288,grpo.log-prob-max-token-len-per-gpu=65536,engine.param-dtype=bf16 \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=28672,engine.gradient-checkpointing=auto \
        --variant $UPDATE_FAST,grpo.ppo-max-token-len-per-gpu=28672,engine.gradient-checkpointing=auto,engine.param-dtype=bf16 \
        --variant grpo.ppo-micro-batch-size-per-gpu=32,$UPDATE_PASSES,engine.param-dtype=bf16 --variant $UPDATE_FAST \
        $(liger $UPDATE_FAST,engine.param-dtype=bf16,engine.training-kernels=liger) --json ;;
    round-levers)
      round_at_fastest levers "$DIR/levers.json" ;;
    round-auto)
      round_bench round-auto 330 $FAST --set grpo.tasks-per-epoch=64 --set rollout.generation-batch-size=0 \
        --set engine.gradient-checkpointing=auto --paper-set rollout.generation-batch-size=0 --paper-set engine.gradient-checkpointing=auto \
        --decode-engine static ;;
    round-kernels)
      best=$(python3 benchmarks/fastest_variant.py "$DIR/kernels.json" engine.training-kernels) || { echo "no kernels result to pick from"; return; }
      echo "fastest engine.training-kernels: $best"
      round_bench round-kernels 200 $FAST --set engine.training-kernels=$best --decode-engine static ;;
  esac
}
for stage in $STAGES; do
  # the console leaves out the profiler's start-up noise; the stage's log keeps everything
  { stamp "$stage"; run_stage "$stage"; } 2>&1 | tee -a "$DIR/$stage.log" | grep --line-buffered -v "USDT\|profiler_st"
done
stamp done
