"""Fetch a source distribution of vLLM (or vllm-ascend) through the package index pip is configured with.

    python tools/vllm_sdist.py 0.34.0 [DEST_DIR]                         (vLLM's)
    python tools/vllm_sdist.py --project vllm-ascend 0.23.0.post1 [DEST_DIR]
    (prints the .tar.gz path; default DEST_DIR ~/.cache/pcp_fn, or $PCP_FN_VLLM_SDIST_CACHE)

The index is ``$PCP_FN_PYPI_SIMPLE``, else ``$PIP_INDEX_URL``, else ``pip config get
global.index-url``, else pip's own default; its PEP 691 JSON page gives the file's URL and
sha256 (checked). ``pip download --no-binary :all: vllm`` cannot fetch it: pip prepares the
sdist's metadata, which builds cmake from source. ``tests/adapters/test_vllm_upstream.py`` (vLLM's own
manager tests), ``tests/adapters/test_vllm_ascend_upstream.py`` (vllm-ascend's), ``tools/make_vllm_venv.sh``
(``requirements/common.txt``) and ``tools/make_vllm_ascend_venv.sh`` use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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


def sdist_name(version: str, project: str = "vllm") -> str:
    """The sdist's file name: the project's name normalised as PEP 625 has it
    (``vllm_ascend-0.23.0.post1.tar.gz``, ``vllm-0.34.0.tar.gz``)."""
    return f"{re.sub(r'[-_.]+', '_', project).lower()}-{version}.tar.gz"


def fetch(version: str, dest_dir: Path | None = None, project: str = "vllm") -> Path:
    """``{project}-{version}.tar.gz`` in ``dest_dir`` (downloaded once, sha256 checked)."""
    dest_dir = dest_dir or cache_dir()
    name = sdist_name(version, project)
    dest = dest_dir / name
    if dest.is_file():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    page_name = re.sub(r"[-_.]+", "-", project).lower()  # PEP 503's normalised project name
    request = urllib.request.Request(
        f"{index_url().rstrip('/')}/{page_name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        page = json.load(response)
    # older uploads keep the project's own spelling (vllm-ascend-0.9.0.tar.gz)
    wanted = {name, f"{project}-{version}.tar.gz"}
    entry = next((f for f in page["files"] if f["filename"] in wanted), None)
    if entry is None:
        raise FileNotFoundError(f"{page_name} {version}: no sdist on the index ({sorted(wanted)})")
    with urllib.request.urlopen(entry["url"], timeout=600) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        raise ValueError(f"{name}: sha256 {digest} is not the index's {entry['hashes']['sha256']}")
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def main(argv: list[str]) -> None:
    project = "vllm"
    if argv[:1] == ["--project"]:
        project, argv = argv[1], argv[2:]
    if not 1 <= len(argv) <= 2:
        raise SystemExit("usage: vllm_sdist.py [--project NAME] VERSION [DEST_DIR]")
    print(fetch(argv[0], Path(argv[1]) if len(argv) > 1 else None, project))


if __name__ == "__main__":
    main(sys.argv[1:])
