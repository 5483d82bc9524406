"""Pin a worker image by the digest the registry reports for its tag (bicep/hooks/imagedigest.sh).

``python3 bicep/tools/image_digest.py REGISTRY_ENDPOINT/REPOSITORY`` reads, on stdin, what
``az acr repository show --name <registry> --image <repository>:<tag> -o json`` printed, and prints
``REGISTRY_ENDPOINT/REPOSITORY@sha256:<digest>``. The az CLI answers ``--image name:tag`` with the ``tag``
object of the registry's ``GET /acr/v1/{name}/_tags/{reference}`` (Tag - Get Properties: ``name``,
``digest``, ``createdTime``, ``lastUpdateTime``, ``signed``, ``changeableAttributes``); the whole response
(``registry``, ``imageName``, ``tag``) and the bare digest (``--query digest -o tsv``) are read too.

Exit 0 with the pinned reference; exit 3 when the answer names no usable digest (an image not pushed yet
answers with an error instead, which the hook reports), with the reason on stderr. An all-zero digest
is refused: it is the built-in definitions' placeholder, never a real image.
"""

from __future__ import annotations

import json
import re
import sys

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
ZERO = "sha256:" + "0" * 64


class NoDigest(ValueError):
    """The registry's answer names no usable digest."""


def digest_of(text: str) -> str:
    """The image digest in an ``az acr repository show --image`` answer (JSON, or the bare digest)."""
    text = text.strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = text
    if isinstance(doc, dict):
        doc = doc.get("tag", doc)
        doc = doc.get("digest", "") if isinstance(doc, dict) else ""
    if not isinstance(doc, str) or not DIGEST.match(doc):
        raise NoDigest(f"no sha256 digest in the registry's answer: {text[:200]!r}")
    if doc == ZERO:
        raise NoDigest("the registry reported the all-zero digest, which no image has")
    return doc


def pinned(image: str, text: str) -> str:
    """``image`` (registry/repository, a tag on it dropped) pinned by the digest in ``text``."""
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:
        repository = repository[: len(repository) - len(last)] + last.split(":", 1)[0]
    return f"{repository}@{digest_of(text)}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: image_digest.py REGISTRY_ENDPOINT/REPOSITORY < az-acr-repository-show.json", file=sys.stderr)
        return 2
    try:
        print(pinned(argv[0], sys.stdin.read()))
    except NoDigest as exc:
        print(f"image_digest: {argv[0]}: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
