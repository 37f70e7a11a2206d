"""Generate a tiny, self-contained model directory (no downloads).

The directory has what the frontend and the mocker need from a Hugging Face model: a
byte-level BPE ``tokenizer.json`` trained with the ``tokenizers`` library on a small built-in
corpus, ``tokenizer_config.json`` with a ChatML-style chat template and bos/eos tokens,
``config.json`` and ``generation_config.json``. There are no weights.

The output is deterministic: the same ``tokenizers`` version writes byte-identical files.

Usage::

    python -m dynamo.llm.tiny_model /tmp/tiny-model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["BOS_TOKEN", "CHAT_TEMPLATE", "EOS_TOKEN", "SPECIAL_TOKENS", "write_tiny_model"]

#: Beginning of text; also the padding token.
BOS_TOKEN = "<|endoftext|>"
#: End of an assistant turn: the chat model's eos token.
EOS_TOKEN = "<|im_end|>"
#: Special tokens get the first ids, in this order.
SPECIAL_TOKENS = [BOS_TOKEN, "<|im_start|>", EOS_TOKEN]

#: ChatML, the layout many open models use. Uses the HF template features the preprocessor
#: must support: a system-message default, ``raise_exception``, ``add_generation_prompt``.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Vocabulary size: small enough to train in well under a second, large enough that common
#: words are single tokens.
VOCAB_SIZE = 1024
#: Context length advertised in ``config.json``.
MAX_POSITION_EMBEDDINGS = 8192

_CORPUS = """\
The quick brown fox jumps over the lazy dog.
Dynamo is a distributed inference serving framework for large language models.
A worker registers its model, and the frontend routes each request to a worker.
The router prefers the worker that already holds the longest prefix of the prompt in its cache.
Hello! How are you today? I am fine, thank you. What can I do for you?
Tell me a story about a dragon who learned to count tokens.
Once upon a time there was a small model that answered every question politely.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14 2.71 42.
Punctuation: , . ; : ! ? ( ) [ ] { } " ' - _ / \\ @ # $ % ^ & * + = < > | ~ `
The KV cache stores keys and values of attention for every token of every sequence.
Streaming responses arrive as server-sent events, one chunk per generated token.
user assistant system tool message content role
Bonjour, ça va ? Très bien, merci. Grüße aus München. ¿Qué tal? Ελληνικά. 日本語のテキスト。 emoji 🙂🚀
"""


def _corpus() -> list[str]:
    lines = _CORPUS.splitlines()
    # Repeat so that merges of frequent pairs are well separated from rare ones.
    return [line for _ in range(8) for line in lines]


def _train_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_tiny_model(path: str | Path) -> Path:
    """Write the tiny model into ``path`` (created if missing) and return it.

    Existing files of the same names are overwritten.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer()
    tok.save(str(out / "tokenizer.json"), pretty=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    _write_json(
        out / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "bos_token": BOS_TOKEN,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": EOS_TOKEN,
            "model_max_length": MAX_POSITION_EMBEDDINGS,
            "pad_token": BOS_TOKEN,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    _write_json(
        out / "config.json",
        {
            "architectures": ["TinyForCausalLM"],
            "model_type": "tiny",
            "bos_token_id": ids[BOS_TOKEN],
            "eos_token_id": ids[EOS_TOKEN],
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 4,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "vocab_size": vocab_size,
            "torch_dtype": "float16",
        },
    )
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": ids[BOS_TOKEN],
            # The chat end-of-turn token and the document end token both end generation.
            "eos_token_id": [ids[EOS_TOKEN], ids[BOS_TOKEN]],
            "max_new_tokens": 256,
            "temperature": 0.7,
            "top_p": 0.9,
        },
    )
    return out


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: ``python -m dynamo.llm.tiny_model DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="directory to write (created if missing)")
    args = parser.parse_args(argv)
    out = write_tiny_model(args.path)
    print(out)


if __name__ == "__main__":
    main()
