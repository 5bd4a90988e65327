#!/usr/bin/env bash
# How held-out masked-LM accuracy moves with REALM's retrieval steps, on one CUDA GPU (docs/log, "Retrieval
# steps on a GPU"): one null-document warm-up of the MiniLM reader (2,007 steps: the README main command's without
# ICT), then separate runs of N retrieval steps from it in parallel (batch 8, 4 candidates, the query tower alone
# training: the cpu preset), each scored on every salient span of every held-out sentence.
#
#   here:    cp -r runs/<a README run>/corpus .gpu/corpus     # the vital-articles corpus with its salient spans
#            (MiniLM in fp16 into .gpu/site: the heredoc in scripts/gpu_run.sh's stage)
#   there:   bash scripts/gpu_retrieval_steps.sh                # STEPS="600 1500 4000"; FROZEN=1: towers held fixed
# Results: $OUT (or runs/gpu_steps) gets each run's metrics.jsonl and its pretrain_eval table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD/.gpu/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
C=.gpu/corpus R=${RUN:-runs/gpu_steps/work} O=${OUT:-runs/gpu_steps}
mkdir -p $R $O
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
t0=$(date +%s)
realm() { python3 -m realm.cli "$@"; }
common="--corpus $C --batch-size 8 --doc-tower fixed --retriever-frozen-steps 0 --masking salient --salient-spans any \
    --checkpoint-every 100000 --quiet"
frozen=${FROZEN:+--retriever-lr 0}
[ -f $R/null/reader/config.json ] || realm train pretrain $common --out $R/null --retriever minilm --reader minilm \
    --steps ${NULL_STEPS:-2007} --num-candidates 1 --null-warmup-steps 0 > $R/null.log 2>&1
echo "null warm-up done: $(( $(date +%s) - t0 )) s"
for n in ${STEPS:-600 1500 4000}; do
    ( realm train pretrain $common $frozen --out $R/ret$n --retriever minilm --reader $R/null/reader --steps $n \
        --num-candidates 4 --null-warmup-steps 0 > $R/ret$n.log 2>&1
      cp $R/ret$n/metrics.jsonl $O/metrics_ret$n.jsonl
      python3 experiments/pretrain_eval.py --corpus $C --run ret$n=$R/ret$n --every-span --limit 1728 > $O/eval_ret$n.md 2>&1
      echo "ret$n trained and scored: $(( $(date +%s) - t0 )) s"; tail -n 1 $O/eval_ret$n.md ) &
done
wait
for f in $R/*.log; do echo "== $f"; tail -n 5 $f; done > $O/logs.txt
