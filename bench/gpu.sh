#!/usr/bin/env bash
# The GPU profile's bench: checks that CUDA is usable, prints the GPU and the
# torch and NeMo versions, then runs bench/stt_streams.py on --device cuda for
# N = 1, 10, 50, 100 concurrent simulated callers through Parakeet's batched
# path (first-final latency p50/p95/max, real-time factor, batch sizes,
# failures: its docstring defines each column). The tables go to stdout and
# to $OUT/gpu-<UTC time>.md (OUT defaults to bench/out). Optionally (--coqui)
# bench/coqui_tts.py on --device cuda as well.
#
#   bash bench/gpu.sh                              # N = 1,10,50,100, 60 s each
#   bash bench/gpu.sh --streams 1,10 --seconds 20
#   bash bench/gpu.sh --coqui                      # + Coqui TTS (COQUI_MODEL, COQUI_VOICE)
#   bash bench/gpu.sh -- --max-batch 32            # after --: passed to stt_streams.py
#   bash bench/gpu.sh --smoke                      # no GPU: the tiny model on the CPU
#
# Without a usable CUDA GPU (no nvidia-smi, no GPU listed, or torch without
# CUDA) it runs nothing and exits 2, saying which. --smoke skips that check and
# runs the tests' tiny model on the CPU (1 and 2 streams, 5 s): it checks this
# script's own path on any machine and measures nothing about a GPU.
#
# Environment:
#   PARAKEET_MODEL  a .nemo file, a Hugging Face repo id in the local cache, or
#                   a NeMo name in NeMo's cache (default nvidia/parakeet-tdt-0.6b-v2)
#   PYTHON          the interpreter (default .venv/bin/python)
#   OUT             where the tables are written (default bench/out)
#   COQUI_MODEL     --coqui: a Coqui model folder (default: the tests' tiny models)
#   COQUI_VOICE     --coqui: its --tts-voice (XTTS: a speaker wav)
#   HF_HUB_OFFLINE  1 unless set: nothing is downloaded. With HF_HUB_OFFLINE=0 and a
#                   repo id, the model is fetched into the Hugging Face cache first.
#
# The model, fetched beforehand (the service itself never downloads it):
#   .venv/bin/hf download nvidia/parakeet-tdt-0.6b-v2     # into ~/.cache/huggingface
# on this machine, or on one with network access and ~/.cache/huggingface
# copied over (HF_HOME says where it is); or give the file itself:
#   PARAKEET_MODEL=/models/parakeet-tdt-0.6b-v2.nemo bash bench/gpu.sh
#
# torch with CUDA: `make install-parakeet` installs torch's CPU build; a CUDA
# build instead (docs/stt.md; the host then needs only the NVIDIA driver):
#   make install-parakeet TORCH_INDEX=https://download.pytorch.org/whl/cu128
# where the CPU build is already installed, remove it first:
#   .venv/bin/pip uninstall -y torch && rm -f .venv/.installed-parakeet
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-.venv/bin/python}
MODEL=${PARAKEET_MODEL:-nvidia/parakeet-tdt-0.6b-v2}
OUT_DIR=${OUT:-bench/out}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}

streams=1,10,50,100
seconds=60
coqui=0
smoke=0
extra=()

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

# No GPU (or no CUDA torch, or no NeMo): nothing runs, exit 2.
no_gpu() {
    echo "bench/gpu.sh: $*" >&2
    if ((!smoke)); then
        echo "bench/gpu.sh: no usable CUDA GPU, nothing was run (bash bench/gpu.sh --help)" >&2
    fi
    exit 2
}

while (($#)); do
    case $1 in
        --coqui) coqui=1 ;;
        --smoke) smoke=1 ;;
        --streams)
            streams=${2:?--streams needs a list, e.g. 1,10,50,100}
            shift
            ;;
        --seconds)
            seconds=${2:?--seconds needs a number}
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        --)
            shift
            extra=("$@")
            break
            ;;
        *)
            echo "bench/gpu.sh: unknown option $1 (bash bench/gpu.sh --help)" >&2
            exit 1
            ;;
    esac
    shift
done

if ((smoke)); then
    device=cpu
    streams=1,2
    seconds=5
else
    device=cuda
    command -v nvidia-smi >/dev/null 2>&1 ||
        no_gpu "nvidia-smi is not on PATH: no NVIDIA driver on this machine"
    nvidia-smi -L >/dev/null 2>&1 ||
        no_gpu "nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -n 1)"
fi
[[ -x $PY ]] || no_gpu "no $PY: run make install-parakeet (and see the CUDA torch note in --help)"
"$PY" -c 'import torch, nemo' >/dev/null 2>&1 ||
    no_gpu "torch or NeMo is missing from $PY's environment: make install-parakeet"
if ((!smoke)); then
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
        no_gpu "torch sees no CUDA GPU (torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')): a CPU build? see --help"
fi

if [[ $HF_HUB_OFFLINE == 0 && ! -e $MODEL && $MODEL == */* && $MODEL != *.nemo ]]; then
    echo "HF_HUB_OFFLINE=0: fetching $MODEL into the Hugging Face cache" >&2
    "$PY" -c 'import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1]))' "$MODEL" >&2
fi

mkdir -p "$OUT_DIR"
report="$OUT_DIR/gpu-$(date -u +%Y%m%dT%H%M%SZ).md"

run_all() {
    echo "# bench/gpu.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
    echo
    if ((smoke)); then
        echo "--smoke: no CUDA check, the tiny model on the CPU; no GPU figure"
    else
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
            sed 's/^/GPU: /'
    fi
    "$PY" -c '
import torch, nemo
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), NeMo {nemo.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"cuda:0 {p.name}, {p.total_memory / 2**30:.1f} GiB, bf16 {torch.cuda.is_bf16_supported()}")
'
    echo
    echo "## STT: Parakeet, $streams streams, $seconds s each"
    echo
    local model_args=(--model "$MODEL")
    if ((smoke)); then
        model_args=(--tiny)
    fi
    "$PY" bench/stt_streams.py "${model_args[@]}" --device "$device" --streams "$streams" \
        --seconds "$seconds" "${extra[@]+"${extra[@]}"}"
    if ((coqui)); then
        echo
        echo "## TTS: Coqui"
        echo
        local coqui_args=(--device "$device")
        if [[ -n ${COQUI_MODEL:-} ]]; then
            coqui_args+=(--model "$COQUI_MODEL")
        fi
        if [[ -n ${COQUI_VOICE:-} ]]; then
            coqui_args+=(--voice "$COQUI_VOICE")
        fi
        "$PY" bench/coqui_tts.py "${coqui_args[@]}"
    fi
}

run_all | tee "$report"
echo "written to $report" >&2
