#!/usr/bin/env bash
# --device on a machine with an NVIDIA GPU (issue 55 item 1): one epoch of behaviour cloning with
# --device cuda and with --device cpu from the same seed, the CUDA checkpoint driven for one
# episode on the GPU, the two first-epoch losses checked against each other, and the training
# speed of each printed; then the other verbs that run a network, each on CUDA on small sizes
# (saliency of the drive's trace, explain, export with its onnxruntime check against torch on
# CUDA, expert eval): a tensor left on the wrong device fails outright. Not run by the tests
# (they have no GPU).
#
#   bash benchmarks/gpu_check.sh [OUT]     # OUT: a new folder (default runs/gpu-check); from a checkout
#
# Data: 8 synthetic CarRacing episodes of 400 frames (tests/support/demos.py: a bright band tells the
# action), so the check needs no simulator to collect; the drive needs CarRacing (box2d).
#
# Parity: both runs sample the same windows in the same order and start from the same weights (the
# policy is built on the CPU from the seed, then moved). They still differ in the dropout masks (CUDA
# draws from its own generator), in cuDNN's TF32 convolutions and in the order of float sums (the CPU
# run's NAC goes through the numba kernels, the GPU's through the eager torch code), so the losses are
# not bitwise equal. The check: |loss_cuda - loss_cpu| <= 0.05 + 10% of loss_cpu on the first epoch's
# mean training loss (cross-entropy over 5 actions, ~1.6 at the start). A batch left on the wrong
# device fails outright; wrong labels, frames or a step that does not learn give a loss far outside.
#
# Frames/s: metrics.csv's frames_per_s of the epoch (windows x window frames a second, with cuDNN's
# first-call costs inside the CUDA figure). BENCHMARKS.md has no GPU figure yet: this prints it.
set -euo pipefail

OUT=${1:-runs/gpu-check}
if [ -e "$OUT" ]; then echo "$OUT exists: give a new folder" >&2; exit 1; fi
if ! python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "torch sees no CUDA GPU here: nothing to check" >&2; exit 1
fi
DATA="$OUT/demos"
python - "$DATA" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
import support_path  # noqa: F401  (tests/support on the path)
from demos import synthetic_episodes
from nac_drive.data_collection.carracing_dataset import write_dataset

write_dataset(sys.argv[1], "synthetic", synthetic_episodes(8, 400), "CarRacing-v3", expert="bands",
              description="benchmarks/gpu_check.sh")
PY

TRAIN=(--data "$DATA" --out "$OUT/runs" --epochs 1 --windows-per-epoch 2048 --batch-size 32 --seed 0 --no-progress)
nac-drive train "${TRAIN[@]}" --run-name cuda --device cuda
nac-drive train "${TRAIN[@]}" --run-name cpu --device cpu
nac-drive drive carracing --policy "$OUT/runs/cuda/best" --device cuda --episodes 1 --max-steps 300 \
  --trace "$OUT/drive"
nac-drive saliency "$OUT/drive" --policy "$OUT/runs/cuda/best" --device cuda
nac-drive explain --device cuda --episodes 1 --max-steps 150 --frames 150 --saliency-frames 4 \
  --closed-loop-tracks 1 --closed-loop-top 1 --closed-loop-random 1 --out "$OUT/explain"
nac-drive export --device cuda "$OUT/policy.onnx"   # prints onnxruntime vs torch on CUDA
nac-drive expert eval --device cuda --episodes 1 --max-steps 300

python - "$OUT/runs/cuda/metrics.csv" "$OUT/runs/cpu/metrics.csv" <<'PY'
import csv
import sys

cuda, cpu = (next(csv.DictReader(open(path))) for path in sys.argv[1:])
loss_cuda, loss_cpu = float(cuda["train_loss"]), float(cpu["train_loss"])
tolerance = 0.05 + 0.10 * loss_cpu
print(f"first-epoch training loss: cuda {loss_cuda:.4f}, cpu {loss_cpu:.4f}, |difference| "
      f"{abs(loss_cuda - loss_cpu):.4f} (tolerance {tolerance:.4f})")
print(f"training frames/s: cuda {float(cuda['frames_per_s']):.0f}, cpu {float(cpu['frames_per_s']):.0f} "
      f"({float(cuda['frames_per_s']) / float(cpu['frames_per_s']):.1f}x)")
if abs(loss_cuda - loss_cpu) > tolerance:
    sys.exit("the CUDA and CPU runs disagree beyond the tolerance")
PY
