"""Blob store for image bytes (content-addressed by sha256): filesystem or S3-compatible, one protocol."""

from .externalize import ImageBlob, blob_url, externalize_images, internalize_images, store_blobs
from .factory import make_blob_store
from .filesystem import FilesystemBlobStore
from .s3 import S3BlobStore
from .store import BlobStore, BlobStoreError, description_blob_name, image_blob_name

__all__ = [
    "BlobStore",
    "BlobStoreError",
    "FilesystemBlobStore",
    "ImageBlob",
    "S3BlobStore",
    "blob_url",
    "description_blob_name",
    "externalize_images",
    "image_blob_name",
    "internalize_images",
    "make_blob_store",
    "store_blobs",
]
