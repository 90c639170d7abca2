#!/bin/bash
# usage: ab_generate.sh OUTDIR ; builds: new (.venv as installed) and base (/tmp/base_pkg on PYTHONPATH)
out=$1; mkdir -p $out
P="Write a Python function that checks whether a string is a palindrome, with a docstring and tests."
for round in 1 2 3; do
  for build in base new; do
    for k in 0 4 auto; do
      if [ $build = base ]; then pp=/tmp/base_pkg; else pp=; fi
      /usr/bin/time -f "wall_s=%e maxrss_kb=%M" env PYTHONPATH=$pp /work/main/.venv/bin/specrt generate --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --dtype gguf --chat --prompt "$P" --temperature 0 --max-new-tokens 128 --num-speculative-tokens $k --stats > $out/r$round-$build-k$k.txt 2>&1
      echo "round $round $build k=$k $(grep -E 'decode tokens/s' $out/r$round-$build-k$k.txt) $(grep -E 'wall_s' $out/r$round-$build-k$k.txt) $(grep prefill_ms $out/r$round-$build-k$k.txt)"
    done
  done
done
