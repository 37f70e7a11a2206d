"""A worker that registers the tiny model with media settings and answers with what it
received for each image, for the multimodal tests.

Usage: ``mm_worker.py MODEL_DIR``. ``$MM_MODELS`` is a JSON object ``{served name:
{"fetcher": {...}, "decoder": {...}}}``: each model is registered on its own endpoint
``mm.<name>.generate`` with a ``MediaFetcher`` built from the ``fetcher`` setters
(``allow_direct_ip``, ``allow_direct_port``, ``allow_private_ips``, ``timeout_ms``,
``max_bytes``, ``allowed_media_domains``, ``user_agent``) and a ``MediaDecoder`` with
``enable_image(decoder)``.

Each request's answer is the text ``"<h>x<w>x<c> <dtype> <mm_hash> <sha256[:16]>"`` per
image (joined by ``;``), tokenized with the model's tokenizer, so a client sees the
decoded shape, the hash and a checksum of the pixel bytes; it also appends one JSON line
per request to ``$MM_LOG`` (the token ids, each image's ``token_range`` and the
``mm_routing_info``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys

from tokenizers import Tokenizer

from dynamo.llm import MediaDecoder, MediaFetcher, ModelInput, ModelType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker


def fetcher_of(settings: dict) -> MediaFetcher:
    f = MediaFetcher()
    for name, value in settings.items():
        getattr(f, name)(value)
    return f


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    model_dir = sys.argv[1]
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    models = json.loads(os.environ["MM_MODELS"])

    async def generate(request, context):
        images = (request.get("multi_modal_data") or {}).get("images") or []
        parts = []
        for img in images:
            h, w, c = img["shape"]
            assert len(img["data"]) == h * w * c, "pixel bytes do not match the shape"
            digest = hashlib.sha256(img["data"]).hexdigest()[:16]
            parts.append(f"{h}x{w}x{c} {img['dtype']} {img['mm_hash']} {digest}")
        record = {
            "model": request["model"],
            "token_ids": request["token_ids"],
            "ranges": [img.get("token_range") for img in images],
            "mm_routing_info": request.get("mm_routing_info"),
        }
        with open(os.environ["MM_LOG"], "a") as f:
            f.write(json.dumps(record) + "\n")
        text = ";".join(parts) or "no images"
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        yield {"token_ids": ids, "finish_reason": "stop"}

    serving = []
    for name, settings in models.items():
        endpoint = runtime.endpoint(f"mm.{name}.generate")
        decoder = MediaDecoder()
        decoder.enable_image(settings.get("decoder", {}))
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat,
            endpoint,
            model_dir,
            name,
            media_decoder=decoder,
            media_fetcher=fetcher_of(settings.get("fetcher", {})),
        )
        serving.append(endpoint.serve_endpoint(generate))
    print("READY", flush=True)
    await asyncio.gather(*serving)


if __name__ == "__main__":
    asyncio.run(main())
