#!/usr/bin/env bash
# The GPU check as one lent machine's command: the imports checked first, then tools/gpu_check.py
# part by part, each under its own time limit, all results under OUT as each part ends (a part that
# hangs or fails costs none of the others). The cifar10 part gets what is left of SECONDS and sizes
# its schedules to it. CIFAR-10 is decoded in the background (the cifar10-data part, on the CPU),
# on the upper half of the cores while the other parts run on the lower half, whenever cifar10-data
# or cifar10 is named; cifar10 waits for it, and a session that names cifar10-data waits for it at
# its end (a later call on the same warm machine then trains at once). Arguments after -- go to
# every gpu_check.py call.
#
#   tools/gpu_session.sh OUT SECONDS [PART ...] [-- GPU_CHECK_OPTION ...]
#   tools/gpu_session.sh $OUT 560
#   tools/gpu_session.sh $OUT 290 env step cifar10-data    # then, at once on the warm machine:
#   tools/gpu_session.sh $OUT 570 cifar10
#
# Needs data/cifar10-jpeg.tar.xz in the checkout (/data/ is ignored by git: carry it).
set -u
out=${1:?usage: tools/gpu_session.sh OUT SECONDS [PART ...]}
seconds=${2:?usage: tools/gpu_session.sh OUT SECONDS [PART ...] [-- OPTION ...]}
shift 2
parts=()
while (( $# )) && [[ $1 != -- ]]; do parts+=("$1"); shift; done
(( $# )) && shift
options=("$@")
(( ${#parts[@]} )) || parts=(env step cifar10)
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

# Measured on an H200: kernel-tests 56 s, kernel-bench over 100 s, the eager step's bf16 and fp32 runs
# 79 s and its --compile run about 70 s; the step part's six runs and the equivalence check are
# estimated at about 250 s (not measured yet). STEP_SECONDS sets the step's limit for fewer runs.
declare -A limit=([env]=60 [kernel-tests]=120 [kernel-bench]=150 [step]=${STEP_SECONDS:-270})
# The work folder is in the checkout (/gpu_check/ is ignored): a later call on the same warm machine finds
# the decoded CIFAR-10 and the step part's results there.
check=(tools/gpu_check.py --out "$out" --work gpu_check/work --archive data/cifar10-jpeg.tar.xz "${options[@]}")
status=0 prep=0 lower=() upper=()
cores=$(nproc)
if (( cores >= 4 )) && command -v taskset >/dev/null; then
  lower=(taskset -c 0-$(( cores / 2 - 1 ))) upper=(taskset -c $(( cores / 2 ))-$(( cores - 1 )))
fi
named_data=0
[[ " ${parts[*]} " == *" cifar10-data "* ]] && named_data=1
if (( named_data )) || [[ " ${parts[*]} " == *" cifar10 "* ]]; then
  mkdir -p "$out"
  "${upper[@]}" timeout -k 10 "$seconds" "$python" "${check[@]}" --part cifar10-data &
  prep=$!
fi
for part in "${parts[@]}"; do
  [[ $part == cifar10-data ]] && continue  # in the background, above
  if [[ $part == cifar10 ]] && (( prep )); then
    wait $prep || { echo "gpu_session: cifar10-data failed: cifar10 decodes for itself"; status=1; }
    prep=0
  fi
  left=$(( end - $(date +%s) ))
  if (( left < 30 )); then echo "gpu_session: $part not run, ${left}s left"; status=1; continue; fi
  if [[ $part == cifar10 ]]; then
    budget=$left; extra=(--cifar-seconds $(( left - 25 > 60 ? left - 25 : 60 )))
  else
    budget=${limit[$part]:-$left}; (( budget > left )) && budget=$left; extra=()
  fi
  pin=()
  (( prep )) && kill -0 $prep 2>/dev/null && pin=("${lower[@]}")  # apart from the decoding
  timeout -k 10 "$budget" "${pin[@]}" "$python" "${check[@]}" --part "$part" "${extra[@]}"
  code=$?
  (( code )) && { echo "gpu_session: $part exit $code (1: it failed or missed a target; 124: over its ${budget}s)"
                  status=1; }
done
if (( prep )); then
  if (( named_data )); then
    wait $prep || { echo "gpu_session: cifar10-data failed"; status=1; }
  else
    kill $prep 2>/dev/null; wait $prep
  fi
fi
exit $status
