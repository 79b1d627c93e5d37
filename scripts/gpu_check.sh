#!/usr/bin/env bash
# The GPU check: CUDA correctness of every drafter, then timings on random-weight models with the real
# checkpoints' shapes (real weights are too large to ship to a borrowed GPU machine; speed depends on
# shapes, not values). Run from the repository root on a machine with CUDA and PyTorch:
#   bash scripts/gpu_check.sh MODEL_CONFIGS OUT [STAGE...]
# STAGEs (default all): tests forward bench profile.
# MODEL_CONFIGS holds one folder per model with config.json and the tokenizer files (not the weights);
# OUT receives the logs. Missing Python packages may come as wheels in .whl/.
set -uo pipefail
configs=${1:?folder of model configs}
out=${2:?output folder}
shift 2
stages=${*:-tests forward bench profile}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

if [[ " $stages " == *" tests "* ]]; then
    echo "== exactness on cuda (tests/test_device.py)"
    python3 -m pytest tests/test_device.py --device cuda -q -p no:cacheprovider -rs --durations=5 2>&1 \
        | tee "$out/device_tests.log" | tail -40
fi
[[ "$stages" == "tests" ]] && exit 0

echo "== random-weight models with the real shapes (bfloat16)"
python3 - "$configs" /tmp/models <<'PY'
import shutil, sys
from pathlib import Path
import torch, transformers
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for folder in sorted(src.iterdir()):
    config = transformers.AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dst / folder.name)
    for f in folder.iterdir():
        if f.name != "config.json":
            shutil.copy(f, dst / folder.name / f.name)
    print(folder.name, sum(p.numel() for p in model.parameters()) / 1e6, "M parameters")
    del model
PY
models=/tmp/models

if [[ " $stages " == *" forward "* ]]; then
echo "== forward cost (bfloat16, cuda)"
python3 -m specdec.bench.forward_cost $models/qwen2.5-coder-1.5b-instruct $models/smollm2-135m-instruct \
    --device cuda --dtype bfloat16 --runtimes torch,eager,transformers --sizes 1,2,4,8,16,32,64 --repeats 30 \
    2>&1 | tee "$out/forward_cost.md"
fi

if [[ " $stages " == *" bench "* ]]; then
echo "== bench (bfloat16, cuda): ours vs transformers, same random weights, same draft"
python3 -m specdec.cli bench --target $models/qwen2.5-coder-1.5b-instruct --device cuda --dtype bfloat16 \
    --drafters "ngram,draft:$models/qwen2.5-coder-0.5b-instruct" --k 4 \
    --peers "plain,assisted:$models/qwen2.5-coder-0.5b-instruct" \
    --tasks code --limit 5 --max-new-tokens 128 --roofline-mb 4096 \
    --json "$out/bench.json" 2>&1 | grep -v "^bench:" | tee "$out/bench.md"
echo "== the same, ours without CUDA graphs (eager forwards)"
python3 -m specdec.cli bench --target $models/qwen2.5-coder-1.5b-instruct --device cuda --dtype bfloat16 \
    --drafters "ngram,draft:$models/qwen2.5-coder-0.5b-instruct" --k 4 --no-cuda-graphs \
    --tasks code --limit 5 --max-new-tokens 128 --roofline-mb 0 \
    --json "$out/bench_eager.json" 2>&1 | grep -v "^bench:" | tee "$out/bench_eager.md"
fi

if [[ " $stages " == *" profile "* ]]; then
    for model in qwen2.5-coder-1.5b-instruct smollm2-135m-instruct; do
        echo "== where a decode step goes: $model"
        mkdir -p "$out/$model"
        python3 scripts/gpu_profile.py $models/$model --device cuda --dtype bfloat16 --out "$out/$model" 2>&1 \
            | head -60
    done
fi
