#!/usr/bin/env bash
# The GPU checks (issues 23 and 30) in one run on a machine with a CUDA GPU, numpy, torch and
# pyyaml (no Spark, TorchRec or FBGEMM needed): a self-check of the host-memory mapping, then
# `recshard calibrate`, then every prepared share of benchmarks/gpu_step_bench.py. Results go to
# $OUT (default gpu_out/) as they come, so a run cut short keeps what it measured: at most 7
# files (the device tool brings back 8), the logs on standard output.
#   INPUTS=bench_inputs CAL_BUDGET=150 BENCH_BUDGET=300 REPEAT=2 benchmarks/gpu_session.sh
#   CALIBRATE=0 ... skips the calibration (plans solved under a calibration measured before)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# pin host memory with several threads (GiBs take seconds each)
export PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 - <<'PY' 2>&1
import numpy as np, torch
from recshard_stats.lookup_kernels import KernelGroup, WeightPools, time_groups
pools = WeightPools("cuda", 1 << 20, 1 << 20)
w = pools.weights("host", 1000, 16)
w.fill_(1.0)
group = KernelGroup.of(w, np.arange(0, 1000, 7), np.arange(0, 143, 11))
out = torch.nn.functional.embedding_bag(group.ids, group.weights, group.offsets, mode="sum")
assert abs(float(out[0, 0]) - 11.0) < 1e-6, out[0, 0]
t = time_groups([group], 3)
host_view = pools._host_pinned[:16000].view(1000, 16)
assert float(host_view[0, 0]) != 1.0, "the step did not write the host rows in place"
print("selfcheck ok:", torch.__version__, torch.cuda.get_device_name(), t)
PY
[ $? -eq 0 ] || { echo "selfcheck failed: nothing measured"; exit 3; }
if [ "${CALIBRATE:-1}" = 1 ]; then
  python3 -m recshard_stats.cli calibrate --out "$OUT/h200.yaml" --budget-s "${CAL_BUDGET:-150}" --host-gib 8 \
      --measurements "$OUT/calibration_measurements.jsonl" 2>&1 | tee "$OUT/calibrate.log"
fi
# REPEAT runs of every share (default 2): their spread is the measurement's own noise
for run in $(seq 1 "${REPEAT:-2}"); do
  python3 benchmarks/gpu_step_bench.py measure --inputs "${INPUTS:-bench_inputs}" --out "$OUT/step_results_$run.jsonl" \
      --budget-s "${BENCH_BUDGET:-300}" 2>&1
done
