"""Hash a prompt into KV-cache blocks, the way the KV router sees it.

    python examples/hash_prompt.py [--block-size 16] [--lora NAME] [TEXT ...]

Text is turned into token ids with a toy byte-level "tokenizer" (one token per UTF-8 byte),
cut into complete blocks, and each block's local hash (``tokens_hash``) is printed. Two prompts that share a prefix share their leading block hashes: that is
what lets the router send a request to the worker that already caches its prefix.
"""

from __future__ import annotations

import argparse

from dynamo.llm import compute_block_hash_for_seq

DEFAULT_PROMPT = (
    "You are a helpful assistant. Answer the user's questions concisely and cite sources. "
    "User: what is KV-cache-aware routing?"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="*", help="prompt text (default: a sample prompt)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--lora", default=None, help="LoRA adapter name (changes every hash)")
    args = parser.parse_args()

    prompt = " ".join(args.text) or DEFAULT_PROMPT
    tokens = list(prompt.encode("utf-8"))
    hashes = compute_block_hash_for_seq(tokens, args.block_size, lora_name=args.lora)
    print(f"prompt: {prompt!r}")
    print(
        f"{len(tokens)} tokens, block size {args.block_size}: {len(hashes)} complete blocks "
        f"({len(tokens) % args.block_size} trailing tokens are not hashed)"
    )
    for i, h in enumerate(hashes):
        block = bytes(tokens[i * args.block_size : (i + 1) * args.block_size])
        print(f"  block {i:3d}  tokens_hash={h:#018x}  {block.decode('utf-8', 'replace')!r}")


if __name__ == "__main__":
    main()
