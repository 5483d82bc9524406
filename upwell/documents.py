"""Documents that people upload and operators register, read safely: manifests, pipeline rules and
payload definitions.

``parse_document`` turns YAML or JSON bytes into a dict with the safe loader only: archives are refused by
content, the text is UTF-8 or UTF-16 with a BOM, and size, aliases and the expanded value count are limited
(a billion-laughs guard). ``archive_kind`` names the archive format a file starts with; ingest refuses data
blobs by it too. Every refusal is an InputRejected naming the field and the limit. This module sits below
both ingest and the payload registry, which read documents alike; it imports neither.
"""

from __future__ import annotations

import codecs
import json
from typing import Any

import yaml

from upwell.errors import InputRejected

MAX_ALIASES = 100
MAX_DOCUMENT_BYTES = 1 << 20  # a manifest or rule; data goes in data blobs, not in the document
MAX_NODES = 100_000  # values in the document once aliases are expanded (a billion-laughs guard)
# an archive's first bytes; a document or data blob that starts so is refused (upload the files themselves)
ARCHIVE_MAGIC = ((b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"),
                 (b"\xfd7zXZ\x00", "xz"), (b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07", "rar"),
                 (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x04\x22\x4d\x18", "lz4"))


def archive_kind(head: bytes) -> str:
    """The archive or compression format ``head`` (the first bytes of a file) starts with, or ''."""
    for magic, kind in ARCHIVE_MAGIC:
        if head.startswith(magic):
            return kind
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return ""


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases, so a billion-laughs document is refused early."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
            if self._aliases > MAX_ALIASES:
                raise InputRejected(f"YAML uses more than {MAX_ALIASES} aliases", field="yaml",
                                    limit=f"max_aliases={MAX_ALIASES}")
        return super().compose_node(parent, index)


def check_size(size: int, source: str) -> None:
    """Refuse a document over MAX_DOCUMENT_BYTES (before it is read, where its size is known)."""
    if size > MAX_DOCUMENT_BYTES:
        raise InputRejected(f"{source} is {size} bytes; a manifest or rule may be at most "
                            f"{MAX_DOCUMENT_BYTES} (put data in data blobs)", field="size",
                            limit=f"max_document_bytes={MAX_DOCUMENT_BYTES}", source=source)


def _text(data: bytes, source: str) -> str:
    """UTF-8 (with or without a BOM) or UTF-16 with a BOM, as editors on any platform save it."""
    check_size(len(data), source)
    kind = archive_kind(data[:512])
    if kind:
        raise InputRejected(f"{source} is a {kind} archive; archives are not accepted: upload the files "
                            "themselves", field="document", source=source)
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    try:
        return data.decode("utf-16" if utf16 else "utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputRejected(f"{source} is not UTF-8 text (byte {exc.start})", field="encoding", source=source) from None


def _check_size(doc: Any, source: str) -> None:
    """Refuse documents whose aliases expand past MAX_NODES values, or refer to themselves."""
    budget, stack, path = MAX_NODES, [doc], set()
    while stack:
        node = stack.pop()
        if node is _LEAVE:
            path.discard(stack.pop())
            continue
        budget -= 1
        if budget < 0:
            raise InputRejected(f"{source}: the document expands to more than {MAX_NODES} values "
                                "(YAML aliases?)", field="yaml", limit=f"max_nodes={MAX_NODES}", source=source)
        if isinstance(node, dict | list):
            if id(node) in path:
                raise InputRejected(f"{source}: the document refers to itself (a recursive YAML alias)",
                                    field="yaml", source=source)
            path.add(id(node))
            stack += [id(node), _LEAVE]
            stack += list(node.values()) + list(node) if isinstance(node, dict) else list(node)


_LEAVE = object()


def parse_document(data: bytes, source: str) -> dict:
    """Parse YAML or JSON bytes into a dict; safe loader only."""
    text = _text(data, source)
    if not text.strip():
        raise InputRejected(f"{source} is empty", field="document", source=source)
    try:
        # The safe loader only (a SafeLoader subclass): no python/* tags, aliases counted.
        doc = json.loads(text) if source.endswith(".json") else yaml.load(text, Loader=_SafeLoader)
    except RecursionError:
        raise InputRejected(f"{source}: the document is nested too deeply", field="document",
                            source=source) from None
    except json.JSONDecodeError as exc:
        raise InputRejected(f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
                            field="document", row=exc.lineno, source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        row = mark.line + 1 if mark else None
        raise InputRejected(f"{source}: invalid YAML{f' at line {row}' if row else ''}: "
                            f"{getattr(exc, 'problem', None) or exc}", field="document", row=row,
                            source=source) from None
    except ValueError as exc:  # e.g. an integer longer than Python converts (4300 digits)
        raise InputRejected(f"{source}: a value cannot be read: {str(exc)[:200]}", field="document",
                            source=source) from None
    if not isinstance(doc, dict):
        raise InputRejected(f"{source} must be a mapping at the top level, not {type(doc).__name__}",
                            field="document", source=source)
    _check_size(doc, source)
    return doc
