#!/bin/bash
# alternated A/B of the gguf pair's end-to-end decoding, base build (/tmp/base_pkg) vs the checkout's
cd /work/main
P="Write a Python function that checks whether a string is a palindrome, with a docstring and tests."
for i in 1 2 3; do
  for b in base new; do
    if [ $b = base ]; then PP=/tmp/base_pkg; else PP=; fi
    for k in 0 4 auto; do
      PYTHONPATH=$PP .venv/bin/specrt generate --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --dtype gguf --chat --prompt "$P" --temperature 0 --max-new-tokens 128 --num-speculative-tokens $k --stats > /tmp/gen_${b}_k${k}_$i.txt 2>&1
      echo "$b k=$k round $i: $(grep -iE 'decode tokens/s' /tmp/gen_${b}_k${k}_$i.txt | tail -1)"
    done
  done
done
