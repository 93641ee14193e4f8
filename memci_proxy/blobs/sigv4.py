"""AWS Signature Version 4 for S3-compatible stores (header signing, payload hash sent in x-amz-content-sha256)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def amz_date(now: _dt.datetime) -> str:
    return now.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def canonical_uri(path: str) -> str:
    """S3 keys are encoded once (slashes kept)."""
    return quote(path or "/", safe="/-_.~")


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
    )


def sign_headers(
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    payload_sha256: str,
    access_key: str,
    secret_key: str,
    region: str,
    amzdate: str,
    service: str = "s3",
) -> dict[str, str]:
    """The headers to send: the given ones plus host, x-amz-date, x-amz-content-sha256 and Authorization."""
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = amzdate
    signed["x-amz-content-sha256"] = payload_sha256
    names = sorted(signed)
    canonical = "\n".join(
        [
            method.upper(),
            canonical_uri(path),
            canonical_query(query),
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            payload_sha256,
        ]
    )
    day = amzdate[:8]
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret_key).encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {k: v for k, v in signed.items() if k != "host"}
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out
