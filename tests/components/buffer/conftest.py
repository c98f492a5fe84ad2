"""Fixtures of the buffer tests: a store of each backend, ``file://`` and a real S3 HTTP server
(moto's server mode on 127.0.0.1, a fresh bucket per test; see tests/s3server.py)."""

import pytest

from rftflow.components.buffer.store import open_store


@pytest.fixture(params=["file", "s3"])
def open_at(request, tmp_path):
    """``open_at(sub="", **s3_options)``: a store of this backend rooted at ``<root>/<sub>``."""
    opened = []
    if request.param == "file":
        def open_at(sub: str = "", **s3_options):
            return open_store((tmp_path / "store" / sub).as_uri())
    else:
        server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")

        def open_at(sub: str = "", **s3_options):
            url = f"s3://{bucket}/campaigns/test" + (f"/{sub}" if sub else "")
            opened.append(open_store(url, endpoint_url=server.endpoint_url, **s3_options))
            return opened[-1]
    yield open_at
    for store in opened:
        store.close()


@pytest.fixture
def store(open_at):
    return open_at()
