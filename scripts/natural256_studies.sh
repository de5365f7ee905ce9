#!/usr/bin/env bash
# The paper's claims judged again on natural256 (issue 49, studies (a) and (c)); resumable: rerun the same line.
# RUN: a scratch directory outside the repository. Two gloo ranks, one thread each.
set -euo pipefail
RUN=${RUN:-/work/runs/natural256_studies}
IMAGES=${IMAGES:-1000}
TR="torchrun --nproc-per-node 2 --master-port ${PORT:-29541} -m coolsd"
# (c) the paper's Table 1: the EAGLE-1 static 25-node tree (top-k candidates, as the releases), Cool-SD against
# LANTERN++ with k = 10 neighbours (the paper's), lambda 2, 3, 5, with its own resampler and with G*
STATIC="vanilla cool-sd:delta=1.25,3,16 lantern++:lambda=2,3,5:k=10:resampler=lantern,optimal"
$TR sweep --model natural256 --draft eagle --tree eagle25 --tree-candidates topk --grid $STATIC \
    --images $IMAGES --unit-images 100 --batch-size 50 --no-progress --out $RUN/static
python scripts/trees_fidelity.py --static $RUN/static --out $RUN/trees_fidelity
# (a) the chain frontier (EAGLE, L = 4) on the MNIST grid (the sweep's default grid: 24 settings + plain AR),
# measured, then predicted from plain-AR images and set side by side
$TR sweep --model natural256 --draft eagle --images $IMAGES --unit-images 100 --batch-size 50 --threads 1 \
    --no-progress --out $RUN/frontier24
$TR sweep --model natural256 --draft eagle --images $IMAGES --unit-images 100 --batch-size 50 --threads 1 \
    --no-progress --out $RUN/frontier24_predict --predict --measured $RUN/frontier24/report.json
