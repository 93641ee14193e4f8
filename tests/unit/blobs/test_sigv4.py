"""SigV4 against the worked examples of the Amazon S3 API reference (Signature Version 4, header signing)."""

from memci_proxy.blobs.sigv4 import EMPTY_SHA256, sign_headers

ACCESS = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HOST = "examplebucket.s3.amazonaws.com"


def test_get_object_example() -> None:
    headers = sign_headers("GET", HOST, "/test.txt", {}, {"Range": "bytes=0-9"}, EMPTY_SHA256, ACCESS, SECRET,
                           "us-east-1", "20130524T000000Z")
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == "20130524T000000Z" and "host" not in headers


def test_put_object_example() -> None:
    import hashlib

    body = b"Welcome to Amazon S3."
    headers = sign_headers(
        "PUT", HOST, "/test$file.text", {},
        {"Date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY"},
        hashlib.sha256(body).hexdigest(), ACCESS, SECRET, "us-east-1", "20130524T000000Z",
    )
    assert headers["Authorization"].endswith(
        "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class, "
        "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
    )
