#!/usr/bin/env bash
# The GPU check as one lent machine's command: the imports checked first, then tools/gpu_check.py
# part by part, each under its own time limit, all results under OUT as each part ends (a part that
# hangs or fails costs none of the others). The cifar10 part gets what is left of SECONDS and sizes
# its schedules to it.
#
#   tools/gpu_session.sh OUT SECONDS [PART ...]      # e.g. tools/gpu_session.sh $OUT 560
#
# Needs data/cifar10-jpeg.tar.xz in the checkout (/data/ is ignored by git: carry it).
set -u
out=${1:?usage: tools/gpu_session.sh OUT SECONDS [PART ...]}
seconds=${2:?usage: tools/gpu_session.sh OUT SECONDS [PART ...]}
shift 2
parts=${*:-env kernel-tests kernel-bench step cifar10}
end=$(( $(date +%s) + seconds ))
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

"$python" - <<'EOF' || { echo "gpu_session: an import the check needs failed"; exit 1; }
import importlib
versions = {name: getattr(importlib.import_module(name), "__version__", "?")
            for name in ("torch", "triton", "torchvision", "numpy", "scipy", "sklearn", "matplotlib", "PIL", "click",
                         "tqdm", "pytest")}
import torch
print("gpu_session: imports ok:", versions, "cuda:", torch.cuda.is_available() and torch.cuda.get_device_name())
EOF

# Measured on an H200: kernel-tests 56 s, kernel-bench over 100 s, step's bf16 and fp32 runs 79 s and
# its --compile run over the 70 s left of 150.
declare -A limit=([env]=60 [kernel-tests]=120 [kernel-bench]=150 [step]=240)
status=0
for part in $parts; do
  left=$(( end - $(date +%s) ))
  if (( left < 30 )); then echo "gpu_session: $part not run, ${left}s left"; status=1; continue; fi
  if [[ $part == cifar10 ]]; then
    budget=$left; extra=(--cifar-seconds $(( left - 25 > 60 ? left - 25 : 60 )))
  else
    budget=${limit[$part]:-$left}; (( budget > left )) && budget=$left; extra=()
  fi
  timeout -k 10 "$budget" "$python" tools/gpu_check.py --out "$out" --part "$part" --work /tmp/gpu_check_work \
    --archive data/cifar10-jpeg.tar.xz "${extra[@]}"
  code=$?
  (( code )) && { echo "gpu_session: $part exit $code (124: over its ${budget}s)"; status=1; }
done
exit $status
