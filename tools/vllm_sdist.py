"""Fetch vLLM's source distribution of a release through the package index pip is configured with.

    python tools/vllm_sdist.py 0.34.0 [DEST_DIR]     (prints the .tar.gz path; default ~/.cache/pcp_fn)

The index is ``$PCP_FN_PYPI_SIMPLE``, else ``$PIP_INDEX_URL``, else ``pip config get
global.index-url``, else pip's own default; its PEP 691 JSON page gives the file's URL and
sha256 (checked). ``pip download --no-binary :all: vllm`` cannot fetch it: pip prepares the
sdist's metadata, which builds cmake from source. ``tests/adapters/test_vllm_upstream.py`` (vLLM's own
manager tests) and ``tools/make_vllm_venv.sh`` (``requirements/common.txt``) use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("PCP_FN_VLLM_SDIST_CACHE") or Path.home() / ".cache" / "pcp_fn")


def index_url() -> str:
    """The simple index pip uses here."""
    for url in (os.environ.get("PCP_FN_PYPI_SIMPLE"), os.environ.get("PIP_INDEX_URL")):
        if url:
            return url
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
    )
    if got.returncode == 0 and got.stdout.strip():
        return got.stdout.strip()
    from pip._internal.models.index import PyPI  # pip's own default

    return PyPI.simple_url


def fetch(version: str, dest_dir: Path | None = None) -> Path:
    """``vllm-{version}.tar.gz`` in ``dest_dir`` (downloaded once, sha256 checked)."""
    dest_dir = dest_dir or cache_dir()
    name = f"vllm-{version}.tar.gz"
    dest = dest_dir / name
    if dest.is_file():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    request = urllib.request.Request(
        f"{index_url().rstrip('/')}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        page = json.load(response)
    entry = next(f for f in page["files"] if f["filename"] == name)
    with urllib.request.urlopen(entry["url"], timeout=600) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        raise ValueError(f"{name}: sha256 {digest} is not the index's {entry['hashes']['sha256']}")
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


if __name__ == "__main__":
    print(fetch(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else None))
