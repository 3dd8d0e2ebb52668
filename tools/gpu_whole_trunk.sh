#!/usr/bin/env bash
# The pretrained backbone trained whole (train_mt.py --trunk trained) on a lent GPU: the CIFAR-10 JPEG
# folder with 250 labels (examples/own_images.py's, as docs/pretrained.md measured the frozen trunk on
# the CPU), CONSISTENCY (fixmatch, a folder's default, or mt), one run per learning rate in LRS at once on the card, its
# schedule sized from a measured step to end within SECONDS; then each run's labels for unlabeled/ and
# what --max-error 5 and 2 accept, scored against the truth file. Everything under OUT as it ends.
#
#   tools/gpu_whole_trunk.sh OUT SECONDS
#
# Needs data/cifar10-jpeg.tar.xz and, where the host lacks them, the weights package and cloup in
# gpu_check/site (both ignored by git: carry them).
set -u
out=$(realpath -m "${1:?usage: tools/gpu_whole_trunk.sh OUT SECONDS}")
seconds=${2:?usage: tools/gpu_whole_trunk.sh OUT SECONDS}
end=$(( $(date +%s) + seconds ))
python=${PYTHON:-python3}
backbone=${BACKBONE:-efficientnet-lite2} size=${SIZE:-160} lrs=(${LRS:-0.01 0.03}) objective=${CONSISTENCY:-fixmatch}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/gpu_check/site${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out" gpu_check
rm -f gpu_check/scores-*.txt
folder=${FOLDER:-gpu_check/own-cifar} truth=${TRUTH:-gpu_check/own-cifar-truth.csv}  # (another: a CPU's trial)
[[ -d $folder ]] || "$python" examples/own_images.py cifar10 --archive data/cifar10-jpeg.tar.xz --out $folder \
  > gpu_check/folder.log 2>&1 || { echo "gpu_whole_trunk: the folder could not be made"; tail -5 gpu_check/folder.log; exit 1; }
train=("$python" train_mt.py --dataset folder --data-dir $folder --backbone "$backbone" --image-size "$size"
       --trunk trained --width 1 --consistency "$objective" --device "${DEVICE:-cuda}")
rm -rf gpu_check/bench  # a step measured now, with these settings
"${train[@]}" --lr "${lrs[0]}" --benchmark 20 --out gpu_check/bench > "$out/benchmark.log" 2>&1 &&
  read -r step steps <<< "$("$python" -c "import json; b = json.load(open('gpu_check/bench/mt_benchmark.json'))
print(b['sec_per_step'], b['steps_per_epoch'])")" ||
  { echo "gpu_whole_trunk: the benchmark failed"; tail -20 "$out/benchmark.log"; exit 1; }
# The runs share the card (measured alone: their steps slow by about SHARE each); what is left after the
# evaluations (EVAL_SECONDS) is their training, 3/4 at constant lr, 1/4 decaying.
epochs=$("$python" -c "
left = $end - $(date +%s) - ${EVAL_SECONDS:-90}; per_epoch = $step * ${SHARE:-1.7} * $steps
total = max(2, int(left / per_epoch)); print(max(1, round(total * 0.75)), max(1, total - round(total * 0.75)))")
read -r constant decay <<< "$epochs"
echo "gpu_whole_trunk: ${step}s a step alone; ${#lrs[@]} runs of $constant + $decay epochs"
# At most 8 files come back from a lent machine: per run its log (training, predictions) and metrics,
# and one file of every score; the labels' CSVs stay in gpu_check/.
for lr in "${lrs[@]}"; do
  ( log="$out/train-$lr.log"
    "${train[@]}" --lr "$lr" --epochs "$constant" --decay-epochs "$decay" --out "gpu_check/whole-$lr" --overwrite > "$log" 2>&1
    cp "gpu_check/whole-$lr/mt_metrics.jsonl" "$out/metrics-$lr.jsonl"
    for e in 5 2; do
      labels="gpu_check/whole-$lr/labels-e$e.csv"
      "$python" evaluate.py --ckpt "gpu_check/whole-$lr/mt_final.pt" --predict $folder/unlabeled --max-error $e \
        --csv "$labels" >> "$log" 2>&1
      echo "lr $lr, --max-error $e: all, then accepted: $("$python" examples/own_images.py score --truth $truth \
        --predictions "$labels" 2>&1 | tail -1); $("$python" examples/own_images.py score --truth $truth \
        --predictions "$labels" --accepted 2>&1 | tail -1)" >> "gpu_check/scores-$lr.txt"
    done ) &
done
wait
cat gpu_check/scores-*.txt | tee "$out/scores.txt"
grep -h "^done" "$out"/train-*.log
