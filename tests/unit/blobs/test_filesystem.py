import pytest

from memci_proxy.blobs import FilesystemBlobStore, make_blob_store
from memci_proxy.blobs.s3 import S3BlobStore

KEY = "ab" * 32


async def test_put_get_exists_and_immutability(tmp_path) -> None:
    store = FilesystemBlobStore(tmp_path / "blobs")
    name = f"images/sha256/ab/{KEY}"
    assert await store.get(name) is None and not await store.exists(name)
    assert await store.put(name, b"one") is True
    assert await store.put(name, b"two") is False  # objects never change once written
    assert await store.get(name) == b"one" and await store.exists(name)
    assert not list((tmp_path / "blobs" / "images" / "sha256" / "ab").glob(".tmp-*"))


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "a//b", "."])
async def test_names_cannot_escape_the_root(tmp_path, name) -> None:
    with pytest.raises(ValueError):
        await FilesystemBlobStore(tmp_path).put(name, b"x")


class _Settings:
    def __init__(self, **kw):
        self.home = str(kw.pop("home", "~/.memci"))
        self.__dict__.update(kw)


def test_factory_defaults_to_the_home_directory(tmp_path) -> None:
    store = make_blob_store(_Settings(home=tmp_path))
    assert isinstance(store, FilesystemBlobStore) and store.root == tmp_path / "blobs"
    assert make_blob_store(_Settings(home=tmp_path, blob_store=str(tmp_path / "x"))).root == tmp_path / "x"


def test_factory_builds_an_s3_store() -> None:
    store = make_blob_store(_Settings(blob_store="s3://bucket/memci/blobs", blob_s3_endpoint="http://127.0.0.1:9000",
                                      blob_s3_access_key="ak", blob_s3_secret_key="sk"))
    assert isinstance(store, S3BlobStore)
    assert (store.host, store.bucket, store.prefix) == ("127.0.0.1:9000", "bucket", "memci/blobs/")
    assert store._path("images/x") == "/bucket/memci/blobs/images/x"
