#!/usr/bin/env bash
# Everything plait checks and measures on one NVIDIA GPU, in one command (a lent GPU machine is
# held by the minute): the GPU tests, the training-step benchmark, the inference suite, the
# exported programs' loads (benchmarks/export_cuda.py) and the inference profile.
#
#   bash benchmarks/cuda_run.sh tests training suite export profile   # any subset, in order
#
# Logs and JSON land in $OUT (or benchmarks/out/cuda when OUT is unset); the run goes on past a
# failing stage and exits non-zero when any stage failed.
set -u
OUT=${OUT:-benchmarks/out/cuda}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
status=0
for stage in "$@"; do
  start=$(date +%s)
  limit=${STAGE_TIMEOUT_S:-3600}  # NOTE: a stage past it is stopped; the next one runs
  case $stage in
    tests) timeout "$limit" python3 -m pytest -q -p no:cacheprovider tests/gpu tests/export/test_cuda.py 2>&1 | tee "$OUT/tests.log" ;;
    training) timeout "$limit" python3 -m benchmarks.training_cuda --out "$OUT" ${TRAINING_ARGS:-} 2>&1 \
             | tee "$OUT/training.log" ;;
    suite) timeout "$limit" python3 -m benchmarks.cuda_suite --out "$OUT" ${SUITE_ARGS:-} 2>&1 \
             | tee "$OUT/suite.log" ;;
    export) timeout "$limit" python3 -m benchmarks.export_cuda --out "$OUT" ${EXPORT_ARGS:-} 2>&1 \
             | tee "$OUT/export.log" ;;
    profile) timeout "$limit" python3 -m benchmarks.cuda_profile --out "$OUT" ${PROFILE_ARGS:-} 2>&1 \
             | tee "$OUT/profile.log" ;;
    *) echo "unknown stage $stage (tests, training, suite, export, profile)"; status=2; continue ;;
  esac
  rc=${PIPESTATUS[0]}
  echo "== stage $stage: exit $rc in $(( $(date +%s) - start )) s"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
