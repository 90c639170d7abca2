#!/usr/bin/env bash
# A cached virtual environment for one of the client tools benches/clients/run_clients.py runs against
# `specrt serve`: guidellm (load generator, OpenAI HTTP backend) or lm-eval (evaluation harness, its API backends).
# Neither is a dependency of specrt; each gets its own venv so their pins never meet specrt's.
#
# Usage: bash benches/clients/setup_venv.sh guidellm|lmeval [DIR]
#   DIR defaults to <specrt cache>/bench/venv-guidellm or venv-lmeval (<specrt cache>: $SPECRT_CACHE_DIR, else
#   ~/.cache/specrt), where run_clients.py looks. An existing venv with the tool importable is kept (delete it to
#   reinstall). Versions: $GUIDELLM_SPEC (default "guidellm==0.8.1"), $LMEVAL_SPEC (default
#   "lm_eval[api]==0.4.13 transformers": lm-eval 0.4.13's api extra does not bring transformers, which its
#   `tokenizer=<folder>` model argument needs; without it only the server's /tokenize backend works).
#
# Sizes (2026-12-02, from PyPI): guidellm 0.8.1 brings torch, PyPI's Linux x86_64 build with its nvidia-* wheels
# (~6 GB; it runs on a machine without a GPU; guidellm only uses transformers' tokenizers); lm-eval 0.4.13 with
# transformers, no torch: ~0.8 GB. Not for CI.
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 || ( "$1" != guidellm && "$1" != lmeval ) ]]; then
  echo "usage: bash $0 guidellm|lmeval [DIR]" >&2
  exit 2
fi
tool="$1"
cache="${SPECRT_CACHE_DIR:-$HOME/.cache/specrt}"
venv="${2:-$cache/bench/venv-$tool}"
case "$tool" in
  guidellm) spec="${GUIDELLM_SPEC:-guidellm==0.8.1}"; check="import guidellm" ;;
  lmeval) spec="${LMEVAL_SPEC:-lm_eval[api]==0.4.13 transformers}"; check="import lm_eval.models.openai_completions, transformers" ;;
esac
# Only a new or empty folder, or a venv already: `python3 -m venv` over another folder would take it over.
if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" && -n "$(ls -A "$venv" 2>/dev/null)" ]]; then
  echo "$venv exists and is not a virtual environment: refusing to make a venv over it (pick a new DIR)" >&2
  exit 2
fi
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "$tool: already installed in $venv"
else
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # shellcheck disable=SC2086  # the spec is a list of requirements on purpose
  "$venv/bin/pip" install --quiet $spec
  "$venv/bin/python" -c "$check"
fi
"$venv/bin/pip" list --format=freeze 2>/dev/null | grep -i -E '^(guidellm|lm.eval|torch|transformers|httpx|openai|requests|aiohttp|tenacity)==' || true
echo "$venv/bin/python"
