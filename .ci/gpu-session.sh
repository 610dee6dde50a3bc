#!/usr/bin/env bash
# The next lent GPU's checks in one device call, most wanted first, each within its own time and all within 565 s
# of the script's start (the kit's install included), its results under $OUT (docs/benchmarks.md, "For the next
# lent GPU"). From the project's root on the GPU machine, the kit carried:
#   run: bash .ci/gpu-session.sh      carry: [".gpukit"]      timeout_s: 590
# 1. rows 7, 8, 12, 13, 15 and 16 of the GPU matrix, GPT-2 small: each backend's best row and its best-by-hand
#    reference, then torch's and nanoGPT's in CUDA graphs, side by side. Since 548e87b torch's fused attention is
#    cuDNN's kernel on Hopper, as nanoGPT's (1.03x nanoGPT in two runs of their own on an H200, where
#    FlashAttention-2 had made it 1.09x): are both backends within 1.05x of their references in one table, and
#    their ratios (one run a row: the ranking's verdict is undetermined, the noise between runs unmeasured; it
#    takes 3 runs a row, which this budget does not hold); two steps of every row traced by its backend's
#    profiler, untimed (kind by kind: matmul, attention, collective, memory, other) (350 s);
# 2. translation (`small`) on torch's best path: compiled, its masked attentions on cuDNN's kernel now (75 s);
#    Then whether the SDPA kernel torch names for heads 32 to 256 wide is the one a training step runs, and
#    whether inductor's Triton code normalises GPT-2 small's rows in two passes, as the compiled step's row now
#    says (tests, 50 s);
# 3. the obvious command on torch (`mtbench train --model gpt --preset gpt2-small`, 10 steps): does `--dtype auto`
#    train mixed bfloat16, and `--step auto` with `--attention auto` row 8's way (torch-compile, flash-attention,
#    cuDNN's kernel); with two steady steps in torch.profiler's trace (`--profile 2`) (70 s);
# 4. whether JAX's remat frees memory on the GPU, full and keeping the products (50 s each at most); float16 on
#    both, parity and host waits (60 s): what time is left;
# 5. the slow tier, for what time is left (its log keeps the name of every test that ran, `-rA`).
# A check that would get less time than it needs to say anything is skipped, and the summary says so.
# tests/test_gpu_session.py checks, on a CPU, that its commands take their options and that what it reads back
# from their results is what mtbench writes.
# What comes back is 8 files at most: summary.txt, matrix.log, gpu-matrix.md, gpu-matrix.json, obvious.log,
# profiles.tgz, translation.log, slow.log.
set -uo pipefail
. .gpukit/env.sh || exit 1
out=${OUT:-/tmp/gpu-session}; mkdir -p "$out"
deadline=565  # bash's SECONDS count from the script's start: the kit's install is inside the call's 590 s too
within() { local left=$((deadline - SECONDS)); echo $(($1 < left ? $1 : (left > 1 ? left : 1))); }
time_for() {  # time_for SECONDS WHAT: true where that much is left, else the summary says WHAT was skipped
  (( deadline - SECONDS >= $1 )) && return 0
  echo "skipped, $((deadline - SECONDS)) s left: $2" | tee -a "$out/summary.txt"; return 1
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  KERAS_BACKEND=jax python3 -c "import jax, torch, keras; print('jax', jax.__version__, jax.devices()); print('torch', torch.__version__, torch.version.cuda); print('keras', keras.__version__)"
  git log -1 --format='commit %h %s' 2>/dev/null
} > "$out/summary.txt" 2>&1; cat "$out/summary.txt"

seconds=$(within 350)
timeout "$seconds" python3 benchmarks/gpu_matrix.py --budget $((seconds - 20)) --presets gpt2-small \
  --rows 7,8,12,13,15,16 --repeats 1 --steps 100 --profile 2 --out /tmp/gpu-session-matrix > "$out/matrix.log" 2>&1
tail -40 "$out/matrix.log"
cp /tmp/gpu-session-matrix/gpu-matrix.md /tmp/gpu-session-matrix/gpu-matrix.json "$out/" 2>/dev/null

# Translation on torch's best path, its masked attention on cuDNN's kernel now: compiled, every kind checked.
timeout "$(within 75)" python3 -m mtbench train --backend torch --preset small --extra torch-compile \
  --extra flash-attention --steps 40 --measure-only --report none --out /tmp/gpu-session-small.json \
  > "$out/translation.log" 2>&1
python3 -c "import json; r = json.load(open('/tmp/gpu-session-small.json')); print('translation:', r['model']['attention'],
r['extras_record']['flash-attention'].get('kernels'), r['timing']['step_s_median'], r['memory'].get('peak_device_bytes'))" \
  2>&1 | tee -a "$out/summary.txt"

# Whether the kernel torch is asked about for a model's heads (32 to 256 wide) is the one SDPA then runs in a
# training step (20 s),
# and whether Triton's code normalises 768-wide rows in two passes, as the compiled step's row says (20 s).
timeout "$(within 50)" python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/plugins/backends/test_inductor_norms.py \
  "tests/plugins/backends/test_attention_choice.py::test_on_a_gpu_the_kernel_named_for_a_models_heads_is_the_one_sdpa_runs" \
  2>&1 | tail -5 | tee -a "$out/summary.txt"

if time_for 45 "the obvious command"; then
  timeout "$(within 70)" python3 -m mtbench train --backend torch --model gpt --preset gpt2-small --batch-size 16 \
    --steps 10 --profile 2 --measure-only --report none --out /tmp/gpu-session-obvious.json > "$out/obvious.log" 2>&1
  python3 -c "import json; from mtbench.figures import profile_operations_text as ops
r = json.load(open('/tmp/gpu-session-obvious.json')); print('obvious command:', r['extras'], r['dtype_chosen'],
r['train_step'], r['train_step_chosen'], r['model']['attention'].get('chosen'), r['timing']['step_s_median'])
print('obvious command, profiled steps:', ops(r))" \
    2>&1 | tee -a "$out/summary.txt"
fi
# Every trace in one file (JAX's host.trace.json.gz repeats its perfetto_trace.json.gz), the rows' by their result.
(cd /tmp && find gpu-session-matrix gpu-session-obvious.run -path '*/profile/*' -type f ! -name '*.trace.json.gz' \
  | tar czf "$out/profiles.tgz" -T -) 2>/dev/null

# Whether JAX's remat frees memory on the GPU (XLA:CPU's does not): the run's check compiles the model's gradient
# recomputing and keeping, and records what XLA holds each way (`extras_record.remat`), or says why it stops.
for policy in full matmuls; do
  time_for 30 "jax remat $policy" || break
  timeout "$(within 50)" python3 -m mtbench train --backend jax --model gpt --preset gpt2-small --batch-size 16 \
    --steps 2 --extra remat --remat-policy $policy --measure-only --report none --out /tmp/gpu-session-remat.json \
    > /tmp/gpu-session-remat.log 2>&1
  { tail -2 /tmp/gpu-session-remat.log; python3 -c "import json; r = json.load(open('/tmp/gpu-session-remat.json'))
print('jax remat $policy:', r['extras_record'].get('remat'), r['timing']['step_s_median'], r['memory'])"; } 2>&1 \
    | tee -a "$out/summary.txt"
  rm -f /tmp/gpu-session-remat.json
done

# float16 with loss scaling (GPUs without bfloat16): JAX beside torch from the same weights, parity and host waits.
if time_for 30 "float16 compare"; then
  timeout "$(within 60)" python3 -m mtbench compare --backends jax,torch --step eager --dtype mixed_float16 \
    --model gpt --preset tiny --steps 40 --measure-only --report none --out /tmp/gpu-session-f16.json \
    > /tmp/gpu-session-f16.log 2>&1
  { tail -3 /tmp/gpu-session-f16.log; python3 -c "import json; c = json.load(open('/tmp/gpu-session-f16.json'))
print('float16:', c.get('parity'), [(r['result']['loss_scaling'], r['result']['host_syncs_per_step'],
r['result']['timing']['step_s_median']) for r in c['runs']])"; } 2>&1 | tee -a "$out/summary.txt"
fi

if time_for 40 "the slow tier"; then
  . .ci/gpu-test-plugins.sh
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -s INT "$(within 150)" python3 -m pytest -q -n 12 --dist loadfile \
    -p no:cacheprovider -m slow -rA --tb=short tests > "$out/slow.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/slow.log" | tail -30
fi
