"""Payload definitions: the data that says how a lab's tool runs (see docs/byo-code.md).

``definition`` is the model, ``validate`` checks a file and names each problem,
``params`` checks a manifest's params against a definition, ``registry`` finds
definitions (built-in files and the ``payloads`` container), ``argv`` builds a
definition's argv, ``schema`` writes the published JSON Schema. ``builtin`` is the
launcher's view of the built-in Python payloads (and their exit codes) and ``models``
their parameter models; the processes themselves are ``workers/payloads/``.

This package imports nothing at import time: a payload process reaches ``builtin``
for its exit codes without loading pydantic models or YAML.
"""
