"""Cost of a decoding constraint's logit mask per row and generated token, on a real vocabulary.

    python benchmarks/constraint_masks.py                 # SmolLM2-135M-Instruct's 49k-token vocabulary
    python benchmarks/constraint_masks.py --model DIR     # any model directory, .gguf file or packaged name

A search-qa prompt and a copied ``<search>…</search>`` call are replayed token by token through
``ConstraintMask`` (``tag_spans``) for a batch of rows; the table gives the time per row per token and how
many tokens each step allowed, and ``benchmarks/results/constraint_masks.json`` keeps it with the
commit, command and machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results" / "constraint_masks.json"
PROMPT = ("<|im_start|>user\nAnswer the question. Use <search>query</search> to search and "
          "<answer>answer</answer> to answer.\nQuestion: In which city was the founder of Zorvex Labs "
          "born?<|im_end|>\n<|im_start|>assistant\n")
CALL = "<search>founder of Zorvex Labs</search>"


def measure(model: str, rows: int, repeats: int) -> dict:
    from transformers import AutoTokenizer

    from agentgym.backends.constrained import ConstraintMask, token_pieces
    from agentgym.backends.gguf import model_dir
    from agentgym.rollout.constraints import make_constraint

    tokenizer = AutoTokenizer.from_pretrained(model_dir(model), local_files_only=True)
    started = time.perf_counter()
    pieces = token_pieces(tokenizer, len(tokenizer))
    pieces_s = time.perf_counter() - started
    prompt = tokenizer(PROMPT)["input_ids"]
    call = tokenizer(CALL, add_special_tokens=False)["input_ids"]
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    best, allowed = float("inf"), []
    for _ in range(repeats):
        mask = ConstraintMask(make_constraint("tag_spans"), tokenizer, [prompt] * rows, pieces, stop,
                              len(tokenizer))
        allowed = []
        started = time.perf_counter()
        for token in call:
            step = mask.step(list(range(rows)))
            allowed.append(int((step[0] == 0).sum()))
            for row in range(rows):
                mask.advance(row, token)
        best = min(best, time.perf_counter() - started)
    return {"model": model, "vocab": len(tokenizer), "pieces": len(pieces), "pieces_s": round(pieces_s, 3),
            "rows": rows, "tokens": len(call), "ms_per_row_token": round(best / len(call) / rows * 1000, 3),
            "allowed_per_step": allowed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="model directory, .gguf file or packaged name")
    parser.add_argument("--rows", type=int, default=8, help="rows in the batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed replays (the best is kept)")
    args = parser.parse_args(argv)
    row = measure(args.model, args.rows, args.repeats)
    print("| model | vocabulary | rows | ms per row per token | allowed per step |")
    print("|---|---:|---:|---:|---|")
    print(f"| {row['model']} | {row['vocab']} | {row['rows']} | {row['ms_per_row_token']} | "
          f"{row['allowed_per_step']} |")
    RESULTS.parent.mkdir(exist_ok=True)
    record = provenance(sys.argv[1:] if argv is None else argv, script=__file__)
    RESULTS.write_text(json.dumps({"rows": [row], "provenance": record}, indent=2) + "\n")


if __name__ == "__main__":
    main()
