"""A blob upload with no Azure SDK and no upwell code: raw HTTP with a SharedKey signature,
as any third-party client (the Azure CLI, Storage Explorer) would send it to the emulator."""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
import urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def put_blob(blob_port: int, container: str, name: str, data: bytes) -> int:
    path = f"/{ACCOUNT}/{container}/{urllib.parse.quote(name)}"
    headers = {"x-ms-blob-type": "BlockBlob", "x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    canon_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    to_sign = "\n".join(["PUT", "", "", str(len(data)), "", "application/octet-stream", "", "", "", "", "", ""])
    to_sign += "\n" + canon_headers + f"/{ACCOUNT}{path}"
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    req = urllib.request.Request(f"http://127.0.0.1:{blob_port}{path}", data=data, method="PUT", headers={
        **headers, "Content-Type": "application/octet-stream", "Authorization": f"SharedKey {ACCOUNT}:{sig}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status
